"""Difficulty-filtered GRPO tasks: keep the train tasks whose pass rate over the RFT stage's samples lies in a band.

    python -m tau2_rl_pipeline.selection.difficulty --episodes data/sft_seed_plus_rft.jsonl.eval.json.episodes.jsonl \
        --tasks data/tasks/tau2_train_all_tasks.jsonl --out data/tasks/tau2_train_grpo_tasks.jsonl

The RFT stage already plays every train task N times with the SFT policy; a task it (nearly) always solves gives
GRPO groups with equal rewards and no signal, and one it never solves gives none either. The best published small
tau2 result (Qwen3-8B, SFT -> RFT -> GRPO) drops the nearly always solved tasks this way. The band is
[TAU2_GRPO_MIN_PASS_RATE, TAU2_GRPO_MAX_PASS_RATE], both inclusive; the defaults [0, 1] keep every task.
A task's pass rate is tau2's success rule over its scored episodes (aborted ones are infrastructure failures and
do not count); a task with no scored episode is kept and counted as unsampled. Each kept row of a sampled task
records its pass rate (metadata "reference_pass_rate"): AWSFT's baseline V* (learning/awsft.py), measured with the
policy the RFT stage sampled with. Pure selection, then a small CLI.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tau2_rl_pipeline.config import Tau2Config, add_config_args, command_parser, config_from_args
from tau2_rl_pipeline.files import atomic_write_bytes
from tau2_rl_pipeline.learning.awsft import BASELINE_KEY
from tau2_rl_pipeline.metrics import is_success

TaskKey = tuple[str, str]  # (domain, task_id): ids repeat across domains


@dataclass(frozen=True)
class FilterStats:
    tasks: int
    kept: int
    dropped_below_min: int  # pass rate < TAU2_GRPO_MIN_PASS_RATE (nearly never solved)
    dropped_above_max: int  # pass rate > TAU2_GRPO_MAX_PASS_RATE (nearly always solved)
    unsampled: int  # no scored episode: kept, nothing known about them
    min_pass_rate: float
    max_pass_rate: float

    def line(self) -> str:
        return (f"difficulty filter [{self.min_pass_rate:g}, {self.max_pass_rate:g}]: kept {self.kept}/{self.tasks} "
                f"tasks; dropped {self.dropped_below_min} below the minimum pass rate and {self.dropped_above_max} "
                f"above the maximum; {self.unsampled} unsampled (kept)")


def pass_rates(records: Iterable[dict]) -> dict[TaskKey, tuple[int, int]]:
    """(successes, scored episodes) per task from evaluator episode records; aborted episodes are left out."""
    counts: dict[TaskKey, list[int]] = defaultdict(lambda: [0, 0])
    for rec in records:
        if rec["status"] == "aborted":
            continue
        entry = counts[(rec["domain"], rec["task_id"])]
        entry[0] += int(is_success(rec["reward"]))
        entry[1] += 1
    return {key: (wins, n) for key, (wins, n) in counts.items()}


def filter_tasks(keys: Sequence[TaskKey], rates: dict[TaskKey, tuple[int, int]],
                 cfg: Tau2Config) -> tuple[list[TaskKey], FilterStats]:
    """The keys whose pass rate is in the configured band (unsampled ones kept), in their order, and the counts."""
    lo, hi = cfg.grpo_min_pass_rate, cfg.grpo_max_pass_rate
    kept: list[TaskKey] = []
    below = above = unsampled = 0
    for key in keys:
        wins, n = rates.get(key, (0, 0))
        if n == 0:
            unsampled += 1
            kept.append(key)
        elif wins / n < lo:
            below += 1
        elif wins / n > hi:
            above += 1
        else:
            kept.append(key)
    return kept, FilterStats(tasks=len(keys), kept=len(kept), dropped_below_min=below, dropped_above_max=above,
                             unsampled=unsampled, min_pass_rate=lo, max_pass_rate=hi)


def filter_task_rows(rows: Sequence[dict], records: Iterable[dict],
                     cfg: Tau2Config) -> tuple[list[dict], FilterStats]:
    """Task-index rows (tasks.task_rows) filtered by the pass rates in `records`; each kept row of a sampled task
    carries its pass rate as metadata["reference_pass_rate"]: the AWSFT baseline V* (learning/awsft.py), which
    slime copies from the row onto every sample of the task (an unsampled task's row gets none)."""
    keys = [(r["metadata"]["domain"], str(r["metadata"]["task_id"])) for r in rows]
    rates = pass_rates(records)
    kept, stats = filter_tasks(keys, rates, cfg)
    wanted = set(kept)
    return [with_reference_pass_rate(r, rates.get(key)) for r, key in zip(rows, keys) if key in wanted], stats


def with_reference_pass_rate(row: dict, rate: tuple[int, int] | None) -> dict:
    """The row with metadata["reference_pass_rate"] = successes / scored episodes (left out when none was scored)."""
    metadata = {k: v for k, v in row["metadata"].items() if k != BASELINE_KEY}
    if rate is not None and rate[1]:
        metadata[BASELINE_KEY] = rate[0] / rate[1]
    return {**row, "metadata": metadata}


class NothingLeftError(ValueError):
    """The band dropped every task: GRPO would have nothing to train on."""


def main(argv: Sequence[str] | None = None) -> int:
    import json

    from tau2_rl_pipeline.benchmark.tasks import write_jsonl
    from tau2_rl_pipeline.eval.episodes_file import EpisodesFileError, read_episodes

    parser = command_parser("python -m tau2_rl_pipeline.selection.difficulty", __doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=Path, required=True, help="the RFT stage's evaluator episode file")
    parser.add_argument("--tasks", type=Path, required=True, help="the train task index to filter")
    parser.add_argument("--out", type=Path, required=True, help="the filtered task index (GRPO's --prompt-data)")
    add_config_args(parser)
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args)
        rows = [json.loads(line) for line in args.tasks.read_text(encoding="utf-8").splitlines() if line.strip()]
        records = list(read_episodes(args.episodes).values())
        kept, stats = filter_task_rows(rows, records, cfg)
        if not kept:
            raise NothingLeftError(f"{stats.line()}: no task left for GRPO; widen TAU2_GRPO_MIN_PASS_RATE / "
                                   "TAU2_GRPO_MAX_PASS_RATE")
    except (OSError, ValueError, KeyError, EpisodesFileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write_jsonl(args.out, kept)
    atomic_write_bytes(args.out.with_name(args.out.name + ".stats.json"), json.dumps(asdict(stats), indent=1).encode())
    print(f"{stats.line()}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
