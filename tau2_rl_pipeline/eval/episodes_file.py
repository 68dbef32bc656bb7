"""The evaluator's resumable episode log: one JSON line per finished episode, safe against being killed.

    <output>.episodes.jsonl
    {"header": {"format": 1, "benchmark": {...}, "settings": {...}}}   first line: what produced the episodes
    {"domain": "airline", "task_id": "7", "sample": 0, ...} one line per finished episode, in finishing order

Each line is appended whole, then flushed and fsynced, by the one writer (the event loop), so a SIGKILL can
at worst leave a torn last line: on resume it is cut off (the file is truncated to the last complete line)
and that episode runs again. The header's `benchmark` (tau2 version, task-set hash) must match the resuming
run's, or it is refused (tau2_version.check_same_benchmark). A finished episode is never written twice; an
aborted one (infrastructure failure) is retried by a resumed run, and the retry's line supersedes it (`pick_records`). `compact` then
rewrites the file with one line per episode.

Secrets never reach the file: every line passes through `redact` (values of secret-looking environment
variables, e.g. OPENAI_API_KEY, are replaced) before it is written; `atomic_write_text` does the same for
the summary and results files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from tau2_rl_pipeline.benchmark.tau2_version import BenchmarkMismatch, check_same_benchmark
from tau2_rl_pipeline.files import atomic_write_bytes

FORMAT = 1
HEADER_KEY = "header"
# The rule of scripts/common.sh: the word ends the name (OPENAI_API_KEY, HF_TOKEN; not MAX_TOKENS_PER_GPU).
_SECRET_NAME = re.compile(r"(^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
_MIN_SECRET_LEN = 4  # as scripts/common.sh: shorter values ("1", "on") would redact ordinary text
REDACTED = "***"

Key = tuple[str, str, int]


class EpisodesFileError(ValueError):
    """The episode file cannot be resumed (another run's settings, a corrupt line); the message says what to do."""


def episode_key(record: Mapping[str, Any]) -> Key:
    return (record["domain"], record["task_id"], record["sample"])


# ---------------------------------------------------------------------------------------------------
# Secrets

def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names look like secrets (API keys, tokens, passwords)."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)  # longest first: a key containing another is fully replaced


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret replaced, also in its JSON-escaped form (as it appears inside a JSON string)."""
    for secret in secrets:
        for form in {secret, json.dumps(secret)[1:-1]}:
            text = text.replace(form, REDACTED)
    return text


# ---------------------------------------------------------------------------------------------------
# Pure parsing

def parse_lines(data: bytes) -> tuple[dict | None, list[dict], int]:
    """(header, records, good_length) of an episode file's bytes.

    good_length is where the complete lines end: a last line with no newline, or one that is not JSON, is
    torn (the writer was killed mid-line) and lies past it. A bad line before the last is corruption, not a
    kill, and raises, so that no finished episode is silently dropped.
    """
    header: dict | None = None
    records: list[dict] = []
    good = 0
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: bytes after the last newline (b"" when none)
    for i, raw in enumerate(complete):
        obj = _json_object(raw)
        if obj is None:
            if i == len(complete) - 1 and not tail:
                break  # a bad last line that happens to end in a newline byte: cut it off as well
            raise EpisodesFileError(f"line {i + 1} of the episode file is corrupt (not a JSON object) and is not "
                                    "the last line, so it is not a torn write: inspect or remove the file")
        if i == 0 and HEADER_KEY in obj:
            header = obj[HEADER_KEY]
        elif HEADER_KEY in obj:
            raise EpisodesFileError(f"line {i + 1} of the episode file is a second header: remove the file")
        else:
            records.append(obj)
        good += len(raw) + 1
    return header, records, good


def _json_object(raw: bytes) -> dict | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def pick_records(records: Iterable[dict]) -> dict[Key, dict]:
    """One record per (domain, task_id, sample): the last finished one, else the last aborted one."""
    picked: dict[Key, dict] = {}
    for rec in records:
        key = episode_key(rec)
        old = picked.get(key)
        if old is None or rec["status"] != "aborted" or old["status"] == "aborted":
            picked[key] = rec
    return picked


def settings_mismatch(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Names of the settings that differ between the file's header and this run."""
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))


# ---------------------------------------------------------------------------------------------------
# Files

