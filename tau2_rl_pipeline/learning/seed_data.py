"""The published seed data, validated and rewritten to the rollout's protocol.

The published seed data (the original cookbook's protocol, or OpenAI chat format), validated and rewritten to the
rollout's protocol; a row that cannot be is reported with its line number and left out. Read from a local file or
directory, or the hub cache (nothing is downloaded at run time where the machine is offline)."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tau2_rl_pipeline.benchmark.actions import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_completion
from tau2_rl_pipeline.benchmark.episode import AGENT_STOP_TOKEN
from tau2_rl_pipeline.benchmark.prompting import assistant_chat_message
from tau2_rl_pipeline.benchmark.tasks import DOMAINS
from tau2_rl_pipeline.learning.sft_rows import domain_spec, sft_row

SEED_DATASET = "Jarrodbarnes/tau2-sft-seed-v3"
SEED_FILE = "seed_sft_v3.jsonl"  # the dataset also holds tau2_sft_merged_v3_rft.jsonl, the original's own RFT merge
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
INFERABLE_DOMAINS = ("airline", "retail", "telecom")
TOOL_RESULT_PREFIX = "Tool result for "  # the original cookbook's tool-result user turn
PSEUDO_TOOLS = ("respond", "done")  # the original cookbook's "talk to the user" and "end the conversation" calls
ROLES = ("system", "user", "assistant", "tool")


class SeedDataError(ValueError):
    """The seed data cannot be read at all (no such path, offline without a cache, no pyarrow for parquet)."""


class RowError(ValueError):
    """One row is unusable; the message says why (reported with the row's line number)."""


# ---------------------------------------------------------------------------------------------------------------
# Row validation and normalization


@dataclass
class _Turns:
    """Messages rewritten to the rollout's protocol, with the tool calls still waiting for their results."""

    chat: list[dict]
    called: list[str]  # agent tool names called, in order
    pending: list[str]
    pending_at: int = -1


def normalize_row(row: Any) -> dict:
    """Validate one row of seed data and rewrite it to the rollout's protocol; raises RowError saying why not."""
    if not isinstance(row, dict):
        raise RowError(f"not a JSON object but {type(row).__name__}")
    key = "messages" if "messages" in row else "prompt" if "prompt" in row else None
    if key is None:
        raise RowError(f"no messages: expected a 'messages' or 'prompt' key, got keys {sorted(row)[:8]}")
    messages = row[key]
    if not isinstance(messages, list) or not messages:
        raise RowError(f"'{key}' must be a non-empty list of messages")
    turns = _Turns(chat=[], called=[], pending=[])
    for i, msg in enumerate(messages):
        _add_message(turns, i, msg)
    if turns.pending:
        raise RowError(f"message {turns.pending_at}: tool call {turns.pending[0]} has no tool result")
    if not any(m["role"] == "assistant" for m in turns.chat):
        raise RowError("no assistant message to learn from")
    metadata = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
    listed = _listed_tools(row.get("tools"))
    domain = _row_domain(row, metadata, turns.called + listed)
    spec = domain_spec(domain)
    for name in turns.called + listed:
        if name in spec.agent_tools:
            continue
        if name in spec.user_tools:
            raise RowError(f"tool {name!r} is a user-side tool of {domain}: the agent asks the user to do it")
        raise RowError(f"unknown tool {name!r} for {domain}")
    task_id = next((src[k] for k in ("tau2_task_id", "task_id") for src in (row, metadata) if src.get(k) is not None),
                   None)
    return sft_row(domain, turns.chat, {"task_id": None if task_id is None else str(task_id), "source": "seed"})


def _add_message(turns: _Turns, i: int, msg: Any) -> None:
    if not isinstance(msg, dict):
        raise RowError(f"message {i}: not an object")
    role, content = msg.get("role"), msg.get("content")
    if role not in ROLES:
        raise RowError(f"message {i}: unknown role {role!r} (valid: {', '.join(ROLES)})")
    if content is not None and not isinstance(content, str):
        raise RowError(f"message {i}: content must be a string, got {type(content).__name__}")
    content = content or ""
    if role == "system":
        if i != 0:
            raise RowError(f"message {i}: a system message is only allowed first")
        return  # replaced by tau2's prompt for the row's domain
    is_result = role == "tool" or (role == "user" and content.startswith(TOOL_RESULT_PREFIX))
    if is_result:
        turns.chat.append({"role": "tool", "content": _tool_result(turns, i, role, content)})
        return
    if turns.pending:
        raise RowError(f"message {turns.pending_at}: tool call {turns.pending[0]} has no tool result")
    if role == "user":
        new = {"role": "user", "content": content}
    else:
        text, calls = _assistant_calls(i, content, msg.get("tool_calls"))
        new = assistant_chat_message(text, calls)
        turns.called += [name for name, _ in calls]
        turns.pending, turns.pending_at = [name for name, _ in calls], i
    mask = msg.get("step_loss_mask", 1)
    if mask not in (0, 1):
        raise RowError(f"message {i}: step_loss_mask must be 0 or 1, got {mask!r}")
    turns.chat.append(new if mask == 1 else {**new, "step_loss_mask": 0})


def _tool_result(turns: _Turns, i: int, role: str, content: str) -> str:
    if not turns.pending:
        raise RowError(f"message {i}: a tool result with no tool call before it")
    expected = turns.pending.pop(0)
    if role == "tool":
        return content
    header, _, payload = content.partition("\n")
    name = header[len(TOOL_RESULT_PREFIX):].split("(", 1)[0].strip()
    if not header.endswith(":") or name != expected:
        raise RowError(f"message {i}: tool result header {header[:80]!r} does not answer the call to {expected}")
    return payload


def _assistant_calls(i: int, content: str, field: Any) -> tuple[str, list[tuple[str, dict]]]:
    """The assistant's text and tool calls, from `<tool_call>` blocks in its content or from `tool_calls`."""
    if TOOL_CALL_OPEN in content or TOOL_CALL_CLOSE in content:
        if field:
            raise RowError(f"message {i}: tool calls both in the content and in tool_calls")
        parsed = parse_completion(content)
        if parsed.error is not None:
            raise RowError(f"message {i}: {parsed.error.message.split(' Write each call as ')[0]}")
        text, calls = parsed.content, [(c.name, c.arguments) for c in parsed.tool_calls]
    else:
        if field is not None and not isinstance(field, list):
            raise RowError(f"message {i}: tool_calls must be a list")
        text, calls = content, [_field_call(i, call) for call in field or []]
    names = [name for name, _ in calls]
    pseudo = [name for name in names if name in PSEUDO_TOOLS]
    if pseudo:
        if len(calls) > 1 or text.strip():
            raise RowError(f"message {i}: {pseudo[0]!r} must be the turn's only content")
        if pseudo[0] == "done":
            return AGENT_STOP_TOKEN, []
        said = calls[0][1].get("content")
        if not isinstance(said, str) or not said.strip():
            raise RowError(f"message {i}: respond needs a non-empty string 'content' argument")
        return said, []
    if not calls and not text.strip():
        raise RowError(f"message {i}: empty assistant message")
    return text, calls


def _field_call(i: int, call: Any) -> tuple[str, dict]:
    """One OpenAI-style call ({"function": {"name", "arguments"}} or flat); arguments as an object or JSON text."""
    fn = call.get("function", call) if isinstance(call, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise RowError(f"message {i}: a tool call without a name")
    arguments = fn.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise RowError(f"message {i}: arguments of {name} are not JSON: {arguments[:80]!r}") from None
    if not isinstance(arguments, dict):
        raise RowError(f"message {i}: arguments of {name} must be a JSON object, got {type(arguments).__name__}")
    return name, arguments


def _listed_tools(tools: Any) -> list[str]:
    """Names in a row's optional `tools` list (OpenAI schemas, possibly as a JSON string)."""
    if tools is None:
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            raise RowError("'tools' is a string but not JSON") from None
    if not isinstance(tools, list):
        raise RowError(f"'tools' must be a list, got {type(tools).__name__}")
    names = []
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RowError("'tools' holds an entry without a function name")
        names.append(fn["name"])
    return names


def _row_domain(row: dict, metadata: dict, names: list[str]) -> str:
    """The row's `domain` (top level or metadata), else the one domain whose agent tools include every name used."""
    domain = row.get("domain", metadata.get("domain"))
    if domain is not None:
        if domain not in DOMAINS:
            raise RowError(f"unknown domain {domain!r} (valid: {', '.join(DOMAINS)})")
        return domain
    if not names:
        raise RowError("no 'domain' field and no tool calls to tell the domain from")
    fits = [d for d in INFERABLE_DOMAINS if set(names) <= domain_spec(d).agent_tools]
    if len(fits) != 1:
        which = " and ".join(fits) if fits else "no domain"
        raise RowError(f"no 'domain' field and the tools used ({', '.join(sorted(set(names)))}) fit {which}")
    return fits[0]


# ---------------------------------------------------------------------------------------------------------------
# Reading the seed data: hub, cache or local path


@dataclass(frozen=True)
class Rejected:
    file: str
    line: int
    reason: str


def dataset_files(dataset: str, pattern: str = SEED_FILE) -> list[Path]:
    """The data files of `dataset`: a local file, the files matching `pattern` in a local directory, or those
    of a Hugging Face dataset (downloaded when online, from the local cache when HF_HUB_OFFLINE=1)."""
    path = Path(dataset).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        root = path
    elif dataset.count("/") == 1 and not dataset.startswith((".", "/", "~")):
        root = _hub_snapshot(dataset, pattern)
    else:
        raise SeedDataError(f"{dataset}: no such file or directory, and not a hub dataset id (owner/name)")
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in DATA_SUFFIXES)
    chosen = [p for p in files if fnmatch.fnmatch(p.relative_to(root).as_posix(), pattern)]
    if not chosen:
        present = ", ".join(p.relative_to(root).as_posix() for p in files[:10]) or "none"
        raise SeedDataError(f"no data file matching {pattern!r} in {dataset} (data files: {present}); "
                            "choose one with --file")
    return chosen


def _hub_snapshot(repo_id: str, pattern: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id=repo_id, repo_type="dataset", allow_patterns=[pattern]))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE=1 and it is not in the local cache" if constants.HF_HUB_OFFLINE \
            else "the hub cannot be reached and it is not in the local cache"
        raise SeedDataError(
            f"cannot load dataset {repo_id}: {why} ({constants.HF_HUB_CACHE}); connect and set HF_HUB_OFFLINE=0, "
            f"or pass a local file or directory (e.g. from `hf download {repo_id} --repo-type dataset "
            f"--local-dir DIR` on a machine with network)") from None
    except RepositoryNotFoundError:  # gated repositories included
        raise SeedDataError(f"dataset {repo_id} was not found on the hub, or it needs access: set HF_TOKEN "
                            "in the environment") from None
    except HfHubHTTPError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SeedDataError(f"cannot load dataset {repo_id}: the hub answered {first}") from None


