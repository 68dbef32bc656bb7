"""Goodput with restarts on: a GRPO run of N rollouts under a schedule of faults, beside the same run without faults,
on separate hosts (--launcher hosts) or on Slurm (--launcher slurm).

hosts: the hosts tier's cluster (tests/support/hosts.py: 2 namespaced hosts x 1 Ray GPU, sync GRPO, the user
simulator on the head), one command per run, `MAX_RESTARTS=5 bash scripts/train_grpo.sh`: a node fault makes the
restart supervisor rerun the stage from its checkpoint.

slurm: the Slurm tier's cluster (tests/support/slurm.py via tests/contract/test_slurm_tier.py: a controller host with
the user simulator, three compute nodes with two fake GPUs each, one of them a spare), one submission per run as users
submit, `bash scripts/slurm.sh --nodes 2 --gpus-per-node 2 --max-restarts 5 ... train_grpo.sh`: the job asks for
`--requeue`; a node Slurm calls DOWN makes Slurm requeue it, a node Ray loses first makes the launcher's watch
requeue it (`scontrol requeue`), and the requeued run resumes from the checkpoint on nodes that answer.

Both: tests/contract/hosts_job.py in place of slime's train.py (slime's parse_args, placement groups and
RolloutManager, each engine an SGLang double, rollouts through slime's rollout function and the project's custom
generate, a checkpoint every --save-interval rollouts at slime's cadence), slime's engine fault tolerance in
EXTRA_SLIME_ARGS, the user client's retries on. The faulted run meets, each once, when the job starts the rollout
the schedule names (on Slurm, "the worker" and "the head" are the job's nodes at that moment):

  link cut            the worker's link down (hosts: restored once the supervisor says it waits for that host;
                      slurm: once the job runs again, on the spare node)
  raylet killed       SIGKILL of the worker's raylet
  hung engine         the worker's SGLang engine stops answering /generate and /health_generate
  user sim killed     SIGKILL of the user simulator, started again at once (as a service manager would)
  head's Ray killed   SIGKILL of the head's gcs_server and raylet

Figures: rollouts trained (each distinct id, and how many were trained again after a restart), per fault the
rollout it hit, the last checkpoint before it, the rollouts lost (trained before the fault, trained again after it:
at most the rollouts since the last checkpoint), the time from the fault to the next trained rollout, restarts, and
what healed it (a restart by the supervisor, a requeue by the launcher or by Slurm, slime's fault tolerance, the
client's retries; or "never", with how the run ended); and the wall time of the faulted run over the fault-free one.
Both runs in one invocation, fault-free first.

    sudo .venv/bin/python bench/goodput.py --rollouts 20 --save-interval 2
    sudo .venv/bin/python bench/goodput.py --launcher slurm --rollouts 20 --save-interval 2

Needs what the tier needs (root, iproute2, util-linux, openssh-server; for slurm `apt-get install slurm-wlm munge`;
the pinned sources in ../shared/third_party or TAU2_THIRD_PARTY; the small tokenizer is trained here). 10-30
minutes on 2 cores. Not a test: the numbers go to docs/hardening.md.
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "contract")]  # the tiers' rigs

SCHEDULE = [(3, "link cut"), (7, "raylet killed"), (10, "hung engine"), (13, "user sim killed"),
            (16, "head's Ray killed")]
FAULT_TOLERANCE = "--use-fault-tolerance --rollout-health-check-interval 2 --rollout-health-check-timeout 5"
RESTORE_LINK_AFTER_S = 240  # if the run never says it got past the cut (it should), the link comes back anyway
GIVE_UP_S = 900  # a fault after which nothing is trained for this long: the run is stopped and the fault "never" healed
RUN_LIMIT_S = 3600
POLL_S = 0.2


# ---- the runs: each launcher's cluster, its job, and what it says -----------------------------------------------
class HostsRun:
    """train_grpo.sh with MAX_RESTARTS=5 on the hosts tier's two hosts (head 0, worker 1)."""

    launcher = "hosts"

    def __init__(self, base: Path, tiny: Path, rollouts: int, save_interval: int, faults: bool) -> None:
        from test_hosts_cluster import start_user_sim
        from test_hosts_faults import Run
        from test_hosts_restarts import hosts_up, restart_env

        self.shared = base / f"hosts-{'faulted' if faults else 'clean'}" / "shared"
        self.cluster = hosts_up(self.shared, tiny, f"t2h{os.getpid()}g{int(faults)}")
        try:
            progress = self.shared / "progress.jsonl"
            self.env = {**restart_env(self.shared, self.cluster, progress, rollouts),
                        "GRPO_SAVE_INTERVAL": str(save_interval), "MAX_RESTARTS": "5",
                        "EXTRA_SLIME_ARGS": FAULT_TOLERANCE, "TAU2_USER_MAX_RETRIES": "4"}
            start_user_sim(self.cluster, self.cluster.hosts[0], self.env, self.shared)
            self.run = Run(self.cluster, self.env, progress)
            self.started = time.time()
        except BaseException:
            self.cluster.down()
            raise

    def poll(self) -> None: ...

    def over(self) -> bool:
        return self.run.proc.poll() is not None

    def events(self) -> list[dict]:
        return self.run.events()

    def nodes(self) -> tuple[int, int]:
        return 0, 1

    def lines(self) -> list[tuple[float, str]]:
        """The script's and the supervisor's lines, each with the wall time it came."""
        offset = time.time() - time.monotonic()
        return [(t + offset, line) for t, line in self.run.lines]

    def link_back_due(self, cut: dict) -> bool:
        return any(t > cut["time"] and "waiting for" in line for t, line in self.lines())

    def stop(self) -> None:
        self.run.proc.terminate()

    def finish(self) -> dict:
        from test_hosts_faults import CLEAN_LIMIT_S, until_clean

        self.run.finish()
        ended = time.time()
        left = until_clean(self.cluster, CLEAN_LIMIT_S)["left"]
        rc = self.run.proc.returncode
        return {"rc": rc, "ok": rc == 0, "end": f"exit {rc}", "wall_s": ended - self.started, "left": left}

    def down(self) -> None:
        self.cluster.down()


