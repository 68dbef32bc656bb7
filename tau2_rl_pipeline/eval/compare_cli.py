"""tau2-rl-compare: is run B better than run A? A paired comparison of two evaluator runs over the same tasks.

    tau2-rl-compare outputs/eval/rft.json outputs/eval/grpo.json            # B = grpo against A = rft
    tau2-rl-compare A.json B.json --names RFT,GRPO --json outputs/eval/grpo-vs-rft.json

Reads each run's summary and the episodes file beside it (<summary>.episodes.jsonl) and prints, per domain (and
over all tasks when there are several), B - A in pass@1 and pass^k with a 95% paired bootstrap CI over tasks and a
paired permutation p-value, the tasks B does better and worse on, and a plain verdict (tau2_rl_pipeline/eval/compare.py says how).
Runs of different benchmarks, tasks, user simulators or sampling settings are refused in one line naming the field.
Exit codes: 0 compared, 2 bad input (nothing compared).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tau2_rl_pipeline.eval.compare import NotComparable, compare_runs, verdict_lines
from tau2_rl_pipeline.eval.episodes_file import EpisodesFileError, atomic_write_text, read_episodes
from tau2_rl_pipeline.config import CommandParser, HelpFormatter
from tau2_rl_pipeline.files import unwritable_reason

SUMMARY_FORMAT = "tau2_rl_pipeline.eval_passk/1"


class RunLoadError(ValueError):
    """A path that is not a finished evaluator run (no summary, another format, no episodes file)."""


def episodes_path(summary_path: Path) -> Path:
    """The episodes file the evaluator writes beside its summary (tau2_rl_pipeline/eval/plan.py output_paths)."""
    return summary_path.with_name(summary_path.name + ".episodes.jsonl")


def planned(records: dict, settings: dict[str, Any]) -> list[dict]:
    """The records a run's metrics counted: its domains and tasks, and samples below its runs x samples."""
    samples = settings["num_samples"] * settings.get("runs", 1)
    ids = set(settings["task_ids"]) if settings.get("task_ids") else None
    return [r for (domain, task_id, sample), r in records.items()
            if domain in settings["domains"] and (ids is None or task_id in ids) and sample < samples]


def load_run(path: Path) -> dict[str, Any]:
    """{"settings", "records"} of a finished evaluator run, or a one-line RunLoadError."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RunLoadError(f"{path}: not a readable evaluator summary ({type(e).__name__}: {e})") from None
    if not isinstance(summary, dict) or summary.get("format") != SUMMARY_FORMAT:
        raise RunLoadError(f"{path}: not an evaluator summary (format {SUMMARY_FORMAT!r}); pass the --output JSON "
                           "of a finished tau2-rl-eval run")
    episodes = episodes_path(Path(path))
    try:
        records = read_episodes(episodes)
    except (OSError, EpisodesFileError) as e:
        raise RunLoadError(f"{path}: its episodes file {episodes} cannot be read ({e})") from None
    return {"settings": summary["settings"], "records": planned(records, summary["settings"])}


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="tau2-rl-compare", usage="%(prog)s [options] A.json B.json",
                      description="Is run B better than run A? A paired comparison of two evaluator runs over "
                                  "the same tasks.",
                      epilog="Both runs must share benchmark, tasks, user simulator and sampling settings.",
                      formatter_class=HelpFormatter)  # every command answers --help-all too
    p.add_argument("run_a", type=Path, help="summary JSON of run A (the baseline), e.g. outputs/eval/rft.json")
    p.add_argument("run_b", type=Path, help="summary JSON of run B (the candidate), e.g. outputs/eval/grpo.json")
    p.add_argument("--names", default=None, help="two names for the verdict lines, e.g. RFT,GRPO (default: A,B)")
    p.add_argument("--json", type=Path, default=None, help="also write the comparison here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in (args.names or "A,B").split(",")]
    try:
        if len(names) != 2 or not all(names):
            raise RunLoadError(f"--names takes two comma-separated names, got {args.names!r}")
        problem = unwritable_reason(args.json) if args.json is not None else None
        if problem:
            raise RunLoadError(f"--json {args.json}: {problem}")
        result = compare_runs(load_run(args.run_a), load_run(args.run_b))
    except (RunLoadError, NotComparable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["runs"] = {"a": {"name": names[0], "summary": str(args.run_a)},
                      "b": {"name": names[1], "summary": str(args.run_b)}}
    print("\n".join(verdict_lines(*names, result)))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
        print(f"comparison {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
