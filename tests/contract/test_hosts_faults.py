"""Faults on separate hosts: what a real cluster does to a multi-node run, done to namespaced hosts, and what the stage
script makes of each (tests/support/hosts.py; the cluster of test_hosts_cluster.py, 2 hosts x 1 Ray GPU,
sync GRPO, the user simulator on the head).

The same command, `bash scripts/train_grpo.sh`, is run again and again on the head, as a user reruns it after a
failure; each run meets one fault, and the next run is the rerun that must resume:

1. a worker's link cut (`ip link set eth0 down`) while a rollout is under way;
2. a worker's raylet killed (SIGKILL) while a rollout is under way;
3. the head's Ray killed (SIGKILL of its gcs_server and raylet) while a rollout is under way;
4. ssh refused by the worker (its authorized_keys without the run's key);
5. the worker without the shared storage (an empty directory of its own at the shared path);
6. the worker's interface under another name than GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME say (ens5, not eth0);
7. nothing: the run ends by itself.

Each fault run must end non-zero with one line naming the host, and nothing of the run may stay on any host: the
script's EXIT trap stops Ray over ssh where it can, and the worker's own leash (scripts/cluster_watch.sh) stops a
worker that cannot be reached. Each rerun starts at the rollout after the last checkpointed one (slime's rule, as
hosts_job.py applies it to the tracker Megatron's reader reads). The times (fault to line, fault to exit, exit to
every host clean) are printed, for docs/hardening.md. Part of the hosts tier (CI's own step, TAU2_HOSTS_TIER=1).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import hosts as hosts_mod
from test_hosts_cluster import (
    SYSTEM_PATH,
    USER_SIM_PORT,
    WHY_NOT,
    shared_inputs,
    stage_env,
    start_user_sim,
)
from test_scripts import ROOT

pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaced hosts tier skipped: {WHY_NOT}"),
              pytest.mark.timeout(3600)]

HEAD_LOST_S = 20  # RAY_HEAD_LOST_TIMEOUT for these runs (the default is 60): how long a cut-off worker keeps Ray
RUN_LIMIT_S = 900  # one run of the script, fault included, on a loaded 2-core machine
CLEAN_LIMIT_S = HEAD_LOST_S + 120  # after the script's exit, until no host holds anything of the run


class Run:
    """One run of train_grpo.sh on the head: its stderr lines with their times, its exit, and the job's progress."""

    def __init__(self, hosts: hosts_mod.Hosts, env: dict[str, str], progress: Path) -> None:
        self.progress = progress
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        self.proc = hosts.hosts[0].popen(["bash", str(ROOT / "scripts" / "train_grpo.sh")], env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                         cwd=env["HOME"])
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def events(self) -> list[dict]:
        if not self.progress.exists():
            return []
        return [json.loads(line) for line in self.progress.read_text().splitlines() if line.strip()]

    def wait_for(self, what: Callable[[list[dict]], bool], limit_s: float) -> bool:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if what(self.events()):
                return True
            time.sleep(0.2)
        return what(self.events())

    def finish(self) -> float:
        self.proc.wait(timeout=RUN_LIMIT_S)
        self.reader.join(timeout=30)
        return time.monotonic()

    def first(self, pattern: str) -> tuple[float, str] | None:
        return next(((t, line) for t, line in self.lines if re.search(pattern, line)), None)


def tracker(shared: Path) -> int | None:
    path = shared / "out/checkpoints/grpo/latest_checkpointed_iteration.txt"
    return int(path.read_text()) if path.exists() else None


def run_of(hosts: hosts_mod.Hosts, i: int) -> list[str]:
    """What of the run host i still holds: every process but its sshd and, on the head, the user simulator."""
    return [p for p in hosts.processes(i) if "loopback_server" not in p]