class SlurmRun:
    """`bash scripts/slurm.sh --nodes 2 --gpus-per-node 2 --max-restarts 5 ... train_grpo.sh` on the Slurm tier's
    cluster (controller 0, compute nodes 1-3)."""

    launcher = "slurm"
    SCONTROL_EVERY_S = 2.0

    def __init__(self, base: Path, tiny: Path, rollouts: int, save_interval: int, faults: bool) -> None:
        from test_hosts_cluster import start_user_sim
        from test_slurm_tier import cluster_up, job_env, submit

        self.shared = base / f"slurm-{'faulted' if faults else 'clean'}" / "shared"
        self.cluster = cluster_up(self.shared, tiny, run_id=f"t2h{os.getpid()}s{int(faults)}")
        try:
            self.progress = self.shared / "progress.jsonl"
            self.env = {**job_env(self.shared, self.cluster, self.progress), "HOSTS_JOB_ROLLOUTS": "all",
                        "GRPO_NUM_ROLLOUT": str(rollouts), "GRPO_SAVE_INTERVAL": str(save_interval),
                        "EXTRA_SLIME_ARGS": FAULT_TOLERANCE, "TAU2_USER_MAX_RETRIES": "4"}
            start_user_sim(self.cluster, self.cluster.hosts[0], self.env, self.shared)
            self.started = time.time()
            self.job_id, _, self.output = submit(self.cluster, self.env, self.shared / "slurm", "--max-restarts", "5",
                                                 time_limit="120")
        except BaseException:
            self.cluster.down()
            raise
        self._lines: list[tuple[float, str]] = []
        self._read = 0
        self.job: dict[str, str] = {}
        # (time, JobState, Restarts, NodeList, each node's state as sinfo says) at each change of the first three
        self.states: list[tuple[float, str, str, str, dict[str, str]]] = []
        self._asked = 0.0

    def poll(self, now: bool = False) -> None:
        """The job's output so far, each new line stamped with the time it was read; Slurm's view of the job every
        SCONTROL_EVERY_S (or now)."""
        if self.output.exists():
            with open(self.output, "rb") as f:
                f.seek(self._read)
                chunk = f.read()
            done = chunk.rfind(b"\n") + 1
            self._read += done
            stamp = time.time()
            self._lines += [(stamp, line) for line in chunk[:done].decode(errors="replace").splitlines()]
        if now or time.monotonic() - self._asked > self.SCONTROL_EVERY_S:
            self._asked = time.monotonic()
            self.job = self.cluster.job(self.job_id)
            state = (self.job.get("JobState", "?"), self.job.get("Restarts", "?"), self.job.get("NodeList", "?"))
            if not self.states or tuple(self.states[-1][1:4]) != state:
                self.states.append((time.time(), *state, self.cluster.states()))

    def over(self) -> bool:
        from test_slurm_tier import FINAL_STATES

        return self.job.get("JobState") in FINAL_STATES

    def events(self) -> list[dict]:
        from test_slurm_tier import events

        return events(self.progress)

    def nodes(self) -> tuple[int, int]:
        from tau2_rl_pipeline.cluster.slurm import expand_nodelist

        self.poll(now=True)
        head, worker = expand_nodelist(self.job["NodeList"])
        return int(head.rsplit("-h", 1)[1]), int(worker.rsplit("-h", 1)[1])

    def lines(self) -> list[tuple[float, str]]:
        return list(self._lines)

    def link_back_due(self, cut: dict) -> bool:
        """Once the job runs again (Slurm counts one more restart): elsewhere, as the cut node is not answering."""
        return self.job.get("JobState") == "RUNNING" and int(self.job.get("Restarts", 0)) > cut["slurm_restarts"]

    def stop(self) -> None:
        self.cluster.slurm("scancel", self.job_id, check=False)

    def finish(self) -> dict:
        from test_slurm_tier import ended, left_of_jobs, wait

        final = wait(lambda: ended(self.cluster, self.job_id), 300, 1) or self.cluster.job(self.job_id)
        ended_at = time.time()
        self.poll(now=True)
        def clean() -> bool:
            left, cgroups = left_of_jobs(self.cluster)
            return not any(left.values()) and not cgroups
        wait(clean, 240, 2)
        left, cgroups = left_of_jobs(self.cluster)
        state = final.get("JobState")
        return {"rc": 0 if state == "COMPLETED" else 1, "ok": state == "COMPLETED",
                "end": f"job {state} (Slurm's Restarts {final.get('Restarts')}, ExitCode {final.get('ExitCode')})",
                "wall_s": ended_at - self.started, "left": {**left, "job cgroups": cgroups},
                "slurm_states": self.states, "job_id": self.job_id}

    def down(self) -> None:
        self.cluster.down()


