"""Issue 9, P1: per-episode environment cost, tau2's native path vs fast_env, on every test task's oracle replay.

    .venv/bin/python bench/env_cost.py                   # markdown table: airline, retail, telecom, mock
    .venv/bin/python bench/env_cost.py --profile         # also bench/profiles/env_cost_{native,fast}.txt

Per episode, setup = building the Episode (environment, tool schemas, initial state) and opening the
conversation; evaluation = `Episode.evaluate()`. Native is tau2's environment constructor and tau2's evaluation
as they are; fast is `Episode(..., fast=True)` (tau2_rl_pipeline/benchmark/fast_env.py). The gold tool calls in between are
timed too, for information. Times are CPU seconds of this process (`time.process_time`): the work is blocking
Python, and CPU time is steadier than wall time on a shared machine. Both paths replay each task in turn, native
first; one untimed replay per domain warms both up, and fast's one-time parse of the domain databases is
reported on its own.

Exits 1 when any fast RewardInfo differs from the native one, or the shared parsed records changed.
--profile needs pyinstrument (a bench extra: pip install pyinstrument==5.1.3), not a runtime dependency.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

from tau2.data_model.simulation import TerminationReason

from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.fast_env import check_shared_records, fast_environment
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions
from tau2_rl_pipeline.benchmark.tasks import load_tasks

PROFILES = Path(__file__).resolve().parent / "profiles"
PHASES = ("setup", "tools", "eval")
SHOW_TAU2 = {"show_regex": r".*/tau2/.*", "filter_threshold": 0.02}  # tau2's frames too; hide those under 2%


def replay(domain: str, task, fast: bool) -> tuple[dict[str, float], dict]:
    """One oracle replay; CPU seconds per phase and the RewardInfo dump."""
    t0 = time.process_time()
    episode = Episode(domain, task, None, fast=fast)
    episode.start()
    t1 = time.process_time()
    for action in gold_actions(task):
        call = episode.user_tool_call if action.requestor == "user" else episode.agent_tool_call
        call(action.name, action.arguments)
    episode.agent_says(final_message(task))
    episode.stop(TerminationReason.AGENT_STOP)
    t2 = time.process_time()
    info = episode.evaluate()
    t3 = time.process_time()
    return {"setup": t1 - t0, "tools": t2 - t1, "eval": t3 - t2}, info.model_dump()


def tasks_of(domain: str):
    return load_tasks(domain, "base" if domain == "mock" else "test")


def measure(domain: str) -> tuple[dict, list[str]]:
    tasks = tasks_of(domain)
    replay(domain, tasks[0], fast=False)
    t0 = time.process_time()
    fast_environment(domain)  # parses the domain's databases once for this process
    parse = time.process_time() - t0
    replay(domain, tasks[0], fast=True)
    times = {path: {phase: [] for phase in PHASES} for path in ("native", "fast")}
    differ = []
    for task in tasks:
        native_t, native_info = replay(domain, task, fast=False)
        fast_t, fast_info = replay(domain, task, fast=True)
        for path, t in (("native", native_t), ("fast", fast_t)):
            for phase in PHASES:
                times[path][phase].append(t[phase])
        if fast_info != native_info:
            differ.append(f"{domain}/{task.id}")
    return {"tasks": len(tasks), "parse": parse, **times}, differ


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f} / {statistics.mean(values) * 1e3:.1f}"


def table(results: dict[str, dict]) -> str:
    head = ("| domain | tasks | native setup | native eval | fast setup | fast eval | native setup+eval | "
            "fast setup+eval | ratio (median / mean) | tool calls native / fast (mean) | fast one-time parse |")
    rows = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for domain, r in results.items():
        total = {p: [s + e for s, e in zip(r[p]["setup"], r[p]["eval"])] for p in ("native", "fast")}
        ratio_median = statistics.median(total["native"]) / statistics.median(total["fast"])
        ratio_mean = statistics.mean(total["native"]) / statistics.mean(total["fast"])
        rows.append(
            f"| {domain} | {r['tasks']} | {_ms(r['native']['setup'])} | {_ms(r['native']['eval'])} | "
            f"{_ms(r['fast']['setup'])} | {_ms(r['fast']['eval'])} | {_ms(total['native'])} | {_ms(total['fast'])} | "
            f"**{ratio_median:.0f}x** / **{ratio_mean:.0f}x** | "
            f"{statistics.mean(r['native']['tools']) * 1e3:.1f} / {statistics.mean(r['fast']['tools']) * 1e3:.1f} | "
            f"{r['parse'] * 1e3:.0f} |")
    return "\n".join(rows)


def profile(domains: list[str]) -> None:
    try:
        from pyinstrument import Profiler
    except ImportError:
        sys.exit("--profile needs pyinstrument: .venv/bin/pip install pyinstrument==5.1.3")
    PROFILES.mkdir(exist_ok=True)
    for path, fast in (("native", False), ("fast", True)):
        sections = []
        for domain in domains:
            profiler = Profiler(interval=0.0005)
            profiler.start()
            for task in tasks_of(domain):
                replay(domain, task, fast=fast)
            profiler.stop()
            sections.append(f"## {domain}: {path} path, oracle replays of every test task "
                            f"(setup + gold tool calls + evaluation)\n"
                            + profiler.output_text(processor_options=SHOW_TAU2))
        out = PROFILES / f"env_cost_{path}.txt"
        out.write_text("\n".join(sections))
        print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Per-episode environment cost: tau2 native vs fast_env.")
    parser.add_argument("--domains", default="airline,retail,telecom,mock", help="comma-separated")
    parser.add_argument("--profile", action="store_true",
                        help="write pyinstrument profiles of both paths (airline and retail) to bench/profiles/")
    args = parser.parse_args(argv)
    domains = [d for d in args.domains.split(",") if d]
    results, differ = {}, []
    for domain in domains:
        results[domain], bad = measure(domain)
        differ += bad
    print("CPU milliseconds per episode, median / mean over the tasks (`time.process_time`)\n")
    print(table(results))
    broken = [d for d in domains if not check_shared_records(d)]
    if args.profile:
        profile([d for d in domains if d in ("airline", "retail")])
    if differ:
        print(f"\nREWARDS DIFFER on {len(differ)} replays: {', '.join(differ)}", file=sys.stderr)
    if broken:
        print(f"\nSHARED RECORDS CHANGED in {', '.join(broken)}", file=sys.stderr)
    return 1 if differ or broken else 0


if __name__ == "__main__":
    sys.exit(main())
