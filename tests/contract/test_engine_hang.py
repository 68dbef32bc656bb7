"""A hung SGLang engine is restarted inside the job by slime's own fault tolerance, so the job goes on.

slime 624b824's `--use-fault-tolerance` (slime/utils/arguments.py, add_fault_tolerance_arguments): the RolloutManager
starts one RolloutHealthMonitor per engine group (slime/ray/rollout.py, RolloutManager.__init__), which asks every
engine's `/health_generate` every `--rollout-health-check-interval` seconds and, when one does not answer within
`--rollout-health-check-timeout`, shuts that engine down (out of the router, its server's process tree killed) and
marks its slot dead (slime/utils/health_monitor.py, _kill_engine); before the next weight update the train actor asks
the manager to start an engine in every dead slot (slime/backends/megatron_utils/actor.py, update_weights ->
RolloutManager.recover_updatable_engines -> RolloutServer.recover). The stage scripts pass these flags through
EXTRA_SLIME_ARGS.

Here, on one namespaced host (tests/support/hosts.py: its own address, process table and /tmp, so its Ray is its
own and `ray stop` there stops only it), `train_grpo.sh` runs for real with TAU2_GPU_LAYOUT=4 (two colocated
engines on 2 declared GPUs, none used) and the fault-tolerance flags in EXTRA_SLIME_ARGS; its job runs hosts_job.py
in place of train.py: slime's parse_args, placement groups and RolloutManager launch each engine's SGLang double;
rollouts go through slime's rollout function, the project's custom generate and a user simulator; between rollouts
the job calls what slime's actor calls before each weight update. Once the first rollout is trained, one engine
hangs (its double stops answering /generate and /health_generate, as an SGLang server whose scheduler is stuck). The
job must go on to the last rollout by itself: the hung engine killed by slime's monitor, a new one started in its
slot, every rollout trained once, one job, the script's exit 0. Part of the hosts tier (TAU2_HOSTS_TIER=1): on a
machine's own loopback Ray gives slime's actors the machine's routed address, where the double may not serve.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import hosts as hosts_mod
from test_hosts_cluster import USER_SIM_PORT, WHY_NOT, stage_env, start_user_sim
from test_hosts_faults import RUN_LIMIT_S, Run
from test_hosts_restarts import hosts_up

pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaced hosts tier skipped: {WHY_NOT}"),
              pytest.mark.timeout(1800)]

ROLLOUTS = 4
HANG_AFTER = 0  # the rollout whose save is followed by the hang
FAULT_TOLERANCE = "--use-fault-tolerance --rollout-health-check-interval 1 --rollout-health-check-timeout 3"


def alive(host: hosts_mod.Host, pid: int) -> bool:
    return host.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory, tiny_small_dir: Path) -> Iterator[dict]:
    shared = tmp_path_factory.mktemp("enginehang") / "shared"
    hosts = hosts_up(shared, tiny_small_dir, f"t2h{os.getpid()}xe", n=1, gpus=2)
    try:
        host = hosts.hosts[0]
        progress, records = shared / "progress.jsonl", shared / "engines"
        env = {**stage_env(shared, hosts, "4", 2), "HOSTFILE": "", "HOSTS_JOB_MORE": "",
               "HOSTS_JOB_PROGRESS": str(progress), "HOSTS_JOB_ROLLOUTS": "all", "GRPO_NUM_ROLLOUT": str(ROLLOUTS),
               "GRPO_SAVE_INTERVAL": "1", "TRAIN_TP": "1", "TAU2_USER_MAX_RETRIES": "2",
               "TAU2_USER_API_BASE": f"http://{host.address}:{USER_SIM_PORT}/v1", "EXTRA_SLIME_ARGS": FAULT_TOLERANCE}
        start_user_sim(hosts, host, env, shared)
        run = Run(hosts, env, progress)
        hung = run.wait_for(lambda ev: any(e["event"] == "saved" and e["rollout"] == HANG_AFTER for e in ev),
                            RUN_LIMIT_S)
        assert hung, "\n".join(line for _, line in run.lines[-40:])
        launched = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
        victim = max(launched, key=lambda r: r["port"])
        (records / f"hang-{victim['host']}-{victim['port']}").touch()  # the double hangs within 0.5 s
        t_hang = time.time()
        run.finish()
        replaced = [e for e in run.events() if e["event"] == "engines" and e["time"] > t_hang
                    and f"http://{victim['host']}:{victim['port']}" not in e["urls"]]
        print(f"\nengine {victim['host']}:{victim['port']} hung after rollout {HANG_AFTER}: replaced before rollout "
              f"{replaced[0]['rollout'] if replaced else None}, "
              f"{(replaced[0]['time'] - t_hang) if replaced else float('nan'):.0f} s after the hang; the job's exit "
              f"{run.proc.returncode} {time.time() - t_hang:.0f} s after it")
        yield {"rc": run.proc.returncode, "stderr": [line for _, line in run.lines], "events": run.events(),
               "victim": victim, "launched": launched, "t_hang": t_hang,
               "victim_alive": alive(host, victim["pid"]),
               "report": json.loads((shared / "job.json").read_text())[0] if (shared / "job.json").exists() else {},
               "records": [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]}
    finally:
        hosts.down()
        left = hosts.leftovers()
        assert not any(left.values()), left


def test_the_job_goes_on_past_a_hung_engine_and_trains_every_rollout_once(hung_job: dict) -> None:
    assert hung_job["rc"] == 0 and hung_job["report"].get("error") is None, "\n".join(hung_job["stderr"][-60:])
    evs = hung_job["events"]
    assert len([e for e in evs if e["event"] == "job"]) == 1  # one job: nothing restarted it
    assert [e["rollout"] for e in evs if e["event"] == "saved"] == list(range(ROLLOUTS))
    for rollout in hung_job["report"]["rollouts"]:  # GRPO_ROLLOUT_BATCH_SIZE=2 x GRPO_N_SAMPLES=2, each with tokens
        assert rollout["samples"] == 4 and len(rollout["response_tokens"]) == 4, rollout


def test_slime_killed_the_hung_engine_and_started_another_in_its_slot(hung_job: dict) -> None:
    assert len(hung_job["launched"]) == 2
    # a third engine was launched by slime's recovery; the hung one's server is gone (slime killed its process tree)
    new = [r for r in hung_job["records"] if r["pid"] not in {x["pid"] for x in hung_job["launched"]}]
    assert len(new) == 1 and new[0]["error"] is None, hung_job["records"]
    assert not hung_job["victim_alive"]
    # the engines the job updates after the recovery: the survivor and the new one
    survivor = next(r for r in hung_job["launched"] if r["pid"] != hung_job["victim"]["pid"])
    after = [e for e in hung_job["events"] if e["event"] == "engines" and e["time"] > hung_job["t_hang"]]
    assert after and sorted(after[-1]["urls"]) == sorted(f"http://{r['host']}:{r['port']}" for r in (survivor, new[0]))
