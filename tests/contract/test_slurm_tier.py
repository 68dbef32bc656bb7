"""The Slurm launcher on a real Slurm: slurmctld, slurmd and munge from the OS's packages on namespaced hosts
(tests/support/slurm.py): a controller host (the user simulator beside it) and three compute nodes with two fake
GPUs each (gres).

One job, as a user submits it: `bash scripts/slurm.sh --nodes 2 --gpus-per-node 2 ... train_grpo.sh` on the
controller host. In the allocation the launcher starts a Ray head on the first node and a worker on the second (srun),
and the unchanged train_grpo.sh joins them through RAY_ADDRESS. Its `ray job submit`s run on the head as Ray's jobs
API would run them (ray_job_double.py: the contract venv's minimal Ray has no jobs API): the cluster check as it is,
slime's train.py as hosts_job.py (test_hosts_cluster.py's job driver: slime's own
parse_args, placement groups, RolloutManager and engine address allocation, an SGLang double bound at the address
slime gave each engine, rollouts through the project's custom generate, a checkpoint per rollout). Once the second
rollout is under way, the worker's link is cut: Slurm calls the node DOWN, requeues the job (--requeue) onto the
spare node with no person, and the second run starts at the checkpointed rollout + 1 and ends by itself. Then
nothing of the job is left on any host. The time from the fault to training again is printed.

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

ROLLOUTS_PER_RUN = 3  # HOSTS_JOB_ROLLOUTS: the requeued run trains this many after the checkpoint, then ends
RUN_LIMIT_S = 900


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


@pytest.fixture(scope="module")
def requeued(tmp_path_factory: pytest.TempPathFactory, tiny_small_dir: Path) -> Iterator[dict]:
    shared = tmp_path_factory.mktemp("slurmtier") / "shared"
    shared_inputs(shared, tiny_small_dir, 1)
    shim(shared / "bin")
    cluster = slurm_mod.SlurmHosts(4, shared, gpus=2, slurmd_timeout=20, cred_expire=30, session_env={
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "RAY_USAGE_STATS_ENABLED": "0"})
    started = time.monotonic()
    cluster.up()
    record: dict = {"cluster": cluster, "up_s": time.monotonic() - started}
    try:
        login = cluster.hosts[0]
        progress = shared / "progress.jsonl"
        env = stage_env(shared, cluster, "2", 1)
        for name in ("HOSTFILE", "MASTER_ADDR", "SLIME_HOST_IP", "RAY_SSH"):
            env.pop(name)
        env.update(cluster.env, HOSTS_JOB_MORE="", HOSTS_JOB_PROGRESS=str(progress), GRPO_SAVE_INTERVAL="1",
                   TRAIN_TP="1", HOSTS_JOB_ROLLOUTS=str(ROLLOUTS_PER_RUN),
                   TAU2_USER_API_BASE=f"http://{login.address}:{USER_SIM_PORT}/v1",
                   TAU2_THIRD_PARTY=str(third_party_path()))  # the job driver's slime, wherever this checkout is
        start_user_sim(cluster, login, env, shared)
        out_dir = shared / "slurm"
        submit = login.run(["bash", str(ROOT / "scripts/slurm.sh"), "--nodes", "2", "--gpus-per-node", "2",
                            "--time", "60", "--output-dir", str(out_dir), "train_grpo.sh"],
                           env=env, capture_output=True, text=True, cwd=env["HOME"], timeout=120)
        assert submit.returncode == 0, submit.stderr
        job_id = submit.stdout.strip()
        record.update(job_id=job_id, submit=submit.stderr)
        output = out_dir / f"tau2-grpo-{job_id}.out"

        def second_rollout() -> bool:
            return len([e for e in events(progress) if e["event"] == "rollout"]) >= 2

        def over() -> bool:
            return cluster.job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
        wait(lambda: second_rollout() or over(), RUN_LIMIT_S, 0.5)
        job_out = shared / "job.json"
        assert second_rollout(), ((job_out.read_text()[-3000:] if job_out.exists() else "") +
                                  (output.read_text()[-3000:] if output.exists() else str(cluster.job(job_id))))
        first = cluster.job(job_id)
        nodes = expand_nodelist(first["NodeList"])
        worker = int(nodes[1].rsplit("-h", 1)[1])
        record.update(first_nodes=nodes, lost=nodes[1], fault_at=time.time())
        cluster.set_link(worker, up=False)

        def restarted_and_training() -> bool:
            if "running_again_at" not in record:  # Slurm's part: the node called DOWN, the job requeued and started
                job = cluster.job(job_id)
                if job.get("Restarts") == "1" and job.get("JobState") == "RUNNING":
                    record["running_again_at"] = time.time()
            return any(e["event"] == "rollout" and e["time"] > record["fault_at"] for e in events(progress))
        assert wait(restarted_and_training, RUN_LIMIT_S), output.read_text()[-4000:]
        record["training_again_at"] = next(e["time"] for e in events(progress)
                                           if e["event"] == "rollout" and e["time"] > record["fault_at"])
        record["second"] = cluster.job(job_id)
        cluster.set_link(worker, up=True)  # the node comes back (ReturnToService=2) and Slurm cleans it

        def done() -> dict | None:
            job = cluster.job(job_id)
            return job if job.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None
        record["final"] = wait(done, RUN_LIMIT_S, 2)
        record["output"] = output.read_text()
        record["events"] = events(progress)
        record["report"] = json.loads((shared / "job.json").read_text())[0] if (shared / "job.json").exists() else {}
        t0 = time.monotonic()

        def clean() -> bool:
            left = cluster.leftovers_of_jobs()
            left[cluster.node_name(0)] = [p for p in left[cluster.node_name(0)] if "loopback_server" not in p]
            record["left"], record["cgroups"] = left, cluster.job_cgroups()
            return not any(left.values()) and not record["cgroups"]
        record["clean"] = wait(clean, 240, 2)
        record["clean_after_s"] = time.monotonic() - t0
        record["states"] = cluster.states()
        record["address_of"] = {cluster.node_name(h.index): h.address for h in cluster.hosts}
        print(f"\nslurm tier: cluster up in {record['up_s']:.1f} s; job {job_id} on {nodes}, {nodes[1]}'s link cut; "
              f"fault to training again: {record['training_again_at'] - record['fault_at']:.0f} s "
              f"(restarted on {record['second'].get('NodeList')}); every host clean {record['clean_after_s']:.0f} s "
              f"after the job ended; total {time.monotonic() - started:.0f} s")
        print(f"slurm tier: of the fault to training again, {record['running_again_at'] - record['fault_at']:.0f} s "
              "until the job ran again (SlurmdTimeout=20, cred_expire=30), "
              f"{record['training_again_at'] - record['running_again_at']:.0f} s from there to its first rollout "
              "(Ray, the cluster check, slime's start)")
        yield record
    finally:
        cluster.down()
        left = cluster.leftovers()
        assert not any(left.values()), left
        assert not list(slurm_mod.FREEZER.glob(f"{cluster.run_id}-h*"))


def test_the_job_is_requeued_onto_the_spare_node_and_ends_by_itself(requeued: dict) -> None:
    final, nodes = requeued["final"], requeued["first_nodes"]
    assert final and final["JobState"] == "COMPLETED" and final["Restarts"] == "1", (final, requeued["output"][-4000:])
    again = expand_nodelist(requeued["second"]["NodeList"])
    assert requeued["lost"] not in again and len(again) == 2 and nodes[0] in again, (nodes, again)
    out = requeued["output"]
    assert f"job {requeued['job_id']}, restart 0 (SLURM_RESTART_COUNT)" in out
    assert f"job {requeued['job_id']}, restart 1 (SLURM_RESTART_COUNT)" in out
    gcs = re.findall(r"GCS port (\d+)", out)
    assert len(gcs) == 2 and gcs[0] != gcs[1], gcs  # the requeued run's Ray on new ports


def test_the_requeued_run_resumes_at_the_checkpointed_rollout_plus_one(requeued: dict) -> None:
    evs, fault = requeued["events"], requeued["fault_at"]
    saved_before = [e["rollout"] for e in evs if e["event"] == "saved" and e["time"] < fault]
    starts = [e for e in evs if e["event"] == "job"]
    assert len(starts) == 2, starts  # the first run, and the requeued one
    second_start = starts[1]["time"]
    resumed = [e["rollout"] for e in evs if e["event"] == "rollout" and e["time"] > second_start]
    assert saved_before and resumed[0] == saved_before[-1] + 1, (saved_before, resumed)
    # every rollout trained and checkpointed once, none skipped
    saved = [e["rollout"] for e in evs if e["event"] == "saved"]
    assert saved == list(range(len(saved))) and len(saved) == resumed[0] + ROLLOUTS_PER_RUN, saved
    assert requeued["report"]["start_rollout_id"] == resumed[0]


def test_the_stage_ran_slimes_placement_with_engines_at_each_nodes_own_address(requeued: dict) -> None:
    report = requeued["report"]
    check_engines(report, requeued["address_of"])
    hosts = {r["hostname"] for r in report["records"]}
    assert hosts == set(expand_nodelist(requeued["final"]["NodeList"])), hosts  # one engine on each node of the job
    assert all(r["samples"] == 4 for r in report["rollouts"])
    assert "cluster check: 2 node(s) joined" in requeued["output"]


def test_nothing_of_the_job_is_left_on_any_host(requeued: dict) -> None:
    assert requeued["clean"], (requeued["left"], requeued["cgroups"], requeued["states"])