RUNS = {"hosts": HostsRun, "slurm": SlurmRun}


# ---- the faults -------------------------------------------------------------------------------------------------
def inject(fault: str, run, head: int, worker: int) -> None:
    from test_hosts_cluster import start_user_sim

    cluster, shared = run.cluster, run.shared
    if fault == "link cut":
        cluster.set_link(worker, up=False)
    elif fault == "raylet killed":
        cluster.kill(worker, "raylet")
    elif fault == "head's Ray killed":
        cluster.kill(head, "gcs_server", "raylet")
    elif fault == "hung engine":
        address = cluster.hosts[worker].address
        records = [p for p in (shared / "engines").glob("*.json") if json.loads(p.read_text())["host"] == address]
        record = json.loads(max(records, key=lambda p: p.stat().st_mtime).read_text())
        (shared / "engines" / f"hang-{record['host']}-{record['port']}").touch()
    elif fault == "user sim killed":
        cluster.hosts[0].run(["pkill", "-9", "-f", "support.loopback_server"])  # host 0's PID namespace only
        start_user_sim(cluster, cluster.hosts[0], run.env, shared)
    else:
        raise ValueError(fault)


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


def drive(run, schedule: list[tuple[int, str]]) -> list[dict]:
    """Inject each fault of the schedule as the job starts its rollout, until the run is over: what was injected
    when. The next fault waits for a hung engine's replacement (rollouts are quick); a fault after which nothing is
    trained for GIVE_UP_S stops the run."""
    pending, injected = list(schedule), []
    cut: dict | None = None
    hung: dict | None = None
    deadline = time.monotonic() + RUN_LIMIT_S
    while not run.over() and time.monotonic() < deadline:
        run.poll()
        if hung is not None and (started_at := replacement(run.shared, hung["worker"], hung["time"])) is not None:
            hung["replaced_after_s"] = started_at - hung["time"]
            hung = None
        events = run.events()
        started = {e["rollout"] for e in events if e["event"] == "rollout"}
        if pending and hung is None and max(started, default=-1) >= pending[0][0]:
            rollout, fault = pending.pop(0)
            head, worker = run.nodes()
            row = {"fault": fault, "rollout": rollout, "time": time.time(), "head": run.cluster.hosts[head].address,
                   "worker": run.cluster.hosts[worker].address, "worker_index": worker,
                   "slurm_restarts": int(getattr(run, "job", {}).get("Restarts", 0))}
            inject(fault, run, head, worker)
            injected.append(row)
            print(f"goodput: {fault} in rollout {rollout} at {row['time'] - run.started:.0f} s "
                  f"(head {row['head']}, worker {row['worker']})", file=sys.stderr)
            cut = row if fault == "link cut" else cut
            hung = row if fault == "hung engine" else hung
        if cut is not None and (run.link_back_due(cut) or time.time() - cut["time"] > RESTORE_LINK_AFTER_S):
            run.cluster.set_link(cut["worker_index"], up=True)
            cut["restored_after_s"] = time.time() - cut["time"]
            cut = None
        if injected and time.time() - injected[-1]["time"] > GIVE_UP_S and not [
                e for e in events if e["event"] == "trained" and e["time"] > injected[-1]["time"]]:
            print(f"goodput: nothing trained {GIVE_UP_S} s after the {injected[-1]['fault']}: stopping the run",
                  file=sys.stderr)
            run.stop()
            break
        time.sleep(POLL_S)
    if cut is not None:
        run.cluster.set_link(cut["worker_index"], up=True)
    return injected


