"""What made each of the local pipeline's outputs, so a rerun never passes off one run's numbers as another's.

`<out>/stages.json` holds, per stage (a checkpoint, an evaluation), the settings that made its output and, once it
finished, its result. Settings are cumulative: a stage's include those of every stage before it, so a change
reaches exactly the stages it affects. Before a stage runs, `StageBook.plan` compares:

- same settings and a result: skipped, and it says so (a resume);
- same settings, no result yet: run again, resuming what its own files allow (the evaluator's episode file,
  GRPO's last finished step);
- other settings: its outputs are removed and it is redone, naming the settings that changed;
- an output with no record (written by an older version, or by hand): refused with one line;
- a book written on another tau2 version or task set (`tau2_version.benchmark_id`): refused with one line, before
  anything runs, so an interrupted run is never resumed, nor its numbers reported, under the other benchmark.

Pure bookkeeping plus file removal inside the output directory; the pipeline decides what a stage's outputs are.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tau2_rl_pipeline.benchmark.tau2_version import check_same_benchmark
from tau2_rl_pipeline.files import atomic_write_bytes

SKIP, RUN = "skip", "run"


class StaleOutputError(RuntimeError):
    """An output whose settings are unknown: the pipeline cannot tell whether it may be reused."""


@dataclass(frozen=True)
class Plan:
    action: str  # SKIP or RUN
    message: str  # one line saying what happens and why
    result: Any = None  # the recorded result, when skipped


def changed_settings(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 4) -> str:
    """`name: old -> new` for each differing setting (at most `limit`, then a count)."""
    names = sorted(set(old) | set(new))
    diffs = [f"{n}: {old.get(n, '(unset)')} -> {new.get(n, '(unset)')}" for n in names if old.get(n) != new.get(n)]
    shown = ", ".join(diffs[:limit])
    return shown + (f" and {len(diffs) - limit} more" if len(diffs) > limit else "")


class StageBook:
    def __init__(self, out: Path, benchmark: Mapping[str, str]):
        """The book of `out`, for a run on `benchmark` (tau2 version and task-set hash, recorded with each stage);
        raises tau2_version.BenchmarkMismatch when a stage was recorded on another one."""
        self.out = out
        self.path = out / "stages.json"
        self.benchmark = dict(benchmark)
        self.records: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}
        for record in self.records.values():
            check_same_benchmark(record.get("benchmark"), self.benchmark, str(out), held=self.held(),
                                 remedy="pass --out DIR to keep it and run this one beside it")

    def held(self) -> str:
        """What the book's run was, in words: its domain and splits, from the recorded settings."""
        settings: dict[str, Any] = {}
        for record in self.records.values():
            settings.update(record.get("settings") or {})
        if "domain" not in settings:
            return "another run"
        splits = [f"{word} {settings[key]}" for key, word in (("train_split", "trained on"),
                                                                ("eval_split", "evaluated on")) if key in settings]
        return f"the demo run on {settings['domain']}" + (f" ({', '.join(splits)})" if splits else "")

    def plan(self, stage: str, settings: Mapping[str, Any], outputs: Sequence[Path],
             also_remove: Sequence[Path] = ()) -> Plan:
        """Decide whether `stage` runs; when it does, record `settings`, first removing its outputs (and
        `also_remove`: its partial files) if they were made with other settings. Done means a recorded result
        and every one of `outputs` present."""
        settings = _jsonable(settings)
        record = self.records.get(stage)
        present = [p for p in [*outputs, *also_remove] if p.exists()]
        if record is None and present:
            raise StaleOutputError(_unrecorded(present[0], self.out))
        if record is not None and record["settings"] != settings:
            message = f"{stage}: settings changed ({changed_settings(record['settings'], settings)}): redoing it"
            _remove(present)
        elif record is not None and record.get("result") is not None and all(p.exists() for p in outputs):
            return Plan(SKIP, f"{stage}: done with these settings, skipped", record["result"])
        elif present:
            message = f"{stage}: unfinished with these settings: running it again (resuming what it can)"
        else:
            message = f"{stage}: running"
        self.records[stage] = {"settings": settings, "result": None, "benchmark": self.benchmark}
        self._save()
        return Plan(RUN, message)

    def claim(self) -> None:
        """Before any work: a folder with no record must be empty (anything in it was made by something else, and
        the run would write beside it); then the book is written at once, so a run stopped before its first stage
        finished is still recognised as this pipeline's."""
        if not self.records:
            present = sorted(p.name for p in self.out.iterdir()) if self.out.is_dir() else []
            if present:
                shown = ", ".join(present[:3]) + (f" and {len(present) - 3} more" if len(present) > 3 else "")
                raise StaleOutputError(f"{self.out} holds other files ({shown}) and no record of a demo run: pass "
                                       "--out DIR with a new or empty folder")
        self.out.mkdir(parents=True, exist_ok=True)
        self._save()

    def finish(self, stage: str, result: Any) -> None:
        self.records[stage]["result"] = _jsonable(result)
        self._save()

    def _save(self) -> None:
        atomic_write_bytes(self.path, json.dumps(self.records, indent=1, sort_keys=True).encode())


def _unrecorded(path: Path, out: Path) -> str:
    return (f"{path} has no record of the settings that made it (an older version's output?); remove {out} or "
            "give another --out")


def _remove(paths: Sequence[Path]) -> None:
    for p in paths:
        if not p.exists():  # inside a directory removed before it
            continue
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def _jsonable(value: Any) -> Any:
    """The value as JSON reads it back (tuples as lists, paths as strings), so a loaded record compares equal."""
    return json.loads(json.dumps(value, default=str))
