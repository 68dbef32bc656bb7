"""MAX_RESTARTS on separate hosts: a worker's link cut in the middle of a run and restored, and the stage finishes by
itself with every rollout trained once (tests/support/hosts.py; the cluster of test_hosts_faults.py, 2 hosts x 1 Ray
GPU, sync GRPO, the user simulator on the head, hosts_job.py in place of slime's train.py running up to
--num-rollout and saving after each rollout).

One command, `MAX_RESTARTS=2 bash scripts/train_grpo.sh`: the link is cut once the job is in its third rollout; the
cluster watch stops the job (exit NODE_LOST), the supervisor (tau2_rl_pipeline/cluster/restarts.py) says its restart
line and waits, saying which host it waits for; the link comes back after that line; the supervisor reruns the
stage, which resumes at the checkpointed rollout + 1 and runs to the end. From the job's own progress lines: every
rollout id saved (trained) exactly once, in order, none skipped; the times from the cut to the restart line and to
training again are printed. Part of the hosts tier (TAU2_HOSTS_TIER=1).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import hosts as hosts_mod
from test_hosts_cluster import SYSTEM_PATH, USER_SIM_PORT, WHY_NOT, shared_inputs, stage_env, start_user_sim
from test_hosts_faults import CLEAN_LIMIT_S, HEAD_LOST_S, RUN_LIMIT_S, Run, until_clean

pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaced hosts tier skipped: {WHY_NOT}"),
              pytest.mark.timeout(3600)]

ROLLOUTS = 5
CUT_IN_ROLLOUT = 2  # rollouts 0 and 1 trained and checkpointed before the cut


def restart_env(shared: Path, hosts: hosts_mod.Hosts, progress: Path, rollouts: int) -> dict[str, str]:
    """train_grpo.sh on 2 hosts with MAX_RESTARTS=2, a checkpoint after every rollout, up to `rollouts`."""
    head = hosts.addresses[0]
    return {**stage_env(shared, hosts, "2", 1), "HOSTS_JOB_MORE": "", "HOSTS_JOB_PROGRESS": str(progress),
            "HOSTS_JOB_ROLLOUTS": "all", "GRPO_NUM_ROLLOUT": str(rollouts), "GRPO_SAVE_INTERVAL": "1",
            "TRAIN_TP": "1", "RAY_HEAD_LOST_TIMEOUT": str(HEAD_LOST_S), "MAX_RESTARTS": "2",
            "RESTART_WAIT_TIMEOUT": "600", "TAU2_USER_API_BASE": f"http://{head}:{USER_SIM_PORT}/v1"}


def hosts_up(shared: Path, tiny_model: Path, run_id: str, n: int = 2, gpus: int = 1) -> hosts_mod.Hosts:
    """n namespaced hosts of `gpus` Ray GPUs each over the run's shared inputs, and their hostfile."""
    shared_inputs(shared, tiny_model, gpus)
    hosts = hosts_mod.Hosts(n, shared, run_id=run_id, session_env={
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_OVERRIDE_RESOURCES": '{"CPU": 16}'})
    hosts.up()
    (shared / "hostfile").write_text("".join(f"{a} slots={gpus}\n" for a in hosts.addresses))
    return hosts


@pytest.fixture(scope="module")
def healed(tmp_path_factory: pytest.TempPathFactory, tiny_small_dir: Path) -> Iterator[dict]:
    shared = tmp_path_factory.mktemp("hostsrestarts") / "shared"
    hosts = hosts_up(shared, tiny_small_dir, f"t2h{os.getpid()}xr")
    try:
        progress = shared / "progress.jsonl"
        env = restart_env(shared, hosts, progress, ROLLOUTS)
        start_user_sim(hosts, hosts.hosts[0], env, shared)
        run = Run(hosts, env, progress)
        in_rollout = run.wait_for(lambda ev: any(e["event"] == "rollout" and e["rollout"] == CUT_IN_ROLLOUT
                                                 for e in ev), RUN_LIMIT_S)
        assert in_rollout, "\n".join(line for _, line in run.lines[-40:])
        t_cut, wall_cut = time.monotonic(), time.time()
        hosts.set_link(1, up=False)
        deadline = time.monotonic() + RUN_LIMIT_S
        while run.first(r"train_grpo\.sh: waiting for ") is None and time.monotonic() < deadline \
                and run.proc.poll() is None:
            time.sleep(0.5)
        t_restore = time.monotonic()
        hosts.set_link(1, up=True)
        t_exit = run.finish()
        record = {"rc": run.proc.returncode, "stderr": [line for _, line in run.lines], "events": run.events(),
                  "t_cut": t_cut, "t_restore": t_restore, "t_exit": t_exit, "lines": run.lines}
        record.update(until_clean(hosts, CLEAN_LIMIT_S))
        restart = run.first(r"train_grpo\.sh: restart 1 of 2: ")
        resumed = next((e for e in record["events"] if e["event"] == "rollout" and e["time"] > wall_cut), None)
        print(f"\nlink cut in rollout {CUT_IN_ROLLOUT}: restart line after "
              f"{(restart[0] - t_cut) if restart else None} s, link restored after {t_restore - t_cut:.0f} s, "
              f"rolling out again (rollout {resumed and resumed['rollout']}) after "
              f"{(resumed['time'] - wall_cut) if resumed else None} s, exit after {t_exit - t_cut:.0f} s "
              f"(rc {record['rc']})")
        yield {"hosts": hosts, "record": record, "worker": hosts.addresses[1]}
    finally:
        hosts.down()
        left = hosts.leftovers()
        assert not any(left.values()), left


def test_the_stage_restarts_by_itself_and_finishes(healed: dict) -> None:
    record, worker = healed["record"], healed["worker"]
    assert record["rc"] == 0, "\n".join(record["stderr"][-60:])
    mine = [line for line in record["stderr"] if line.startswith("train_grpo.sh: ") and
            ("restart" in line or "waiting for" in line)]
    assert len([line for line in mine if line.startswith("train_grpo.sh: restart ")]) == 1, mine
    assert mine[0].startswith(f"train_grpo.sh: restart 1 of 2: worker {worker} left the Ray cluster during the job")
    assert any(line.startswith(f"train_grpo.sh: waiting for {worker}: no ssh") for line in mine), mine
    assert not [line for line in record["stderr"] if "Traceback" in line]


def test_every_rollout_is_trained_exactly_once(healed: dict) -> None:
    events = healed["record"]["events"]
    saved = [e["rollout"] for e in events if e["event"] == "saved"]
    assert saved == list(range(ROLLOUTS)), saved  # none twice, none skipped, in order
    jobs = [i for i, e in enumerate(events) if e["event"] == "job"]
    assert len(jobs) == 2, events  # the run and its one restart
    first_of_rerun = next(e["rollout"] for e in events[jobs[1]:] if e["event"] == "rollout")
    saved_before = [e["rollout"] for e in events[:jobs[1]] if e["event"] == "saved"]
    assert saved_before and first_of_rerun == saved_before[-1] + 1  # the checkpointed rollout + 1
    assert saved_before[-1] >= CUT_IN_ROLLOUT - 1


def test_nothing_of_the_run_stays_on_any_host(healed: dict) -> None:
    record = healed["record"]
    assert not any(record["left"].values()), record["left"]
