"""Goodput on separate hosts with restarts on: a GRPO run of N rollouts under a schedule of faults, beside the same
run without faults.

The hosts tier's cluster (tests/support/hosts.py: 2 namespaced hosts x 1 Ray GPU, sync GRPO, the user simulator on
the head, tests/contract/hosts_job.py in place of slime's train.py: slime's parse_args, placement groups and
RolloutManager, each engine an SGLang double, rollouts through slime's rollout function and the project's custom
generate, a checkpoint every --save-interval rollouts at slime's cadence). One command per run,
`MAX_RESTARTS=5 bash scripts/train_grpo.sh` with slime's engine fault tolerance in EXTRA_SLIME_ARGS; the faulted run
meets, each once, when the job starts the rollout the schedule names:

  link cut            the worker's link down (restored once the supervisor says it waits for that host)
  raylet killed       SIGKILL of the worker's raylet
  hung engine         the worker's SGLang engine stops answering /generate and /health_generate
  user sim killed     SIGKILL of the user simulator, started again at once (as a service manager would)
  head's Ray killed   SIGKILL of the head's gcs_server and raylet

Figures: rollouts trained (each distinct id, and how many were trained again after a restart), per fault the
rollout it hit, the last checkpoint before it, the rollouts lost (trained before the fault, trained again after it:
at most the rollouts since the last checkpoint), the time from the fault to the next trained rollout, restarts; and
the wall time of the faulted run over the fault-free one. Both runs in one invocation, fault-free first.

    sudo .venv/bin/python bench/goodput.py --rollouts 20 --save-interval 2

Needs what the hosts tier needs (root, iproute2, util-linux, openssh-server, the pinned sources in
../shared/third_party or TAU2_THIRD_PARTY, the Qwen3-free small tokenizer is trained here). About 15 minutes on 2
cores. Not a test: the numbers go to docs/hardening.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "contract")]  # the hosts tier's rigs

SCHEDULE = [(3, "link cut"), (7, "raylet killed"), (10, "hung engine"), (13, "user sim killed"),
            (16, "head's Ray killed")]
FAULT_TOLERANCE = "--use-fault-tolerance --rollout-health-check-interval 2 --rollout-health-check-timeout 5"
RESTORE_LINK_AFTER_S = 240  # if the supervisor never says it waits (it should), the link comes back anyway


def inject(fault: str, hosts, env: dict[str, str], shared: Path) -> None:
    from test_hosts_cluster import start_user_sim

    if fault == "link cut":
        hosts.set_link(1, up=False)
    elif fault == "raylet killed":
        hosts.kill(1, "raylet")
    elif fault == "head's Ray killed":
        hosts.kill(0, "gcs_server", "raylet")
    elif fault == "hung engine":
        worker = hosts.addresses[1]
        records = [p for p in (shared / "engines").glob("*.json") if json.loads(p.read_text())["host"] == worker]
        record = json.loads(max(records, key=lambda p: p.stat().st_mtime).read_text())
        (shared / "engines" / f"hang-{record['host']}-{record['port']}").touch()
    elif fault == "user sim killed":
        hosts.hosts[0].run(["pkill", "-9", "-f", "support.loopback_server"])  # the head's PID namespace only
        start_user_sim(hosts, hosts.hosts[0], env, shared)
    else:
        raise ValueError(fault)


def one_run(base: Path, tiny: Path, rollouts: int, save_interval: int, faults: bool) -> dict:
    from test_hosts_cluster import start_user_sim
    from test_hosts_faults import CLEAN_LIMIT_S, RUN_LIMIT_S, Run, until_clean
    from test_hosts_restarts import hosts_up, restart_env

    shared = base / ("faulted" if faults else "clean") / "shared"
    hosts = hosts_up(shared, tiny, f"t2h{os.getpid()}g{int(faults)}")
    try:
        progress = shared / "progress.jsonl"
        env = {**restart_env(shared, hosts, progress, rollouts), "GRPO_SAVE_INTERVAL": str(save_interval),
               "MAX_RESTARTS": "5", "EXTRA_SLIME_ARGS": FAULT_TOLERANCE, "TAU2_USER_MAX_RETRIES": "4"}
        start_user_sim(hosts, hosts.hosts[0], env, shared)
        run = Run(hosts, env, progress)
        pending = list(SCHEDULE) if faults else []
        injected: list[dict] = []
        link_cut_at: float | None = None
        hung_at: float | None = None  # the next fault waits for the hung engine's replacement (rollouts are quick)
        while run.proc.poll() is None and time.monotonic() - run.started < 4 * RUN_LIMIT_S:
            if hung_at is not None and (started_at := replacement(shared, hosts.addresses[1], hung_at)) is not None:
                injected[-1]["replaced_after_s"] = started_at - hung_at
                hung_at = None
            started = {e["rollout"] for e in run.events() if e["event"] == "rollout"}
            if pending and hung_at is None and max(started, default=-1) >= pending[0][0]:
                rollout, fault = pending.pop(0)
                wall, mono = time.time(), time.monotonic()
                inject(fault, hosts, env, shared)
                injected.append({"fault": fault, "rollout": rollout, "time": wall})
                print(f"goodput: {fault} in rollout {rollout} at {mono - run.started:.0f} s", file=sys.stderr)
                if fault == "link cut":
                    link_cut_at = mono
                if fault == "hung engine":
                    hung_at = wall
            if link_cut_at is not None and (
                    any(t > link_cut_at and "waiting for" in line for t, line in run.lines)
                    or time.monotonic() - link_cut_at > RESTORE_LINK_AFTER_S):
                hosts.set_link(1, up=True)
                link_cut_at = None
            time.sleep(0.2)
        if link_cut_at is not None:
            hosts.set_link(1, up=True)
        t_exit = run.finish()
        clean = until_clean(hosts, CLEAN_LIMIT_S)
        # the stand-in job reports a failed rollout in its report and still exits 0: the error is read from there
        job = shared / "job.json"
        job_error = json.loads(job.read_text())[0].get("error") if job.exists() else "no job report"
        return {"faults": faults, "rc": run.proc.returncode, "wall_s": t_exit - run.started, "job_error": job_error,
                "events": run.events(), "injected": injected, "left": clean["left"],
                "restarts": [line for _, line in run.lines if ": restart " in line],
                "errors": [line for _, line in run.lines if ": error: " in line],
                "tail": [line for _, line in run.lines[-30:]]}
    finally:
        hosts.down()


def replacement(shared: Path, worker: str, since: float) -> float | None:
    """When an engine double started on the worker after `since` (slime's recovery of the hung one), or None."""
    started = []
    for path in (shared / "engines").glob("*.json"):
        try:  # a record being written, or the directory emptied by a job's start
            if path.stat().st_mtime > since and json.loads(path.read_text())["host"] == worker:
                started.append(path.stat().st_mtime)
        except (OSError, ValueError):
            continue
    return min(started, default=None)


def per_fault(run: dict) -> list[dict]:
    """For each fault: the last checkpoint before it, the rollouts lost (trained before it and again after), the
    time to the next trained rollout."""
    events, rows = run["events"], []
    for fault in run["injected"]:
        t = fault["time"]
        saved = [e["rollout"] for e in events if e["event"] == "saved" and e["time"] < t]
        before = {e["rollout"] for e in events if e["event"] == "trained" and e["time"] < t}
        after = [e for e in events if e["event"] == "trained" and e["time"] > t]
        lost = sorted(before & {e["rollout"] for e in after})
        rows.append({**fault, "checkpoint": saved[-1] if saved else None, "lost": lost,
                     "to_training_s": (after[0]["time"] - t) if after else None})
    return rows


def report(clean: dict, faulted: dict, rollouts: int, save_interval: int) -> str:
    lines = []
    for run in (clean, faulted):
        trained = [e["rollout"] for e in run["events"] if e["event"] == "trained"]
        jobs = len([e for e in run["events"] if e["event"] == "job"])
        lines.append(f"{'faulted' if run['faults'] else 'fault-free'}: exit {run['rc']}, {run['wall_s']:.0f} s, "
                     f"{len(set(trained))} of {rollouts} rollouts trained ({len(trained) - len(set(trained))} "
                     f"trained again after a restart), {jobs} job start(s), {len(run['restarts'])} restart(s); "
                     f"left on the hosts: {run['left']}")
        if run.get("job_error"):
            lines.append(f"  the job's own error (its report): {run['job_error']}")
        if run["rc"] != 0:
            lines.append("  its last lines:\n    " + "\n    ".join(run["tail"]))
    lines.append(f"wall-time ratio, faulted / fault-free: {faulted['wall_s'] / clean['wall_s']:.2f}")
    lines.append("")
    lines.append(f"| fault | in rollout | last checkpoint before it | rollouts lost (at most {save_interval - 1} + the "
                 "one in flight) | fault to training again | restarts |")
    lines.append("|---|---|---|---|---|---|")
    for row in per_fault(faulted):
        to = f"{row['to_training_s']:.0f} s" if row["to_training_s"] is not None else "never"
        if "replaced_after_s" in row:
            to += f" (a new engine in its slot after {row['replaced_after_s']:.0f} s)"
        restarts = len([e for e in faulted["events"] if e["event"] == "job" and row["time"] < e["time"]
                        < row["time"] + (row["to_training_s"] or 0)])
        lines.append(f"| {row['fault']} | {row['rollout']} | {row['checkpoint']} | {len(row['lost'])} "
                     f"{row['lost'] or ''} | {to} | {restarts} |")
    lines.append("")
    lines.extend(f"  {line}" for line in faulted["restarts"] + faulted["errors"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts per run (at least 20 for the schedule)")
    parser.add_argument("--save-interval", type=int, default=2, help="a checkpoint every N rollouts (default 2)")
    parser.add_argument("--out", type=Path, default=None, help="also write both runs' records as JSON here")
    parser.add_argument("--report", type=Path, default=None, help="only print the figures of an earlier --out")
    args = parser.parse_args(argv)
    if args.report:
        runs = json.loads(args.report.read_text())
        print(report(runs["clean"], runs["faulted"], args.rollouts, args.save_interval))
        return 0
    from support import hosts as hosts_mod

    if (why := hosts_mod.unavailable()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    if args.rollouts <= SCHEDULE[-1][0]:
        print(f"error: --rollouts {args.rollouts}: the schedule's last fault is in rollout {SCHEDULE[-1][0]}",
              file=sys.stderr)
        return 1
    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer

    with tempfile.TemporaryDirectory(prefix="goodput") as tmp:
        base = Path(tmp)
        tokenizer = train_small_tokenizer(domain_corpus(["mock"]), base / "tokenizer")
        tiny = build_tiny_qwen3(base / "tiny", tokenizer)
        clean = one_run(base, tiny, args.rollouts, args.save_interval, faults=False)
        faulted = one_run(base, tiny, args.rollouts, args.save_interval, faults=True)
    if args.out:
        args.out.write_text(json.dumps({"clean": clean, "faulted": faulted}, indent=1))
    print(report(clean, faulted, args.rollouts, args.save_interval))
    whole = all(run["rc"] == 0 and not run.get("job_error") and {e["rollout"] for e in run["events"]
                if e["event"] == "trained"} == set(range(args.rollouts)) for run in (clean, faulted))
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
