"""The Slurm launcher on a real Slurm: slurmctld, slurmd and munge from the OS's packages on namespaced hosts
(tests/support/slurm.py): a controller host (the user simulator beside it) and three compute nodes with two fake
GPUs each (gres).

One job, as a user submits it: `bash scripts/slurm.sh --nodes 2 --gpus-per-node 2 ... train_grpo.sh` on the
controller host. In the allocation the launcher starts a Ray head on the first node and a worker on the second (srun),
and the unchanged train_grpo.sh joins them through RAY_ADDRESS. Its `ray job submit`s run on the head as Ray's jobs
API would run them (ray_job_double.py: the contract venv's minimal Ray has no jobs API): the cluster check as it is,
slime's train.py as hosts_job.py (test_hosts_cluster.py's job driver: slime's own
parse_args, placement groups, RolloutManager and engine address allocation, an SGLang double bound at the address
slime gave each engine, rollouts through the project's custom generate, a checkpoint per rollout). Twice, once the
run is in its second rollout, its second node meets a fault: first its link is cut (Slurm calls the node DOWN and
requeues the job, or the launcher's watch sees Ray lose the node first and requeues it itself), then, in the requeued
run, its raylet is killed (a node Slurm still calls fine: the launcher's watch names it and requeues the job). Each
time the job runs again with no person, on nodes that answer, on Ray ports of its own, and starts at the checkpointed
rollout + 1; the last run ends by itself, every rollout checkpointed once. Then nothing of the job is left on any
host. The time from each fault to training again is printed.

Its own step, as the hosts tier (CI runs it): TAU2_SLURM_TIER=1 TAU2_TEST_WORKERS=0 bash scripts/test.sh
tests/contract/test_slurm_tier.py. Needs root and `apt-get install slurm-wlm munge`; skipped in one line otherwise.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import slurm as slurm_mod
from test_hosts_cluster import SYSTEM_PATH, USER_SIM_PORT, check_engines, shared_inputs, stage_env, start_user_sim
from test_scripts import ROOT
from third_party import third_party_path

from tau2_rl_pipeline.cluster.slurm import expand_nodelist

TIER = "tests/contract/test_slurm_tier.py"
WHY_NOT = slurm_mod.unavailable() or (None if os.environ.get("TAU2_SLURM_TIER") == "1" else
                                      f"its own step: TAU2_SLURM_TIER=1 TAU2_TEST_WORKERS=0 bash scripts/test.sh {TIER} "
                                      "(CI runs it)")
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1800),
              pytest.mark.skipif(WHY_NOT is not None, reason=f"Slurm tier skipped: {WHY_NOT}")]

ROLLOUTS_PER_RUN = 4  # HOSTS_JOB_ROLLOUTS: the last run trains this many after the checkpoint, then ends
# What happens to the job's second node, once in each run but the last: its link cut (Slurm calls it DOWN and requeues
# the job, or the launcher's watch sees Ray lose it first and requeues it), then its raylet killed (the node is fine:
# Ray loses it, the launcher's watch names it and the launcher requeues the job).
FAULTS = [("link cut", lambda cluster, i: cluster.set_link(i, up=False)),
          ("raylet killed", lambda cluster, i: cluster.kill(i, "raylet"))]
RUN_LIMIT_S = 900
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")  # a job Slurm will not run again


def shim(bindir: Path) -> None:
    """`ray` as on the nodes, but `ray job submit` runs ray_job_double.py: the contract venv's Ray has no jobs API."""
    real = Path(sys.executable).parent / "ray"
    double = Path(__file__).parent / "ray_job_double.py"
    (bindir / "ray").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = job ] && [ "$2" = submit ]; then shift 2; exec {sys.executable} {double} "$@"; fi\n'
        f'exec {real} "$@"\n')
    (bindir / "ray").chmod(0o755)


def events(progress: Path) -> list[dict]:
    if not progress.exists():
        return []
    return [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]


def wait(what, limit_s: float, step_s: float = 1.0):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(step_s)
    return what()