def until_clean(hosts: hosts_mod.Hosts, limit_s: float) -> dict:
    """From now until no host holds anything of the run: what each held at first, and when each was clean."""
    start = time.monotonic()
    at_exit = {h.address: run_of(hosts, h.index) for h in hosts.hosts}
    clean_after: dict[str, float | None] = {a: (0.0 if not p else None) for a, p in at_exit.items()}
    while None in clean_after.values() and time.monotonic() - start < limit_s:
        time.sleep(1)
        for h in hosts.hosts:
            if clean_after[h.address] is None and not run_of(hosts, h.index):
                clean_after[h.address] = time.monotonic() - start
    return {"at_exit": at_exit, "clean_after_s": clean_after,
            "left": {h.address: run_of(hosts, h.index) for h in hosts.hosts}}


FAULTS = ["link cut", "raylet killed", "head's Ray killed", "ssh refused", "no shared storage", "wrong interface",
          "none"]


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory, tiny_small_dir: Path) -> Iterator[dict]:
    shared = tmp_path_factory.mktemp("hostsfaults") / "shared"
    shared_inputs(shared, tiny_small_dir, 1)
    hosts = hosts_mod.Hosts(2, shared, run_id=f"t2h{os.getpid()}xf", session_env={
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_OVERRIDE_RESOURCES": '{"CPU": 16}'})
    hosts.up()
    head, worker = hosts.addresses
    results: dict[str, dict] = {}
    try:
        (shared / "hostfile").write_text(f"{head} slots=1\n{worker} slots=1\n")
        progress = shared / "progress.jsonl"
        env = {**stage_env(shared, hosts, "2", 1), "HOSTS_JOB_MORE": "",
               "HOSTS_JOB_PROGRESS": str(progress), "GRPO_SAVE_INTERVAL": "1", "TRAIN_TP": "1",
               "RAY_HEAD_LOST_TIMEOUT": str(HEAD_LOST_S), "TAU2_USER_API_BASE": f"http://{head}:{USER_SIM_PORT}/v1"}
        start_user_sim(hosts, hosts.hosts[0], env, shared)

        def mid_rollout(run: Run) -> bool:
            """Once the job is in its second rollout (the first one checkpointed): the fault lands in a rollout."""
            def second(events: list[dict]) -> bool:
                rollouts = [e["rollout"] for e in events if e["event"] == "rollout"]
                return len(rollouts) >= 2
            return run.wait_for(second, RUN_LIMIT_S)

        during_job = {
            "link cut": (lambda: hosts.set_link(1, up=False), lambda: hosts.set_link(1, up=True)),
            "raylet killed": (lambda: hosts.kill(1, "raylet"), lambda: None),
            "head's Ray killed": (lambda: hosts.kill(0, "gcs_server", "raylet"), lambda: None),
        }
        before_job = {
            "ssh refused": (lambda: hosts.refuse_ssh(1, refused=True), lambda: hosts.refuse_ssh(1, refused=False)),
            "no shared storage": (lambda: hosts.hide_shared(1, hidden=True),
                                  lambda: hosts.hide_shared(1, hidden=False)),
            "wrong interface": (lambda: hosts.rename_interface(1, "eth0", "ens5"),
                                lambda: hosts.rename_interface(1, "ens5", "eth0")),
        }
        for fault in FAULTS:
            progress.unlink(missing_ok=True)
            checkpointed = tracker(shared)
            inject, undo = during_job.get(fault) or before_job.get(fault) or (None, None)
            if fault in before_job:
                inject()
            # a fault in the job meets a job that goes on (as a real run of 200 rollouts); the last run ends by itself
            run = Run(hosts, {**env, "HOSTS_JOB_ROLLOUTS": "50" if fault in during_job else "2"}, progress)
            record: dict = {"checkpointed_before": checkpointed}
            if fault in during_job:
                assert mid_rollout(run), "\n".join(line for _, line in run.lines[-40:])
                record["fault_at_rollout"] = [e["rollout"] for e in run.events() if e["event"] == "rollout"][-1]
                t_fault = time.monotonic()
                inject()
            else:
                t_fault = run.started
            t_exit = run.finish()
            error = run.first(r"train_grpo\.sh: error: ")
            record.update(rc=run.proc.returncode, error=error[1] if error else None,
                          to_line_s=(error[0] - t_fault) if error else None, to_exit_s=t_exit - t_fault,
                          start_rollout=next((e["rollout"] for e in run.events() if e["event"] == "rollout"), None),
                          stderr=[line for _, line in run.lines][-40:])
            record.update(until_clean(hosts, CLEAN_LIMIT_S))
            if undo:
                undo()
            record["checkpointed_after"] = tracker(shared)
            results[fault] = record
            print(f"\nfault {fault!r}: rc {record['rc']}, line after {record['to_line_s']} s, exit after "
                  f"{record['to_exit_s']:.0f} s, clean after {record['clean_after_s']}, started at rollout "
                  f"{record['start_rollout']} (checkpointed {checkpointed}): {record['error']}")
        yield {"hosts": hosts, "results": results, "head": head, "worker": worker}
    finally:
        hosts.down()
        (shared.parent / "faults.json").write_text(json.dumps(results, indent=1))
        left = hosts.leftovers()
        assert not any(left.values()), left


EXPECTED_LINE = {
    "link cut": r"error: worker {worker} left the Ray cluster during the job \(Ray marked its node dead: .*health",
    "raylet killed": r"error: worker {worker} left the Ray cluster during the job \(Ray marked its node dead",
    "head's Ray killed": r"error: the head {head}: its Ray \(GCS {head}:6379\) stopped answering during the job",
    "ssh refused": r"error: worker {worker} \(HOSTFILE\) is not reachable over ssh .*Permission denied",
    "no shared storage": r"error: cluster check failed: node {worker} does not see .*\.tau2-shared-check",
    "wrong interface": r"error: cluster check failed: node {worker}: \w+_SOCKET_IFNAME=eth0 .*ens5",
}


@pytest.mark.parametrize("fault", list(EXPECTED_LINE))
def test_the_fault_stops_the_run_with_one_line_naming_the_host(faults: dict, fault: str) -> None:
    record = faults["results"][fault]
    pattern = EXPECTED_LINE[fault].format(worker=re.escape(faults["worker"]), head=re.escape(faults["head"]))
    assert record["rc"] != 0 and record["error"] and re.search(pattern, record["error"]), record["stderr"]
    assert not [line for line in record["stderr"] if "Traceback" in line]
    after = record["stderr"][record["stderr"].index(record["error"]) + 1:]
    assert not [line for line in after if "error" in line], after  # only the cluster stop's notes follow
    if fault == "link cut":  # the head cannot stop the cut worker's Ray over ssh, and says who will
        assert any(f"warning: ray stop on worker {faults['worker']} failed: its leash stops its Ray" in line
                   for line in after), after


@pytest.mark.parametrize("fault", FAULTS)
def test_nothing_of_the_run_stays_on_any_host(faults: dict, fault: str) -> None:
    record = faults["results"][fault]
    assert not any(record["left"].values()), record
    assert all(t is not None for t in record["clean_after_s"].values()), record


@pytest.mark.parametrize("fault", FAULTS)
def test_each_run_starts_after_the_last_checkpointed_rollout(faults: dict, fault: str) -> None:
    record = faults["results"][fault]
    if fault in ("ssh refused", "no shared storage", "wrong interface"):
        # stopped before the job: nothing ran, the checkpoint is as it was
        assert record["start_rollout"] is None and record["checkpointed_after"] == record["checkpointed_before"]
        return
    before = record["checkpointed_before"]
    assert record["start_rollout"] == (0 if before is None else before + 1), record
    if fault == "none":
        assert record["rc"] == 0, record["stderr"]
        assert record["checkpointed_after"] == record["start_rollout"] + 1  # HOSTS_JOB_ROLLOUTS=2, each saved
    else:
        # the fault landed in a rollout after a checkpointed one: some progress kept, none run twice
        assert record["checkpointed_after"] is not None and record["checkpointed_after"] >= record["start_rollout"]
        assert record["fault_at_rollout"] >= record["start_rollout"] + 1