def read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line, row) pairs; a JSONL line that is not JSON yields a RowError as its row. Rows of a JSON array or a
    parquet file are numbered from 1 like lines."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise SeedDataError(f"{path.name} is parquet, which needs pyarrow: pip install pyarrow, or convert "
                                "it to JSONL") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, ValueError) as e:
            raise SeedDataError(f"{path}: not a readable parquet file ({e})") from None
        yield from enumerate(rows, start=1)
        return
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as e:
            raise SeedDataError(f"{path}: not a JSON array ({e})") from None
        yield from enumerate(rows, start=1)
        return
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError as e:
            yield n, RowError(f"not JSON ({e})")


def load_seed(dataset: str, pattern: str = SEED_FILE) -> tuple[list[dict], list[Rejected]]:
    """The valid rows of the seed data, normalized, and the rejected ones with their line numbers."""
    rows: list[dict] = []
    rejected: list[Rejected] = []
    for path in dataset_files(dataset, pattern):
        for line, raw in read_rows(path):
            try:
                if isinstance(raw, RowError):
                    raise raw
                row = normalize_row(raw)
            except RowError as e:
                rejected.append(Rejected(path.name, line, str(e).replace("\n", "\\n")))
                continue
            row["metadata"].update(source_file=path.name, source_line=line)
            rows.append(row)
    return rows, rejected