def atomic_write_text(path: Path, text: str, secrets: Iterable[str] = ()) -> None:
    """Write beside `path`, fsync, rename over it: a reader never sees half a file, a crash leaves the old one."""
    atomic_write_bytes(path, redact(text, secrets).encode("utf-8"))


class EpisodesFile:
    """The episode log of one evaluation output; see the module docstring for the format and guarantees."""

    def __init__(self, path: Path, settings: Mapping[str, Any], *, benchmark: Mapping[str, str],
                 secrets: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self.settings = dict(settings)
        self.benchmark = dict(benchmark)  # tau2_version.benchmark_id: tau2 version and task-set hash
        self.secrets = list(secrets)
        self._f: BinaryIO | None = None
        self._lines = 0  # episode lines in the file (superseded ones included)

    def load(self) -> dict[Key, dict]:
        """The episodes already in the file (see pick_records); checks the header against this run's settings.

        Read-only: a torn tail is cut off by `open_for_append`, not here.
        """
        if not self.path.exists():
            return {}
        header, records, _ = parse_lines(self.path.read_bytes())
        if header is None:
            if records:
                raise EpisodesFileError(f"{self.path} has no header line: it was not written by this evaluator")
            return {}
        if header.get("format") != FORMAT:
            raise EpisodesFileError(f"{self.path} has format {header.get('format')!r}, expected {FORMAT}")
        try:
            stored = header.get("settings", {})
            check_same_benchmark(header.get("benchmark"), self.benchmark, str(self.path), held=(
                f"episodes of {stored.get('model', 'a model')} on split {stored.get('task_split', '?')}"))
        except BenchmarkMismatch as e:
            raise EpisodesFileError(f"{e}, or --no-resume to discard it") from None
        differ = settings_mismatch(header.get("settings", {}), self.settings)
        if differ:
            raise EpisodesFileError(
                f"{self.path} holds episodes run with other settings ({', '.join(differ)}); use another "
                "--output, or --no-resume to discard them")
        self._lines = len(records)
        return pick_records(records)

    def open_for_append(self, *, discard: bool = False) -> None:
        """Open for appending: truncate a torn tail, or start a new file (with its header) if there is none."""
        if discard or not self.path.exists():
            self._start_new()
            return
        _, _, good = parse_lines(self.path.read_bytes())
        self._f = open(self.path, "r+b")  # noqa: SIM115 -- held open for appends until close()
        if good == 0:  # empty, or only a torn header
            self._f.close()
            self._start_new()
            return
        self._f.truncate(good)
        self._f.seek(good)
        os.fsync(self._f.fileno())

    def _start_new(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "wb")  # noqa: SIM115 -- held open for appends until close()
        self._lines = 0
        self._write({HEADER_KEY: self._header()})

    def _header(self) -> dict[str, Any]:
        return {"format": FORMAT, "benchmark": self.benchmark, "settings": self.settings}

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one finished episode as one line, durably, before anything else happens."""
        self._write(record)
        self._lines += 1

    def _write(self, obj: Mapping[str, Any]) -> None:
        if self._f is None:
            raise RuntimeError("episode file is not open")
        line = redact(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), self.secrets) + "\n"
        self._f.write(line.encode("utf-8"))  # one write call per line: never interleaved with another
        self._f.flush()
        os.fsync(self._f.fileno())

    def compact(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Rewrite the file atomically with exactly `records` (one per key) after superseded ones piled up."""
        self.close()
        lines = [json.dumps({HEADER_KEY: self._header()}, ensure_ascii=False)]
        lines += [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records]
        atomic_write_text(self.path, "\n".join(lines) + "\n", self.secrets)

    @property
    def lines(self) -> int:
        return self._lines

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def check_graded_by_installed_tau2(path: Path) -> None:
    """EpisodesFileError (one line) unless the file's episodes were graded by the installed tau2's version."""
    from tau2_rl_pipeline.benchmark.tau2_version import VERSION

    header, _, _ = parse_lines(Path(path).read_bytes())
    stored = ((header or {}).get("benchmark") or {}).get("tau2_version")
    if stored != VERSION:
        raise EpisodesFileError(f"{path} holds episodes graded by tau2 {stored or 'unknown'}, this run uses tau2 "
                                f"{VERSION}: their rewards are another benchmark's; sample again with this tau2")


def read_episodes(path: Path) -> dict[Key, dict]:
    """The episodes of a finished or interrupted run (for reports and tests), one per key."""
    _, records, _ = parse_lines(Path(path).read_bytes())
    return pick_records(records)