def cluster_up(shared: Path, tiny_model: Path, run_id: str | None = None) -> slurm_mod.SlurmHosts:
    """The tier's cluster over the run's shared inputs, up: the controller host and three compute nodes with two fake
    GPUs each (one a spare for a requeue), `ray job submit` as ray_job_double.py runs it."""
    shared_inputs(shared, tiny_model, 1)
    shim(shared / "bin")
    cluster = slurm_mod.SlurmHosts(4, shared, gpus=2, slurmd_timeout=20, cred_expire=30, run_id=run_id, session_env={
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "RAY_USAGE_STATS_ENABLED": "0"})
    cluster.up()
    return cluster


def job_env(shared: Path, cluster: slurm_mod.SlurmHosts, progress: Path) -> dict[str, str]:
    """train_grpo.sh's settings for a job of the launcher's on 2 nodes x 1 Ray GPU (the allocation gives the nodes:
    no hostfile), a checkpoint after each rollout, the user simulator on the controller host, the job's progress
    lines in `progress`."""
    env = stage_env(shared, cluster, "2", 1)
    for name in ("HOSTFILE", "MASTER_ADDR", "SLIME_HOST_IP", "RAY_SSH"):
        env.pop(name)
    env.update(cluster.env, HOSTS_JOB_MORE="", HOSTS_JOB_PROGRESS=str(progress), GRPO_SAVE_INTERVAL="1",
               TRAIN_TP="1", HOSTS_JOB_ROLLOUTS=str(ROLLOUTS_PER_RUN),
               TAU2_USER_API_BASE=f"http://{cluster.hosts[0].address}:{USER_SIM_PORT}/v1",
               TAU2_THIRD_PARTY=str(third_party_path()),  # the job driver's slime, wherever this checkout is
               # the hosts share one machine's memory: each host's Ray would count the others' (and whatever else
               # runs here) as its own and kill the job's workers near 95% of it
               RAY_memory_monitor_refresh_ms="0")
    return env