def one_run(launcher: str, base: Path, tiny: Path, rollouts: int, save_interval: int,
            schedule: list[tuple[int, str]] | None) -> dict:
    run = RUNS[launcher](base, tiny, rollouts, save_interval, faults=schedule is not None)
    try:
        injected = drive(run, schedule or [])
        record = run.finish()
        # the stand-in job reports a failed rollout in its report: the error is read from there too
        job = run.shared / "job.json"
        job_error = json.loads(job.read_text())[0].get("error") if job.exists() else "no job report"
        return {**record, "launcher": launcher, "faults": schedule is not None, "job_error": job_error,
                "events": run.events(), "injected": injected, "lines": run.lines()}
    finally:
        run.down()


# ---- the figures (pure: from the runs' records) ---------------------------------------------------------------
RESTART_MARK = {"hosts": ": restart ", "slurm": "requeueing the job"}  # the supervisor's / the launcher's line


def healed_by(launcher: str, restarts: int, restart_line: str | None, replaced: bool, trained_again: bool,
              end: str, cause: str | None) -> str:
    """What brought the run back to training after a fault, in a few words: a restart by the supervisor (hosts) or a
    requeue (slurm: the launcher's own, after its watch saw Ray lose a node, or Slurm's, after it called a node DOWN),
    slime's fault tolerance (a new engine in the hung one's slot), or the client's retries (no restart, no new
    engine: the job went on); "never" with how the run ended when it did not train again."""
    if not trained_again:
        return f"never: {end}" + (f"; {cause}" if cause else "")
    if restarts:
        if launcher == "hosts":
            return "a restart by the MAX_RESTARTS supervisor"
        if restart_line:
            return "a requeue by the launcher (its cluster watch named the node Ray lost: scontrol requeue)"
        return "a requeue by Slurm (the node DOWN; no requeue line of the launcher's)"
    if replaced:
        return "slime's fault tolerance (a new engine in the hung one's slot; no restart)"
    return "the client's retries (no restart, no new engine: the job went on)"


