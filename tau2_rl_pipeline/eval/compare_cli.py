"""tau2-rl-compare: is run B better than run A? A paired comparison of two evaluator runs over the same tasks.

    tau2-rl-compare outputs/eval/rft.json outputs/eval/grpo.json            # B = grpo against A = rft
    tau2-rl-compare A.json B.json --names RFT,GRPO --json outputs/eval/grpo-vs-rft.json

Reads each run's summary and the episodes file beside it (<summary>.episodes.jsonl) and prints, per domain (and
over all tasks when there are several), B - A in pass@1 and pass^k with a 95% paired bootstrap CI over tasks and a
paired permutation p-value, the tasks B does better and worse on, and a plain verdict (tau2_rl_pipeline/eval/compare.py says how).
Runs of different benchmarks, tasks, user simulators or sampling settings are refused in one line naming the field,
as is a file that is not a finished run's (no settings, episodes without a reward, unreadable JSON) and an unfinished
run (its episodes file holds fewer episodes than its summary counts: killed, or cut off); --allow-unfinished
compares such a run anyway, with WARNING lines naming what is missing.
Exit codes: 0 compared, 2 bad input (nothing compared).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tau2_rl_pipeline.config import CommandParser, HelpFormatter
from tau2_rl_pipeline.eval.compare import NotComparable, compare_runs, verdict_lines
from tau2_rl_pipeline.eval.episodes_file import EpisodesFileError, atomic_write_text, read_episodes
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


def check_settings(path: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The summary's settings, or a one-line RunLoadError naming what a comparison needs and it lacks."""
    settings = summary.get("settings")
    if not isinstance(settings, dict):
        raise RunLoadError(f"{path}: the summary has no settings: not the --output JSON of a finished tau2-rl-eval "
                           "run")
    for name, ok in (("domains", lambda v: isinstance(v, list) and v),
                     ("num_samples", lambda v: isinstance(v, int) and v >= 1),
                     ("runs", lambda v: v is None or isinstance(v, int) and v >= 1),
                     ("task_ids", lambda v: v is None or isinstance(v, list))):
        if not ok(settings.get(name)):
            raise RunLoadError(f"{path}: the summary's settings hold no valid {name} ({settings.get(name)!r})")
    return settings


def check_records(path: Path, records: list[dict]) -> None:
    """A one-line RunLoadError naming the first episode without a status or a numeric reward."""
    for r in records:
        if not isinstance(r.get("status"), str) or isinstance(r.get("reward"), bool) \
                or not isinstance(r.get("reward"), (int, float)):
            missing = "status" if not isinstance(r.get("status"), str) else "numeric reward"
            raise RunLoadError(f"{path}: episode {r['domain']}/{r['task_id']}/{r['sample']} in "
                               f"{episodes_path(path)} has no {missing}")


def missing_episodes(summary: dict[str, Any], records: list[dict]) -> str | None:
    """What an unfinished run lacks: its summary counts more planned episodes than its episodes file holds (a
    killed run, a cut-off file); None when nothing is missing."""
    settings = summary["settings"]
    counted = (summary.get("episodes") or {}).get("planned")
    if not isinstance(counted, int):
        return "its summary does not say how many episodes it planned"
    if len(records) >= counted:
        return None
    trials = settings["num_samples"] * settings.get("runs", 1)
    per_task = Counter((r["domain"], r["task_id"]) for r in records)
    short = sorted(f"{d}/{t} ({n})" for (d, t), n in per_task.items() if n < trials)
    absent = [d for d in settings["domains"] if d not in {r["domain"] for r in records}]
    parts = ([f"tasks with fewer than {trials} episodes: {', '.join(short[:5])}{', ...' if len(short) > 5 else ''}"]
             if short else []) + ([f"no episode of {', '.join(absent)}"] if absent else [])
    return (f"the run is unfinished or its episodes file was cut off: its summary counts {counted} episodes, the "
            f"file holds {len(records)} ({'; '.join(parts) or 'whole tasks missing'})")


def load_run(path: Path, *, allow_unfinished: bool = False) -> dict[str, Any]:
    """{"settings", "records", "warnings"} of a finished evaluator run, or a one-line RunLoadError; an unfinished
    run is refused unless `allow_unfinished` (then a warning names what is missing)."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise RunLoadError(f"{path}: not a readable evaluator summary ({type(e).__name__}: {e})") from None
    if not isinstance(summary, dict) or summary.get("format") != SUMMARY_FORMAT:
        raise RunLoadError(f"{path}: not an evaluator summary (format {SUMMARY_FORMAT!r}); pass the --output JSON "
                           "of a finished tau2-rl-eval run")
    settings = check_settings(Path(path), summary)
    episodes = episodes_path(Path(path))
    try:
        records = planned(read_episodes(episodes), settings)
    except (OSError, EpisodesFileError) as e:
        raise RunLoadError(f"{path}: its episodes file {episodes} cannot be read ({e})") from None
    except (KeyError, TypeError) as e:  # a line without its domain, task id or sample
        raise RunLoadError(f"{path}: its episodes file {episodes} holds an episode without "
                           f"{e if isinstance(e, KeyError) else 'a valid key'}") from None
    check_records(Path(path), records)
    missing = missing_episodes(summary, records)
    if missing is not None and not allow_unfinished:
        raise RunLoadError(f"{path}: {missing}; finish it (rerun with the same --output) or pass "
                           "--allow-unfinished to compare what is there")
    return {"settings": settings, "records": records, "warnings": [f"{path}: {missing}"] if missing else []}


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
    p.add_argument("--allow-unfinished", action="store_true",
                   help="compare a run whose episodes file holds fewer episodes than its summary counts (killed, "
                        "cut off), with WARNING lines naming what is missing; refused by default")
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
        runs = [load_run(path, allow_unfinished=args.allow_unfinished) for path in (args.run_a, args.run_b)]
        result = compare_runs(*runs)
    except (RunLoadError, NotComparable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result["runs"] = {"a": {"name": names[0], "summary": str(args.run_a)},
                      "b": {"name": names[1], "summary": str(args.run_b)}}
    result["warnings"] = list(dict.fromkeys(w for run in runs for w in run["warnings"]))  # one run given twice: once
    print("\n".join([*(f"WARNING: {w}" for w in result["warnings"]), *verdict_lines(*names, result)]))
    if args.json is not None:
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
        print(f"comparison {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
