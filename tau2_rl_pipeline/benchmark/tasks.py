"""tau2 tasks by domain and split, and the task index JSONL slime reads as prompt data.

    python -m tau2_rl_pipeline.benchmark.tasks --local_dir outputs/tasks --domains airline,retail,telecom --splits train,test

writes `{domain}_{split}_tasks.jsonl` and `tau2_{split}_all_tasks.jsonl`: one row per task,
`{"input": ..., "metadata": {"domain", "split", "task_id", "task_index", "benchmark"}}`. The rollout builds the real
prompt from the metadata (the episode's system prompt, tools and conversation start), so `input` is only a
short human-readable label; slime's `--input-key input --metadata-key metadata` read these rows. `benchmark` (the
tau2 version and the hash of the row's domain split) lets the rollout refuse an index written with another tau2.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import tau2_rl_pipeline  # noqa: F401  (quiet logging, offline litellm before tau2 loads)
from tau2_rl_pipeline.benchmark.tau2_version import DOMAINS, SPLITS, TASK_SETS, UNSUPPORTED, VERSION, task_set_hash
from tau2_rl_pipeline.config import command_parser
from tau2_rl_pipeline.files import atomic_write_bytes

if TYPE_CHECKING:
    from tau2.data_model.tasks import Task



class TaskLookupError(ValueError):
    """An unknown domain, split or task id; the message lists the valid ones."""


def check_domain(domain: str) -> str:
    if domain in UNSUPPORTED:
        raise TaskLookupError(UNSUPPORTED[domain])
    if domain not in SPLITS:
        raise TaskLookupError(f"unknown domain {domain!r}; valid domains: {', '.join(DOMAINS)}")
    return domain


def check_split(domain: str, split: str) -> str:
    check_domain(domain)
    if split not in SPLITS[domain]:
        raise TaskLookupError(
            f"unknown split {split!r} for domain {domain!r}; valid splits: {', '.join(SPLITS[domain])}")
    return split


@functools.cache
def _load(domain: str, split: str) -> tuple[Task, ...]:
    from tau2.registry import registry

    if (domain, split) in TASK_SETS:
        return tuple(registry.get_tasks_loader(TASK_SETS[domain, split])())
    if SPLITS[domain] == ("base",):  # no split file (mock, banking_knowledge): the whole set
        return tuple(registry.get_tasks_loader(domain)())
    return tuple(registry.get_tasks_loader(domain)(split))


def load_tasks(domain: str, split: str) -> list[Task]:
    """The tasks of one domain split, in tau2's order (cached: tau2 parses the task files each call)."""
    check_split(domain, split)
    return list(_load(domain, split))


@functools.cache
def _index(domain: str, split: str) -> dict[str, Task]:
    return {t.id: t for t in _load(domain, split)}


def get_task(domain: str, task_id: str, split: str | None = None) -> Task:
    """Find a task by id; without a split, the domain's base set (telecom: full) is searched."""
    split = split or ("full" if domain == "telecom" else "base")
    check_split(domain, split)
    try:
        return _index(domain, split)[task_id]
    except KeyError:
        ids = list(_index(domain, split))
        shown = ", ".join(ids[:8]) + (f", ... ({len(ids)} in all)" if len(ids) > 8 else "")
        raise TaskLookupError(f"unknown task id {task_id!r} in {domain}/{split}; valid ids: {shown}") from None


@functools.cache
def _split_hash(domain: str, split: str) -> str:
    return task_set_hash({domain: load_tasks(domain, split)})


def split_benchmark(domain: str, split: str) -> dict[str, str]:
    """The installed tau2's version and the hash of one domain split's tasks (cached): what a task-index row records
    and the rollout compares."""
    return {"tau2_version": VERSION, "task_set_hash": _split_hash(domain, split)}


def task_rows(domain: str, split: str) -> list[dict]:
    return [
        {
            "input": f"tau2 {domain} task {task.id}",
            "metadata": {"domain": domain, "split": split, "task_id": task.id, "task_index": i,
                         "benchmark": split_benchmark(domain, split)},
        }
        for i, task in enumerate(load_tasks(domain, split))
    ]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """Write rows atomically so a killed run never leaves a half-written prompt file behind."""
    atomic_write_bytes(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8"))


def write_task_index(local_dir: str | Path, domains: list[str], splits: list[str]) -> dict[str, int]:
    """Write the per-domain and all-domain JSONL files; returns row counts by file name."""
    for domain in domains:
        check_domain(domain)
        for split in splits:
            check_split(domain, split)
    out = Path(local_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for split in splits:
        all_rows: list[dict] = []
        for domain in domains:
            rows = task_rows(domain, split)
            name = f"{domain}_{split}_tasks.jsonl"
            write_jsonl(out / name, rows)
            counts[name] = len(rows)
            all_rows.extend(rows)
        name = f"tau2_{split}_all_tasks.jsonl"
        write_jsonl(out / name, all_rows)
        counts[name] = len(all_rows)
    return counts


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("tau2-rl-tasks", __doc__.split("\n\n")[0])
    parser.add_argument("--local_dir", "--local-dir", dest="local_dir", required=True,
                        help="output directory for the task JSONL files")
    parser.add_argument("--domains", default="airline,retail,telecom", help="comma-separated domains")
    parser.add_argument("--splits", default="train,test", help="comma-separated splits")
    args = parser.parse_args(argv)
    try:
        counts = write_task_index(args.local_dir, _csv(args.domains), _csv(args.splits))
    except TaskLookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # not writable, a file where the folder goes: one line, no traceback
        print(f"error: --local-dir {args.local_dir}: cannot write {e.filename or args.local_dir}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    for name, n in counts.items():
        print(f"{n:5d}  {Path(args.local_dir) / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