def own_line(line: str) -> bool:
    """A line of the launcher's (slurm.py), the supervisor's or the stage script's, not Slurm's or Ray's."""
    return line.startswith(("slurm: ", "train_grpo.sh: "))


def cause_of(lines: list[str]) -> str | None:
    """The one line that says why a run ended badly: the launcher's or the stage script's own last error or verdict
    (Slurm's srun and slurmstepd print error lines at every teardown: they come last), else any error line."""
    own = [line.strip() for line in lines if own_line(line)
           and ("error:" in line or "the stage ended with status" in line or "it ends here" in line)]
    said = own or [line.strip() for line in lines if "error:" in line]
    return said[-1] if said else None


def per_fault(run: dict) -> list[dict]:
    """For each fault: the last checkpoint before it, the rollouts lost (trained before it and again after), the
    time to the next trained rollout, the job starts in between, and what healed it."""
    events, rows = run["events"], []
    mark = RESTART_MARK[run["launcher"]]
    cause = None if run["ok"] else cause_of([line for _, line in run["lines"]])
    for fault in run["injected"]:
        t = fault["time"]
        saved = [e["rollout"] for e in events if e["event"] == "saved" and e["time"] < t]
        before = {e["rollout"] for e in events if e["event"] == "trained" and e["time"] < t}
        after = [e for e in events if e["event"] == "trained" and e["time"] > t]
        lost = sorted(before & {e["rollout"] for e in after})
        until = after[0]["time"] if after else float("inf")
        restarts = len([e for e in events if e["event"] == "job" and t < e["time"] < until])
        line = next((line for at, line in run["lines"] if t < at < until and mark in line), None)
        # Slurm's part of a requeue: from the fault until Slurm runs the job again (one more restart counted)
        again = next((at for at, state, count, *_nodes in run.get("slurm_states", []) if at > t
                      and state == "RUNNING" and count.isdigit() and int(count) > fault.get("slurm_restarts", 0)), None)
        rows.append({**fault, "checkpoint": saved[-1] if saved else None, "lost": lost,
                     "to_training_s": (after[0]["time"] - t) if after else None, "restarts": restarts,
                     "restart_line": line, "running_again_s": None if again is None or again > until else again - t,
                     "healed_by": healed_by(run["launcher"], restarts, line, "replaced_after_s" in fault, bool(after),
                                            run["end"], cause)})
    return rows


def summary(run: dict, rollouts: int) -> str:
    trained = [e["rollout"] for e in run["events"] if e["event"] == "trained"]
    jobs = len([e for e in run["events"] if e["event"] == "job"])
    kind = "faulted" if run["faults"] else "fault-free"
    return (f"{kind}: {run['end']}, {run['wall_s']:.0f} s, {len(set(trained))} of {rollouts} rollouts trained "
            f"({len(trained) - len(set(trained))} trained again after a restart), {jobs} job start(s); "
            f"left on the hosts: {run['left'] if any(run['left'].values()) else 'nothing'}")


