"""The multi-node path on separate hosts: namespaced hosts (tests/support/hosts.py), each with its own
address, sshd, /tmp and PID space, the run's shared directory mounted at the same path on each.

On 2 hosts x 4 Ray GPUs and 4 hosts x 2, train_grpo.sh runs for real on host 0 and unchanged up to the job: the
hostfile, ssh to each worker, `ray start --address` on each host, the cluster check, the EXIT trap's `ray stop` on
every host. Its `ray job submit` runs hosts_job.py in place of slime's train.py (no GPUs here): slime's parse_args,
placement groups and RolloutManager for the script's own argv and for async GRPO's and SFT's (their dry runs on the
same hosts), each SGLang engine's double launched by slime's SGLangEngine actor in its bundle at the address slime
gave it, and rollouts through slime's rollout function, the project's custom generate and the user simulator on the
last host. The old argv (no --num-gpus-per-node) is planted beside them: its engines on the second host are given
the head's address, which no interface of theirs holds, and cannot bind (errno 99), as on separate machines.
Skipped in one line where namespaces cannot be made (not root).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract_tier import MEGATRON_DIR, SLIME_DIR
from megatron_save import torch_dist_files
from slime_harness import prompt_rows
from support import hosts as hosts_mod
from test_scripts import ROOT, Result
from third_party import THIRD_PARTY_ENV, third_party_path

# The tier (this module, test_hosts_faults.py, test_hosts_restarts.py and test_engine_hang.py) brings up Ray clusters
# of 2 and 4 separate hosts and runs slime's job on them, then nine runs of train_grpo.sh that each meet a fault, a
# run that restarts itself after a cut link, and a job that outlives a hung engine: 20-45 minutes on 2 cores for the
# first two modules, 12 and 4.5 for the last two (measured beside other jobs), more than the test command's budget.
# CI runs it as its own step (.ci/run); by hand:
#   TAU2_HOSTS_TIER=1 TAU2_TEST_WORKERS=0 bash scripts/test.sh tests/contract/test_hosts_cluster.py \
#     tests/contract/test_hosts_faults.py tests/contract/test_hosts_restarts.py tests/contract/test_engine_hang.py
TIER = ("tests/contract/test_hosts_cluster.py tests/contract/test_hosts_faults.py tests/contract/test_hosts_restarts.py "
        "tests/contract/test_engine_hang.py")
WHY_NOT = hosts_mod.unavailable() or (None if os.environ.get("TAU2_HOSTS_TIER") == "1" else
                                      f"its own step: TAU2_HOSTS_TIER=1 TAU2_TEST_WORKERS=0 bash scripts/test.sh {TIER} "
                                      "(CI runs it)")
# One cluster per layout is brought up by the fixture of its first test: Ray, slime's imports and a tiny model per
# engine on a loaded 2-core machine take longer than the suite's per-test limit.
pytestmark = [pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaced hosts tier skipped: {WHY_NOT}"),
              pytest.mark.timeout(1800)]

LAYOUTS = {"2x4": (2, "8", 4), "4x2": (4, "4", 2)}  # hosts, TAU2_GPU_LAYOUT, Ray GPUs per host
USER_SIM_PORT = 30001
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def shim(bindir: Path, gpus: int) -> None:
    """`ray` as on the head, but `ray job submit` runs hosts_job.py; `nvidia-smi -L` listing the declared GPUs."""
    bindir.mkdir(parents=True)
    real_ray = Path(sys.executable).parent / "ray"
    (bindir / "ray").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = job ] && [ "$2" = submit ]; then shift 2; exec {sys.executable} '
        f'{Path(__file__).parent / "hosts_job.py"} "$@"; fi\n'
        f'exec {real_ray} "$@"\n')
    lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})\\n" for i in range(gpus))
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    for tool in ("ray", "nvidia-smi"):
        (bindir / tool).chmod(0o755)


def stage_env(shared: Path, hosts: hosts_mod.Hosts, layout: str, gpus: int) -> dict[str, str]:
    out = shared / "out"
    head, last = hosts.addresses[0], hosts.addresses[-1]
    return {
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "HOME": str(shared / "home"),
        "LANG": "C.UTF-8", "PYTHON": sys.executable, "SLIME_DIR": str(SLIME_DIR), "MEGATRON_DIR": str(MEGATRON_DIR),
        THIRD_PARTY_ENV: str(third_party_path()),  # hosts_job.py's own imports of slime: the sources this run uses
        "TAU2_OUT_DIR": str(out), "TAU2_GPU_LAYOUT": layout, "SIZING_FORCE": "1",
        "BASE_HF_DIR": str(out / "models/tiny"), "BASE_TORCH_DIST_DIR": str(out / "models/tiny_torch_dist"),
        "HOSTFILE": str(shared / "hostfile"), "MASTER_ADDR": head, "SLIME_HOST_IP": head,
        "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "eth0", "RAY_SSH": hosts.ray_ssh,
        "RAY_JOIN_TIMEOUT": "180", "RAY_USAGE_STATS_ENABLED": "0", "RAY_memory_monitor_refresh_ms": "0", "RAY_OVERRIDE_RESOURCES": '{"CPU": 16}',
        "TAU2_USER_API_BASE": f"http://{last}:{USER_SIM_PORT}/v1", "TAU2_USER_MODEL": "openai/tiny",
        "TAU2_USER_MAX_RETRIES": "0", "TAU2_MAX_TURNS": "2", "GRPO_ROLLOUT_BATCH_SIZE": "2", "GRPO_N_SAMPLES": "2",
        "GRPO_MAX_RESPONSE_LEN": "16", "SFT_BATCH_SIZE": "8",
        "HOSTS_JOB_RECORDS": str(shared / "engines"), "HOSTS_JOB_OUT": str(shared / "job.json"),
        "HOSTS_JOB_MORE": str(shared / "more.json"), "HOSTS_JOB_NAME": "sync GRPO", "HOSTS_JOB_ROLLOUTS": "1",
        # the job's contract_tier finds the pinned sources where this test's did (a checkout elsewhere than beside
        # shared/, e.g. a git worktree)
        **{k: v for k, v in os.environ.items() if k == "TAU2_THIRD_PARTY"},
    }


def on_head(hosts: hosts_mod.Hosts, script: str, env: dict[str, str], timeout: int) -> Result:
    proc = hosts.hosts[0].run(["bash", str(ROOT / "scripts" / script)], env=env, capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=env["HOME"])
    return Result(proc.returncode, proc.stdout, proc.stderr)


def job_argv(result: Result, entry: str) -> list[str]:
    """slime's argv in the dry run's `ray job submit ... -- python SLIME_DIR/<entry> ARGV`."""
    assert result.rc == 0, result.text[-3000:]
    (job,) = [c for c in result.commands if c[:3] == ["ray", "job", "submit"] and f"{SLIME_DIR}/{entry}" in c]
    return job[job.index(f"{SLIME_DIR}/{entry}") + 1:]


def without_num_gpus_per_node(argv: list[str]) -> list[str]:
    """The argv the scripts passed before the fix: slime keeps its default of 8 GPUs per node."""
    i = argv.index("--num-gpus-per-node")
    return argv[:i] + argv[i + 2:]


def megatron_checkpoint_files(path: Path) -> None:
    """A torch_dist checkpoint as slime's converter leaves it (tracker `release`, Megatron's dist_checkpointing files):
    no weights are loaded here, the cluster check reads that they are all there."""
    torch_dist_files(path / "release")
    (path / "latest_checkpointed_iteration.txt").write_text("release")


def shared_inputs(shared: Path, tiny_model: Path, gpus: int) -> Path:
    """The run's shared directory as a user prepares it (the RFT and initial checkpoints, the HF model, the GRPO
    prompts), with the stand-in tools of the head; its TAU2_OUT_DIR."""
    out = shared / "out"
    for d in ("home", "engines", "out/data/tasks"):
        (shared / d).mkdir(parents=True)
    for ckpt in ("out/checkpoints/rft", "out/models/tiny_torch_dist"):
        megatron_checkpoint_files(shared / ckpt)
    shutil.copytree(tiny_model, out / "models/tiny")
    prompt_rows(out / "data/tasks/tau2_train_all_tasks.jsonl", ["create_task_1", "update_task_1"])
    shim(shared / "bin", gpus)
    return out


def start_user_sim(hosts: hosts_mod.Hosts, host: hosts_mod.Host, env: dict[str, str], shared: Path,
                   log_path: Path | None = None) -> None:
    """The user simulator (a tiny model behind the loopback server) on `host` at USER_SIM_PORT, answering the head;
    its log in the shared directory unless `log_path` says where."""
    log_path = log_path or shared / "user_sim.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server keeps it
    host.popen([sys.executable, "-m", "support.loopback_server", "--model",
                str(shared / "out/models/tiny"), "--host", host.address, "--port", str(USER_SIM_PORT),
                "--model-name", "tiny", "--seed", "0"],
               env={**env, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    models = f"http://{host.address}:{USER_SIM_PORT}/v1/models"  # from the head, across the bridge
    probe = hosts.hosts[0].run(
        ["sh", "-c", f"for i in $(seq 720); do curl -fs -o /dev/null {models} && exit 0; sleep 0.5; done; exit 1"],
        check=False)
    assert probe.returncode == 0, log_path.read_text()[-2000:]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, tiny_small_dir: Path) -> Iterator[dict]:
    """One cluster per layout: the hosts, train_grpo.sh's real run on them, and the job's reports."""
    n, layout, gpus = LAYOUTS[request.param]
    shared = tmp_path_factory.mktemp(f"hosts{request.param}") / "shared"
    out = shared_inputs(shared, tiny_small_dir, gpus)
    (out / "data/sft_seed.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                                                      {"role": "assistant", "content": "hello"}],
                                                         "tools": []}) + "\n")
    hosts = hosts_mod.Hosts(n, shared, run_id=f"t2h{os.getpid()}x{request.param}", session_env={
        "PATH": f"{shared / 'bin'}:{Path(sys.executable).parent}:{SYSTEM_PATH}", "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_OVERRIDE_RESOURCES": '{"CPU": 16}'})
    started = time.monotonic()
    hosts.up()
    try:
        (shared / "hostfile").write_text("".join(f"{a} slots={gpus}\n" for a in hosts.addresses))
        env = stage_env(shared, hosts, layout, gpus)
        start_user_sim(hosts, hosts.hosts[-1], env, shared)
        dry = {**env, "DRY_RUN": "1"}
        sync = job_argv(on_head(hosts, "train_grpo.sh", dry, 120), "train.py")
        more = [{"name": "async GRPO", "argv": job_argv(on_head(hosts, "train_grpo.sh", {**dry, "GRPO_ASYNC": "1"},
                                                                120), "train_async.py")},
                {"name": "SFT", "argv": job_argv(on_head(hosts, "train_sft.sh", dry, 120), "train_async.py")},
                {"name": "old sync GRPO", "argv": without_num_gpus_per_node(sync)}]
        (shared / "more.json").write_text(json.dumps(more))
        real = on_head(hosts, "train_grpo.sh", env, 1500)
        after_script = {h.address: hosts.hosts[i].run(["ps", "-eo", "comm="], capture_output=True, text=True,
                                                        check=False).stdout.split()
                        for i, h in enumerate(hosts.hosts)}
        reports = json.loads((shared / "job.json").read_text()) if (shared / "job.json").exists() else []
        yield {"hosts": hosts, "result": real, "reports": {r["name"]: r for r in reports}, "sync_dry": sync,
               "after_script": after_script, "layout": request.param, "gpus": gpus,
               "address_of": {f"{hosts.run_id}-h{h.index}": h.address for h in hosts.hosts}}
    finally:
        hosts.down()
        left = hosts.leftovers()
        print(f"\nnamespaced hosts {request.param}: {time.monotonic() - started:.0f} s; left after teardown: {left}")
        assert not any(left.values()), left



# ---- what the reports must show --------------------------------------------------------------------------------
def check_engines(report: dict, address_of: dict[str, str]) -> None:
    """Every SGLang double is bound at the address slime gave its engine, and that address is its own host's (the
    host its process runs on, by hostname); slime's engine actor sits on that host, in the engine's bundle."""
    records = report.get("records", [])
    assert records, f"{report['name']}: no engine was launched ({report.get('error')})"
    for rec in records:
        own = address_of[rec["hostname"]]
        assert rec["error"] is None, (f"{report['name']}: the engine on {own} was given {rec['host']}:{rec['port']} "
                                      f"and could not bind it: {rec['error']}")
        assert rec["host"] == own and rec["dist_init_addr"].rsplit(":", 1)[0] == own, (report["name"], own, rec)
    assert report["error"] is None, report["error"]
    per_engine = report["gpus_per_engine"]
    assert len(report["engines"]) == len(records) == len(report["rollout_bundles"]) // per_engine
    for engine in report["engines"]:
        host = engine["url"].removeprefix("http://").rsplit(":", 1)[0]
        assert host == engine["actor_node"] == report["rollout_bundles"][engine["rank"] * per_engine], engine
    assert sorted(e["url"] for e in report["engines"]) == sorted(f"http://{r['host']}:{r['port']}" for r in records)


def test_the_scripts_start_the_cluster_on_separate_hosts_over_ssh(run: dict) -> None:
    result, addresses = run["result"], run["hosts"].addresses
    assert result.rc == 0, result.text[-4000:]
    assert f"cluster check: {len(addresses)} node(s) joined ({', '.join(addresses)})" in result.stderr
    joins = [c for c in result.commands if c[:1] == ["ssh"] and "ray start" in c[-1]]
    assert [c[-2] for c in joins] == addresses[1:]
    # the EXIT trap stopped Ray on every host over ssh: only sshd (and the last host's user simulator) are left
    for address, procs in run["after_script"].items():
        assert not [p for p in procs if p.startswith(("raylet", "gcs_server", "ray::", "ray"))], (address, procs)


@pytest.mark.parametrize("stage", ["sync GRPO", "async GRPO"])
def test_every_engine_is_bound_at_slimes_address_on_its_own_host(run: dict, stage: str) -> None:
    report = run["reports"][stage]
    check_engines(report, run["address_of"])
    hosts_with_engines = {r["hostname"] for r in report["records"]}
    assert len(hosts_with_engines) == (len(run["hosts"].hosts) if stage == "sync GRPO"
                                       else len(run["hosts"].hosts) // 2)
    # slime's rollout, the custom generate and the user simulator on the last host, through those engines
    (rollout,) = report["rollouts"]  # GRPO_ROLLOUT_BATCH_SIZE=2 tasks x GRPO_N_SAMPLES=2
    assert rollout["samples"] == len(rollout["response_tokens"]) == 4 and all(n > 0 for n in rollout["response_tokens"])


def test_sft_places_its_train_actors_on_every_host(run: dict) -> None:
    report = run["reports"]["SFT"]
    assert report["error"] is None, report.get("traceback") or report["error"]
    actors = sorted(report["train_actors"], key=lambda a: a["rank"])
    assert [a["node"] for a in actors] == report["actor_bundles"]
    assert sorted(set(report["actor_bundles"])) == sorted(run["hosts"].addresses)
    assert {a["master_addr"] for a in actors} == {run["hosts"].addresses[0]}  # rank 0's, on the head


def test_the_old_argv_gives_engines_the_heads_address_and_they_cannot_bind(run: dict) -> None:
    report = run["reports"]["old sync GRPO"]
    assert report["num_gpus_per_node"] == 8 and "--num-gpus-per-node" not in report["argv"]
    with pytest.raises(AssertionError, match=r"could not bind it: \[Errno 99\]"):
        check_engines(report, run["address_of"])
    head = run["hosts"].addresses[0]
    failed = [r for r in report["records"] if r["error"]]
    assert failed and all(r["host"] == head and run["address_of"][r["hostname"]] != head for r in failed)
