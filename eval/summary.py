"""The outputs of an evaluation run: metrics over the planned episodes, the summary JSON, tau2's results files,
the chart and the terminal report (the summary is written last: its presence means the run is done)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from eval.episodes_file import EpisodesFile, Key, atomic_write_text, pick_records
from eval.plan import Plan
from eval.submission import submit
from tau2_rl_pipeline.benchmark import judge

BOOTSTRAP_SEED = 0  # fixed, so the same episodes always give the same CIs (a resumed run included)


def build_summary(metrics: dict[str, Any], settings: dict[str, Any], records: Sequence[dict],
                  outside_plan: int, paths: dict[str, Any], ran: int, wall_s: float) -> dict[str, Any]:
    aborted = [{k: r[k] for k in ("domain", "task_id", "sample", "termination_reason", "error")}
               for r in records if r["status"] == "aborted"]
    usage = judge.JudgeUsage()
    for r in records:
        usage.add(judge.JudgeUsage(**r.get("judge", {})))
    return {
        "format": "tau2_rl_pipeline.eval_passk/1",
        "benchmark": settings["benchmark"],
        "settings": settings,
        "judge": {"settings": settings["judge"], "usage_over_recorded_episodes": usage.to_dict()},
        "episodes": {"file": str(paths["episodes"]), "planned": len(records), "ran_this_invocation": ran,
                     "aborted": aborted, "outside_plan_not_counted": outside_plan},
        "metrics": metrics,
        "outputs": {"chart": str(paths["chart"]), "tau2_results": {d: str(p) for d, p in paths["tau2"].items()}},
        "wall_s": wall_s,
    }


def write_outputs(summary: dict[str, Any], records: Sequence[dict], plan: Plan, paths: dict[str, Any],
                  secrets: Sequence[str]) -> None:
    from eval.report import render_chart
    from eval.tau2_results import results_info, results_json, tau2_results

    settings = summary["settings"]
    for domain, tasks in plan.tasks.items():
        results = tau2_results(domain, records, tasks, results_info(domain, settings, plan.num_samples))
        atomic_write_text(paths["tau2"][domain], results_json(results, settings["benchmark"]), secrets)
    render_chart(summary, paths["chart"])
    atomic_write_text(paths["summary"], json.dumps(summary, indent=2) + "\n", secrets)  # last: the run is done


def remove_stale(paths: dict[str, Any]) -> None:
    """Results of an earlier run at this --output must not outlive a run that fails before writing new ones."""
    for path in (paths["summary"], paths["chart"], *paths["tau2"].values()):
        path.unlink(missing_ok=True)


def print_report(console: Any, summary: dict[str, Any]) -> None:
    from eval.report import failures_table, metrics_table

    s = summary["settings"]
    title = (f"Pass@k: {s['model']} on {', '.join(s['domains'])} ({s['task_split']}), user {s['user']}, "
             f"tau2 {s['benchmark']['tau2_version']}")
    console.print(metrics_table(summary["metrics"], title))
    console.print(failures_table(summary["metrics"]))
    used = summary["judge"]["usage_over_recorded_episodes"]
    if summary["judge"]["settings"] is not None:
        console.print(f"NL-assertion judge {summary['judge']['settings']['model']}: {used['calls']} calls, "
                      f"{used['failed_attempts']} failed attempts, {used['prompt_tokens']} prompt + "
                      f"{used['completion_tokens']} completion tokens")
    if summary["episodes"]["aborted"]:
        console.print(f"{len(summary['episodes']['aborted'])} aborted episodes (infrastructure failures) are "
                      "left out of every metric; a rerun with the same --output retries them.")


def finish(plan: Plan, settings: dict[str, Any], log: EpisodesFile, done: dict[Key, dict], new: list[dict],
           paths: dict[str, Any], secrets: Sequence[str], wall_s: float, args: argparse.Namespace) -> int:
    """Metrics over the planned episodes, then every output (the summary last: its presence means done)."""
    from tau2_rl_pipeline.metrics import summarize

    merged = pick_records([*done.values(), *new])
    if log.lines > len(merged):  # retried aborted episodes left superseded lines: keep one per episode
        log.compact(merged.values())
    keys = plan.keys()
    records = [merged[k] for k in keys]
    try:
        metrics = summarize(records, seed=BOOTSTRAP_SEED)
    except ValueError as e:  # e.g. every episode aborted: no metric exists
        first = next((r["error"] for r in records if r["error"]), "")
        print(f"error: {e} (first error: {first}); fix the cause and rerun with the same --output", file=sys.stderr)
        return 1
    summary = build_summary(metrics, settings, records, len(merged) - len(keys), paths, len(new), wall_s)
    write_outputs(summary, records, plan, paths, secrets)
    print_report(Console(), summary)
    print(f"summary {paths['summary']}\nepisodes {paths['episodes']}\nchart {paths['chart']}\ntau2 results "
          + " ".join(str(p) for p in paths["tau2"].values()))
    if args.submission is not None:
        return submit(args, summary, paths, secrets)
    return 0