def submit(cluster: slurm_mod.SlurmHosts, env: dict[str, str], out_dir: Path, *options: str,
           time_limit: str = "60") -> tuple[str, str, Path]:
    """`bash scripts/slurm.sh --nodes 2 --gpus-per-node 2 ... train_grpo.sh` on the controller host, as a user
    submits it: (the job id, what the launcher said, the job's output file)."""
    proc = cluster.hosts[0].run(["bash", str(ROOT / "scripts/slurm.sh"), "--nodes", "2", "--gpus-per-node", "2",
                                 "--time", time_limit, "--output-dir", str(out_dir), *options, "train_grpo.sh"],
                                env=env, capture_output=True, text=True, cwd=env["HOME"], timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/slurm.sh failed: {proc.stderr.strip()}")
    job_id = proc.stdout.strip()
    return job_id, proc.stderr, out_dir / f"tau2-grpo-{job_id}.out"


def ended(cluster: slurm_mod.SlurmHosts, job_id: str) -> dict | None:
    """The job's `scontrol show job` once it is over (COMPLETED, FAILED, ...), else None."""
    job = cluster.job(job_id)
    return job if job.get("JobState") in FINAL_STATES else None


def first_rollout_of_run(progress: Path, run: int) -> dict | None:
    """The first rollout the job's run number `run` (0: the first, 1: the first requeued one, ...) started."""
    evs = events(progress)
    starts = [i for i, e in enumerate(evs) if e["event"] == "job"]
    return next((e for e in evs[starts[run]:] if e["event"] == "rollout"), None) if len(starts) > run else None


def left_of_jobs(cluster: slurm_mod.SlurmHosts) -> tuple[dict[str, list[str]], list[str]]:
    """What each host holds of the job beyond its daemons (the user simulator on the controller is the caller's), and
    the job cgroups still there."""
    left = cluster.leftovers_of_jobs()
    left[cluster.node_name(0)] = [p for p in left[cluster.node_name(0)] if "loopback_server" not in p]
    return left, cluster.job_cgroups()


@pytest.fixture(scope="module")
def requeued(tmp_path_factory: pytest.TempPathFactory, tiny_small_dir: Path) -> Iterator[dict]:
    shared = tmp_path_factory.mktemp("slurmtier") / "shared"
    started = time.monotonic()
    cluster = cluster_up(shared, tiny_small_dir)
    record: dict = {"cluster": cluster, "up_s": time.monotonic() - started}
    try:
        login = cluster.hosts[0]
        progress = shared / "progress.jsonl"
        hold = shared / "hold"  # each faulted run waits at its third rollout until its fault has been acted on
        hold.touch()
        env = {**job_env(shared, cluster, progress), "HOSTS_JOB_HOLD": str(hold)}
        start_user_sim(cluster, login, env, shared)
        job_id, said, output = submit(cluster, env, shared / "slurm")
        record.update(job_id=job_id, submit=said)
        job_out = shared / "job.json"

        def over() -> dict | None:
            return ended(cluster, job_id)

        def why() -> str:
            return ((job_out.read_text()[-3000:] if job_out.exists() else "") +
                    (output.read_text()[-3000:] if output.exists() else str(cluster.job(job_id))))

        record["faults"] = []
        for restart, (fault, inject) in enumerate(FAULTS):
            # once the run is in its second rollout (its first one checkpointed), the fault hits the worker
            def second_rollout(restart=restart) -> bool:
                runs = [i for i, e in enumerate(events(progress)) if e["event"] == "job"]
                return len(runs) > restart and len([e for e in events(progress)[runs[restart]:]
                                                    if e["event"] == "rollout"]) >= 2
            wait(lambda: second_rollout() or over(), RUN_LIMIT_S, 0.5)  # noqa: B023 - called in this iteration
            assert second_rollout(), why()
            nodes = expand_nodelist(cluster.job(job_id)["NodeList"])
            worker = int(nodes[1].rsplit("-h", 1)[1])
            at = {"fault": fault, "nodes": nodes, "worker": nodes[1], "fault_at": time.time()}
            inject(cluster, worker)

            def restarted_and_training(at=at, restart=restart) -> bool:
                if "running_again_at" not in at:  # Slurm's part: the job requeued and started again
                    job = cluster.job(job_id)
                    if job.get("Restarts") == str(restart + 1) and job.get("JobState") == "RUNNING":
                        at["running_again_at"] = time.time()
                return "running_again_at" in at and bool(first_rollout_of_run(progress, restart + 1))
            assert wait(restarted_and_training, RUN_LIMIT_S), why()
            at["training_again_at"] = first_rollout_of_run(progress, restart + 1)["time"]
            at["again_on"] = cluster.job(job_id).get("NodeList")
            if fault == "link cut":
                cluster.set_link(worker, up=True)  # the node comes back later (ReturnToService=2); Slurm cleans it
            record["faults"].append(at)
        hold.unlink()  # the last run trains its rollouts and ends
        record["final"] = wait(over, RUN_LIMIT_S, 2)
        record["output"] = output.read_text()
        record["events"] = events(progress)
        record["report"] = json.loads((shared / "job.json").read_text())[0] if (shared / "job.json").exists() else {}
        t0 = time.monotonic()

        def clean() -> bool:
            record["left"], record["cgroups"] = left_of_jobs(cluster)
            return not any(record["left"].values()) and not record["cgroups"]
        record["clean"] = wait(clean, 240, 2)
        record["cores"] = sorted(str(p) for p in shared.rglob("core*")  # the job's processes that crashed
                                 if p.is_file() and p.name.split(".")[0] == "core")
        record["clean_after_s"] = time.monotonic() - t0
        record["states"] = cluster.states()
        record["address_of"] = {cluster.node_name(h.index): h.address for h in cluster.hosts}
        print(f"\nslurm tier: cluster up in {record['up_s']:.1f} s; every host clean {record['clean_after_s']:.0f} s "
              f"after the job ended; total {time.monotonic() - started:.0f} s")
        for at in record["faults"]:
            print(f"slurm tier: {at['fault']} on {at['worker']} (job on {at['nodes']}): fault to training again "
                  f"{at['training_again_at'] - at['fault_at']:.0f} s: {at['running_again_at'] - at['fault_at']:.0f} s "
                  f"until the job ran again (on {at['again_on']}), {at['training_again_at'] - at['running_again_at']:.0f}"
                  " s from there to its first rollout (Ray, the cluster check, slime's start)")
        yield record
    finally:
        cluster.down()
        left = cluster.leftovers()
        assert not any(left.values()), left
        assert not list(slurm_mod.FREEZER.glob(f"{cluster.run_id}-h*"))


def test_each_fault_requeues_the_job_and_it_ends_by_itself(requeued: dict) -> None:
    final, (cut, killed) = requeued["final"], requeued["faults"]
    assert final and final["JobState"] == "COMPLETED" and final["Restarts"] == "2", (final, requeued["output"][-4000:])
    # the cut-off node is left out: the requeued job runs on the spare one
    again = expand_nodelist(cut["again_on"])
    assert cut["worker"] not in again and len(again) == 2 and cut["nodes"][0] in again, (cut, again)
    out = requeued["output"]
    for restart in range(3):
        assert f"job {requeued['job_id']}, restart {restart} (SLURM_RESTART_COUNT)" in out
    gcs = re.findall(r"GCS port (\d+)", out)
    assert len(gcs) == 3 and len(set(gcs)) == 3, gcs  # each run's Ray on ports of its own
    # the killed raylet: Ray loses a node Slurm still calls fine; the launcher names it and requeues the job itself
    worker_ip = requeued["address_of"][killed["worker"]]
    assert re.search(rf"slurm: worker {re.escape(worker_ip)} left the Ray cluster during the job \(Ray marked its node "
                     r"dead: .*\); requeueing the job \(restart 2 of at most 3\): it resumes from the stage's last "
                     "checkpoint", out), out[-4000:]


def test_each_requeued_run_resumes_at_the_checkpointed_rollout_plus_one(requeued: dict) -> None:
    evs = requeued["events"]
    starts = [e["time"] for e in evs if e["event"] == "job"]
    assert len(starts) == 3, starts  # the first run and two requeued ones
    for at, start in zip(requeued["faults"], starts[1:]):
        # the checkpoint when the job ran again (a fault that spares the rollout in flight lets it finish and save)
        saved_before = [e["rollout"] for e in evs if e["event"] == "saved" and e["time"] < start]
        resumed = [e["rollout"] for e in evs if e["event"] == "rollout" and e["time"] > start]
        assert start > at["fault_at"] and saved_before and resumed[0] == saved_before[-1] + 1, (
            at["fault"], saved_before, resumed)
    # every rollout trained and checkpointed once, none skipped
    saved = [e["rollout"] for e in evs if e["event"] == "saved"]
    last_start = [e["rollout"] for e in evs if e["event"] == "rollout" and e["time"] > starts[-1]][0]
    assert saved == list(range(len(saved))) and len(saved) == last_start + ROLLOUTS_PER_RUN, saved
    assert requeued["report"]["start_rollout_id"] == last_start


def test_the_stage_ran_slimes_placement_with_engines_at_each_nodes_own_address(requeued: dict) -> None:
    report = requeued["report"]
    check_engines(report, requeued["address_of"])
    hosts = {r["hostname"] for r in report["records"]}
    assert hosts == set(expand_nodelist(requeued["final"]["NodeList"])), hosts  # one engine on each node of the job
    assert all(r["samples"] == 4 for r in report["rollouts"])
    assert "cluster check: 2 node(s) joined" in requeued["output"]


def test_nothing_of_the_job_is_left_on_any_host(requeued: dict) -> None:
    assert requeued["clean"], (requeued["left"], requeued["cgroups"], requeued["states"])
    assert not requeued["cores"], requeued["cores"]  # no process of the launcher's dumped core where it ran
