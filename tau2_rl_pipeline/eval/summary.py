"""The outputs of an evaluation run: metrics, the summary JSON, tau2's results files, chart and report.

The outputs of an evaluation run: metrics over the planned episodes, the summary JSON, tau2's results files,
the chart and the terminal report (the summary is written last: its presence means the run is done)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.monitors import batch_monitors
from tau2_rl_pipeline.benchmark.user_monitors import batch_user_monitors
from tau2_rl_pipeline.eval.episodes_file import EpisodesFile, Key, atomic_write_text, pick_records
from tau2_rl_pipeline.eval.plan import Plan
from tau2_rl_pipeline.eval.submission import submit
from tau2_rl_pipeline.metrics import is_success

BOOTSTRAP_SEED = 0  # fixed, so the same episodes always give the same CIs (a resumed run included)


def rates_by_domain(records: Sequence[dict], key: str, rates: Any) -> dict[str, Any]:
    """`rates(records)` per domain, and over every domain when there are several, over the scored episodes that
    carry `key` (a resumed file's older lines may not)."""
    scored = [r for r in records if r["status"] != "aborted" and r.get(key)]
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for r in scored:
        by_domain[r["domain"]].append(r)
    out = {d: rates(rs) for d, rs in sorted(by_domain.items())}
    if len(by_domain) > 1:
        out["overall"] = rates(scored)
    return out


def behaviour(records: Sequence[dict]) -> dict[str, Any]:
    """The behaviour monitors' rates (benchmark/monitors.py batch_monitors) per domain and overall."""
    return rates_by_domain(records, "monitors", lambda rs: batch_monitors(
        [r["monitors"] for r in rs], [is_success(r["reward"]) for r in rs]))


def user_behaviour(records: Sequence[dict]) -> dict[str, Any]:
    """The user simulator's side (benchmark/user_monitors.py batch_user_monitors) per domain and overall."""
    return rates_by_domain(records, "user_monitors", lambda rs: batch_user_monitors([r["user_monitors"] for r in rs]))


def build_summary(metrics: dict[str, Any], settings: dict[str, Any], records: Sequence[dict],
                  outside_plan: int, paths: dict[str, Any], ran: int, wall_s: float,
                  runs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary JSON; `runs`: metrics.over_runs of a --runs N > 1 evaluation (mean +- sd over runs; `metrics`
    is then the pooled estimate over all runs' episodes)."""
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
        "runs": runs,
        "behaviour": behaviour(records),
        "user_behaviour": user_behaviour(records),
        "outputs": {"chart": str(paths["chart"]), "tau2_results": {d: str(p) for d, p in paths["tau2"].items()}},
        "wall_s": wall_s,
    }


def write_outputs(summary: dict[str, Any], records: Sequence[dict], plan: Plan, paths: dict[str, Any],
                  secrets: Sequence[str]) -> None:
    from tau2_rl_pipeline.eval.report import render_chart
    from tau2_rl_pipeline.eval.tau2_results import results_info, results_json, tau2_results

    settings = summary["settings"]
    for domain, tasks in plan.tasks.items():
        results = tau2_results(domain, records, tasks, results_info(domain, settings, plan.trials))
        atomic_write_text(paths["tau2"][domain], results_json(results, settings["benchmark"]), secrets)
    render_chart(summary, paths["chart"])
    atomic_write_text(paths["summary"], json.dumps(summary, indent=2) + "\n", secrets)  # last: the run is done


def remove_stale(paths: dict[str, Any]) -> None:
    """Results of an earlier run at this --output must not outlive a run that fails before writing new ones."""
    for path in (paths["summary"], paths["chart"], *paths["tau2"].values()):
        path.unlink(missing_ok=True)


def print_report(console: Any, summary: dict[str, Any]) -> None:
    from tau2_rl_pipeline.eval.report import behaviour_table, failures_table, metrics_table

    s = summary["settings"]
    title = (f"Pass@k: {s['model']} on {', '.join(s['domains'])} ({s['task_split']}), user {s['user']}, "
             f"tau2 {s['benchmark']['tau2_version']}")
    console.print(metrics_table(summary["metrics"], title))
    console.print(failures_table(summary["metrics"]))
    if summary.get("behaviour"):
        console.print(behaviour_table(summary["behaviour"]))
    used = summary["judge"]["usage_over_recorded_episodes"]
    if summary["judge"]["settings"] is not None:
        console.print(f"NL-assertion judge {summary['judge']['settings']['model']}: {used['calls']} calls, "
                      f"{used['failed_attempts']} failed attempts, {used['prompt_tokens']} prompt + "
                      f"{used['completion_tokens']} completion tokens")
    if summary.get("runs"):
        console.print(runs_lines(summary["runs"]))
    if summary["episodes"]["aborted"]:
        console.print(f"{len(summary['episodes']['aborted'])} aborted episodes (infrastructure failures) are "
                      "left out of every metric; a rerun with the same --output retries them.")


def pooled_ks(records: Sequence[dict], plan: Plan) -> list[int] | None:
    """The ks of a --runs N > 1 evaluation's pooled estimate: those of one run (k <= --num-samples), estimated from
    every run's episodes; None (every k the samples allow) for a single run."""
    if plan.runs == 1:
        return None
    scored = Counter((r["domain"], r["task_id"]) for r in records if r["status"] != "aborted")
    return list(range(1, min(plan.num_samples, max(scored.values(), default=1)) + 1))


def runs_lines(runs: dict[str, Any]) -> str:
    """Per domain, every pass@k / pass^k as mean +- sd over the runs (the table above pools their episodes)."""
    lines = [f"Over {runs['runs_scored']} of {runs['runs']} runs of {runs['num_samples']} samples/task "
             "(mean +- sd over runs; the table pools all runs' episodes):"]
    scopes = list(runs["domains"].items()) + ([("overall (micro)", runs["overall"])] if "overall" in runs else [])
    for scope, spread in scopes:
        cells = [f"{name} {e['mean']:.3f} +- {e['sd']:.3f}" for name, e in spread.items() if name.startswith("pass")]
        lines.append(f"  {scope}: " + ", ".join(cells))
    return "\n".join(lines)


def finish(plan: Plan, settings: dict[str, Any], log: EpisodesFile, done: dict[Key, dict], new: list[dict],
           paths: dict[str, Any], secrets: Sequence[str], wall_s: float, args: argparse.Namespace) -> int:
    """Metrics over the planned episodes, then every output (the summary last: its presence means done)."""
    from tau2_rl_pipeline.metrics import over_runs, summarize

    merged = pick_records([*done.values(), *new])
    if log.lines > len(merged):  # retried aborted episodes left superseded lines: keep one per episode
        log.compact(merged.values())
    keys = plan.keys()
    records = [merged[k] for k in keys]
    try:
        metrics = summarize(records, seed=BOOTSTRAP_SEED, k_values=pooled_ks(records, plan))
    except ValueError as e:  # e.g. every episode aborted: no metric exists
        first = next((r["error"] for r in records if r["error"]), "")
        print(f"error: {e} (first error: {first}); fix the cause and rerun with the same --output", file=sys.stderr)
        return 1
    runs = over_runs(records, num_samples=plan.num_samples, runs=plan.runs) if plan.runs > 1 else None
    summary = build_summary(metrics, settings, records, len(merged) - len(keys), paths, len(new), wall_s, runs)
    write_outputs(summary, records, plan, paths, secrets)
    print_report(Console(), summary)
    if getattr(args, "baseline", None) is not None:
        from tau2_rl_pipeline.eval.compare import compare_runs, verdict_lines

        try:
            result = compare_runs(args.baseline, {"settings": settings, "records": records})
            print("\n".join(verdict_lines(args.compare.stem, paths["summary"].stem, result)))
        except ValueError as e:  # e.g. no task scored in both runs: the run itself is done and saved
            print(f"no comparison with {args.compare}: {e}", file=sys.stderr)
    print(f"summary {paths['summary']}\nepisodes {paths['episodes']}\nchart {paths['chart']}\ntau2 results "
          + " ".join(str(p) for p in paths["tau2"].values()))
    if args.submission is not None:
        return submit(args, summary, paths, secrets)
    return 0