def report(clean: dict, faulted: dict, rollouts: int, save_interval: int) -> str:
    lines = [f"launcher: {faulted['launcher']}"]
    for run in (clean, faulted):
        lines.append(summary(run, rollouts))
        if run.get("job_error"):
            lines.append(f"  the job's own error (its report): {run['job_error']}")
        if not run["ok"]:
            lines.append("  its last lines:\n    " + "\n    ".join(line for _, line in run["lines"][-30:]))
    ratio = faulted["wall_s"] / clean["wall_s"]
    lines.append(f"wall-time ratio, faulted / fault-free: {ratio:.2f}" +
                 ("" if faulted["ok"] else " (the faulted run did not end by itself: not a goodput figure)"))
    lines.append("")
    lines.append(f"| fault | in rollout | last checkpoint before it | rollouts lost (at most {save_interval - 1} + the "
                 "one in flight) | fault to training again | restarts | healed by |")
    lines.append("|---|---|---|---|---|---|---|")
    for row in per_fault(faulted):
        to = f"{row['to_training_s']:.0f} s" if row["to_training_s"] is not None else "never"
        if row["running_again_s"] is not None:
            to += f" (the job running again after {row['running_again_s']:.0f} s)"
        if "replaced_after_s" in row:
            to += f" (a new engine in its slot after {row['replaced_after_s']:.0f} s)"
        lines.append(f"| {row['fault']} | {row['rollout']} | {row['checkpoint']} | {len(row['lost'])} "
                     f"{row['lost'] or ''} | {to} | {row['restarts']} | {row['healed_by']} |")
    lines.append("")
    mark = RESTART_MARK[faulted["launcher"]]
    lines.extend(f"  {line}" for _, line in faulted["lines"] if own_line(line) and (
        mark in line or "error:" in line or "got signal" in line))
    if faulted.get("slurm_states"):
        lines.append("the job as Slurm saw it (seconds from the first look, just after the submission: state, Restarts, "
                     "nodes; each node's state)")
        lines.extend(f"  {at - faulted['slurm_states'][0][0]:5.0f} s {state} {count} {nodes}"
                     + (f"; {' '.join(f'{n.rsplit(chr(45), 1)[-1]} {v}' for n, v in rest[0].items())}" if rest else "")
                     for at, state, count, nodes, *rest in faulted["slurm_states"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launcher", choices=sorted(RUNS), default="hosts",
                        help="hosts: MAX_RESTARTS on a hostfile cluster (default); slurm: scripts/slurm.sh's requeue")
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts per run (more than the last fault's)")
    parser.add_argument("--save-interval", type=int, default=2, help="a checkpoint every N rollouts (default 2)")
    parser.add_argument("--faults", type=int, default=len(SCHEDULE),
                        help=f"only the schedule's first N faults (default all {len(SCHEDULE)}; for short tries)")
    parser.add_argument("--out", type=Path, default=None, help="also write both runs' records as JSON here")
    parser.add_argument("--report", type=Path, default=None, help="only print the figures of an earlier --out")
    args = parser.parse_args(argv)
    if args.report:
        runs = json.loads(args.report.read_text())
        print(report(runs["clean"], runs["faulted"], args.rollouts, args.save_interval))
        return 0
    schedule = SCHEDULE[:args.faults]
    if not 1 <= args.faults <= len(SCHEDULE):
        print(f"error: --faults {args.faults}: 1 to {len(SCHEDULE)}", file=sys.stderr)
        return 1
    if args.rollouts <= schedule[-1][0]:
        print(f"error: --rollouts {args.rollouts}: the schedule's last fault is in rollout {schedule[-1][0]}",
              file=sys.stderr)
        return 1
    if args.launcher == "slurm":
        from support.slurm import unavailable
    else:
        from support.hosts import unavailable
    if (why := unavailable()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer

    with tempfile.TemporaryDirectory(prefix="goodput") as tmp:
        base = Path(tmp)
        tokenizer = train_small_tokenizer(domain_corpus(["mock"]), base / "tokenizer")
        tiny = build_tiny_qwen3(base / "tiny", tokenizer)
        clean = one_run(args.launcher, base, tiny, args.rollouts, args.save_interval, None)
        faulted = one_run(args.launcher, base, tiny, args.rollouts, args.save_interval, schedule)
    if args.out:
        args.out.write_text(json.dumps({"clean": clean, "faulted": faulted}, indent=1))
    print(report(clean, faulted, args.rollouts, args.save_interval))
    whole = all(run["ok"] and not run.get("job_error") and {e["rollout"] for e in run["events"]
                if e["event"] == "trained"} == set(range(args.rollouts)) for run in (clean, faulted))
    return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
