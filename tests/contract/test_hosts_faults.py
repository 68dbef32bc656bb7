"""Faults on separate hosts: what a real cluster does to a multi-node run, done to namespaced hosts, and what the stage
script makes of each (tests/support/hosts.py; the cluster of test_hosts_cluster.py, 2 hosts x 1 Ray GPU,
sync GRPO, the user simulator on the head).

The same command, `bash scripts/train_grpo.sh`, is run again and again on the head, as a user reruns it after a
failure; each run meets one fault, and the next run is the rerun that must resume:

1. a worker's link cut (`ip link set eth0 down`) while a rollout is under way;
2. a worker's raylet killed (SIGKILL) while a rollout is under way;
3. the head's Ray killed (SIGKILL of its gcs_server and raylet) while a rollout is under way;
4. the shared storage full (a file written to the end of its filesystem) while a rollout is under way;
5. the user simulator killed (SIGKILL) while a rollout is under way;
6. ssh refused by the worker (its authorized_keys without the run's key);
7. the worker without the shared storage (an empty directory of its own at the shared path);
8. the worker's interface under another name than GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME say (ens5, not eth0);
9. nothing: the run ends by itself.

Each fault run must end non-zero with one line naming the host, or, where the job itself fails (4, 5), the cause and
what to do; the job (hosts_job.py, failing as slime's train.py does) must have failed of that cause, and the run that
meets no fault must have run to its end (a test checks that this check fails on the runs whose job failed). Nothing
of the run may stay on any host: the script's EXIT trap stops Ray over ssh where it can, and the worker's own leash
(scripts/cluster_watch.sh) stops a worker that cannot be reached, within RAY_HEAD_LOST_TIMEOUT and its knock's
granularity. Each rerun starts at the rollout after the last checkpointed one (slime's rule, as hosts_job.py applies
it to the tracker Megatron's reader reads). The times (fault to line, fault to exit, exit to every host clean, the
leash) are printed, for docs/hardening.md. Part of the hosts tier (CI's own step, TAU2_HOSTS_TIER=1).

The shared directory is a tmpfs of its own (SHARED_SIZE) so that it can fill; the job's progress and report go to
the head's own /tmp, which a full shared storage leaves writable.
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
from support.full_storage import fill, small_filesystem
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
LEASH_GRAIN_S = 4  # the leash knocks every second (each given 2 s) and counts bash's whole SECONDS
RAY_STOP_S = 8  # `ray stop --force` on a loaded 2-core host: the ray command's start-up, then its kills
SHARED_SIZE = "64m"  # the tiny model, the checkpoints' stand-ins and the logs take a few MB
RUN_LIMIT_S = 900  # one run of the script, fault included, on a loaded 2-core machine
CLEAN_LIMIT_S = HEAD_LOST_S + 120  # after the script's exit, until no host holds anything of the run


class Run:
    """One run of train_grpo.sh on the head: its stderr lines with their times, its exit, and the job's progress
    (`progress`: where this machine sees the file the job writes on the head)."""

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


class Leash:
    """From a fault on, the cut-off worker's Ray as its leash ends it: when its raylet was gone, in seconds after the
    fault (None: not gone before the run and its clean-up ended), looked at every half second."""

    def __init__(self, hosts: hosts_mod.Hosts, worker: int) -> None:
        self.hosts, self.worker, self.started = hosts, worker, time.monotonic()
        self.gone_s: float | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set() and self.gone_s is None:
            procs = [p.split() for p in self.hosts.processes(self.worker)]
            if not any(p and p[0].endswith("raylet") for p in procs):
                self.gone_s = time.monotonic() - self.started
            time.sleep(0.5)

    def finish(self) -> dict:
        self._done.set()
        self._thread.join(timeout=30)
        return {"worker_ray_gone_s": self.gone_s}


def user_sim_pids(hosts: hosts_mod.Hosts) -> list[str]:
    """The user simulator's process on the head (by its module name, in the head's own process table)."""
    found = hosts.hosts[0].run(["pgrep", "-f", "support.loopback_server"], capture_output=True, text=True)
    return found.stdout.split()


FAULTS = ["link cut", "raylet killed", "head's Ray killed", "storage full", "user simulator killed", "ssh refused",
          "no shared storage", "wrong interface", "none"]
JOB_FAULTS = ("storage full", "user simulator killed")  # the job fails by itself: no node is lost
LEASHED = ("link cut", "head's Ray killed")  # the worker is cut off from the head's Ray: its leash stops its Ray


def selected_faults(session: pytest.Session) -> list[str]:
    """The faults the selected tests of this module look at (every test here takes a `fault`), in FAULTS' order:
    `-k` picks the runs made, as a whole module takes 6-15 minutes."""
    wanted = {item.callspec.params["fault"] for item in session.items
              if Path(str(item.fspath)) == Path(__file__) and hasattr(item, "callspec")}
    return [f for f in FAULTS if f in wanted]


@pytest.fixture(scope="module")
def faults(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           tiny_small_dir: Path) -> Iterator[dict]:
    base = tmp_path_factory.mktemp("hostsfaults")
    with small_filesystem(base / "shared", SHARED_SIZE) as shared:
        yield from _fault_runs(base, shared, tiny_small_dir, selected_faults(request.session))


def _fault_runs(base: Path, shared: Path, tiny_small_dir: Path, chosen: list[str]) -> Iterator[dict]:
    shared_inputs(shared, tiny_small_dir, 1)
    hosts = hosts_mod.Hosts(2, shared, run_id=f"t2h{os.getpid()}xf", session_env={
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_OVERRIDE_RESOURCES": '{"CPU": 16}'})
    hosts.up()
    head, worker = hosts.addresses
    results: dict[str, dict] = {}
    try:
        (shared / "hostfile").write_text(f"{head} slots=1\n{worker} slots=1\n")
        progress = hosts.base / "h0/tmp/progress.jsonl"  # the head's own /tmp, as this machine sees it
        env = {**stage_env(shared, hosts, "2", 1), "HOSTS_JOB_MORE": "", "HOSTS_JOB_OUT": "/tmp/job.json",
               "HOSTS_JOB_PROGRESS": "/tmp/progress.jsonl", "GRPO_SAVE_INTERVAL": "1", "TRAIN_TP": "1",
               "RAY_HEAD_LOST_TIMEOUT": str(HEAD_LOST_S), "TAU2_USER_API_BASE": f"http://{head}:{USER_SIM_PORT}/v1"}
        user_sim_logs = iter(base / f"user_sim.{i}.log" for i in range(10))  # not on the storage that fills
        start_user_sim(hosts, hosts.hosts[0], env, shared, next(user_sim_logs))
        filler: list[Path] = []

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
            "storage full": (lambda: filler.append(fill(shared)), lambda: filler.pop().unlink()),
            "user simulator killed": (
                lambda: hosts.hosts[0].run(["kill", "-9", *user_sim_pids(hosts)], check=True),
                lambda: start_user_sim(hosts, hosts.hosts[0], env, shared, next(user_sim_logs))),
        }
        before_job = {
            "ssh refused": (lambda: hosts.refuse_ssh(1, refused=True), lambda: hosts.refuse_ssh(1, refused=False)),
            "no shared storage": (lambda: hosts.hide_shared(1, hidden=True),
                                  lambda: hosts.hide_shared(1, hidden=False)),
            "wrong interface": (lambda: hosts.rename_interface(1, "eth0", "ens5"),
                                lambda: hosts.rename_interface(1, "ens5", "eth0")),
        }
        for fault in chosen:
            progress.unlink(missing_ok=True)
            checkpointed = tracker(shared)
            inject, undo = during_job.get(fault) or before_job.get(fault) or (None, None)
            if fault in before_job:
                inject()
            # a fault in the job meets a job that goes on (as a real run of 200 rollouts); the last run ends by itself
            run = Run(hosts, {**env, "HOSTS_JOB_ROLLOUTS": "50" if fault in during_job else "2"}, progress)
            record: dict = {"checkpointed_before": checkpointed}
            leash = None
            if fault in during_job:
                assert mid_rollout(run), "\n".join(line for _, line in run.lines[-40:])
                record["fault_at_rollout"] = [e["rollout"] for e in run.events() if e["event"] == "rollout"][-1]
                t_fault = time.monotonic()
                leash = Leash(hosts, 1) if fault in LEASHED else None
                inject()
            else:
                t_fault = run.started
            t_exit = run.finish()
            error = run.first(r"train_grpo\.sh: error: ")
            events = run.events()
            failed = next((e for e in events if e["event"] == "failed"), None)
            wall = time.time() - time.monotonic()  # the job's events carry the head's time.time(): this clock's
            record.update(job_failed_to_line_s=error[0] + wall - failed["time"] if error and failed else None)
            record.update(rc=run.proc.returncode, error=error[1] if error else None,
                          to_line_s=(error[0] - t_fault) if error else None, to_exit_s=t_exit - t_fault,
                          start_rollout=next((e["rollout"] for e in events if e["event"] == "rollout"), None),
                          job_failed=failed["error"] if failed else None,
                          stderr=[line for _, line in run.lines][-40:])
            record.update(until_clean(hosts, CLEAN_LIMIT_S))
            if leash:
                record.update(leash.finish())
            if undo:
                undo()
            record["checkpointed_after"] = tracker(shared)
            results[fault] = record
            print(f"\nfault {fault!r}: rc {record['rc']}, line after {record['to_line_s']} s, exit after "
                  f"{record['to_exit_s']:.0f} s, clean after {record['clean_after_s']}, started at rollout "
                  f"{record['start_rollout']} (checkpointed {checkpointed}), the worker's Ray gone after "
                  f"{record.get('worker_ray_gone_s')} s, job: {record['job_failed']}: {record['error']}")
        yield {"hosts": hosts, "results": results, "head": head, "worker": worker}
    finally:
        hosts.down()
        (base / "faults.json").write_text(json.dumps(results, indent=1))
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
JOB_LINE = {  # the job failed by itself (cluster/job_failure.py): the cause, what to do, no node named
    "storage full": r"error: the job could not write [^:]*: no space left on its device \(ENOSPC\); free space .* "
                    r"then run the same command again: it resumes from the last checkpoint$",
    "user simulator killed": r"error: the user simulator at http://{head}:30001/v1 stopped answering: most episodes "
                             r"aborted \(user simulator failed: .*\); start it again .* then run the same command again",
}
JOB_ERROR = {  # what the job itself died of (its exception's last line, as hosts_job.py reports it)
    "storage full": r"\[Errno 28\] No space left on device",
    "user simulator killed": r"AbortStorm.*stopping: \d+ windows in a row .* first error: user simulator failed",
}


@pytest.mark.parametrize("fault", list(EXPECTED_LINE))
def test_the_fault_stops_the_run_with_one_line_naming_the_host(faults: dict, fault: str) -> None:
    record = faults["results"][fault]
    pattern = EXPECTED_LINE[fault].format(worker=re.escape(faults["worker"]), head=re.escape(faults["head"]))
    assert record["rc"] != 0 and record["error"] and re.search(pattern, record["error"]), record["stderr"]
    # before it, the job's own dying words (a traceback, should its driver see the node's loss first, as slime's
    # train.py would print it); after it, only the cluster stop's notes
    after = record["stderr"][record["stderr"].index(record["error"]) + 1:]
    assert not [line for line in after if "error" in line or "Traceback" in line], after
    if fault == "link cut":  # the head cannot stop the cut worker's Ray over ssh, and says who will
        assert any(f"warning: ray stop on worker {faults['worker']} failed: its leash stops its Ray" in line
                   for line in after), after


@pytest.mark.parametrize("fault", JOB_FAULTS)
def test_a_job_that_fails_by_itself_ends_the_run_with_one_line_naming_why(faults: dict, fault: str) -> None:
    record = faults["results"][fault]
    assert record["job_failed"] and re.search(JOB_ERROR[fault], record["job_failed"]), record
    pattern = JOB_LINE[fault].format(head=re.escape(faults["head"]))
    assert record["rc"] != 0 and record["error"] and re.search(pattern, record["error"]), record["stderr"]
    # the job's own traceback comes before it (as slime's log would); after it, only the cluster stop's notes
    after = record["stderr"][record["stderr"].index(record["error"]) + 1:]
    assert not [line for line in after if "error" in line.lower() or "Traceback" in line], after
    assert record["job_failed_to_line_s"] < HEAD_LOST_S, record  # no wait for a node's loss that is not coming


def ran_to_the_end(record: dict) -> None:
    """The run that meets no fault: its job ran its rollouts, each checkpointed, and the script ended 0."""
    assert record["rc"] == 0 and record["error"] is None and record["job_failed"] is None, record["stderr"]
    assert record["checkpointed_after"] == record["start_rollout"] + 1  # HOSTS_JOB_ROLLOUTS=2, each saved


@pytest.mark.parametrize("fault", ["none"])
def test_the_run_without_a_fault_runs_to_its_end(faults: dict, fault: str) -> None:
    ran_to_the_end(faults["results"][fault])


@pytest.mark.parametrize("fault", JOB_FAULTS)
def test_the_tier_fails_a_run_whose_job_failed(faults: dict, fault: str) -> None:
    """The check of the run that meets no fault, on the runs whose job failed: it must fail (hosts_job.py once caught
    the rollout's exception into its report and exited 0, and a job that died of a full disk passed as a success)."""
    with pytest.raises(AssertionError):
        ran_to_the_end(faults["results"][fault])


@pytest.mark.parametrize("fault", LEASHED)
def test_a_cut_off_workers_leash_stops_its_ray_within_the_limit(faults: dict, fault: str) -> None:
    """The head was last heard before the fault: the leash starts its stop within RAY_HEAD_LOST_TIMEOUT and its
    knock's granularity of it, and `ray stop --force` takes the rest (its start-up, on a loaded machine)."""
    gone = faults["results"][fault]["worker_ray_gone_s"]
    assert gone is not None and gone <= HEAD_LOST_S + LEASH_GRAIN_S + RAY_STOP_S, faults["results"][fault]


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
        ran_to_the_end(record)
    else:
        # the fault landed in a rollout after a checkpointed one: some progress kept, none run twice
        assert record["checkpointed_after"] is not None and record["checkpointed_after"] >= record["start_rollout"]
        assert record["fault_at_rollout"] >= record["start_rollout"] + 1
