"""A real Ray cluster of two nodes on loopback, started and joined by the scripts' own code, on which slime's own
placement-group code places a 2-node layout where the stage script's dry run says it will.

Two raylets on this machine: the head on 127.0.0.2, a worker on 127.0.0.3, each declaring 2 GPUs as a Ray resource
(none is used: slime's InfoActor only asks Ray which GPU id its bundle got). They are started by scripts/cluster.sh's
`ray_cluster_up`, the function train_sft.sh and train_grpo.sh call, from a hostfile, with RAY_WORKER_LAUNCH=local
(the worker's `ray start` line runs here rather than over ssh), including the join and shared-storage check it runs
as a Ray job (cluster/check.py). The test then connects as a driver and runs slime's
`create_placement_groups` (slime/ray/placement_group.py at 624b824) with the flags train_grpo.sh's dry run prints for
the same cluster, and compares where each bundle landed with the plan that dry run printed.
Torn down by pid: the processes whose command line names this cluster's own Ray temp dir, and their children (never
`ray stop`, which stops every Ray of the user on the machine).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract_tier import MEGATRON_DIR, SGLANG_DOUBLE, SLIME_DIR
from test_cluster_check import write_checkpoint
from test_cluster_scripts import plan
from test_scripts import ROOT, Result, flags, run_script, slime_job

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
GPUS_PER_NODE = 2  # TAU2_GPU_LAYOUT=4: policy GPUs 0,1 on each node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_nvidia_smi(bindir: Path) -> None:
    """The one tool this machine lacks (ray_start_head checks the GPU ids exist), printing `nvidia-smi -L` lines."""
    bindir.mkdir()
    lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})\\n" for i in range(GPUS_PER_NODE))
    (bindir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
    (bindir / "nvidia-smi").chmod(0o755)


def processes_of(temp_dir: str) -> list[int]:
    """Every process started for this cluster: those naming its temp dir on their command line, and their children."""
    parent: dict[int, int] = {}
    own: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parent[int(entry.name)] = ppid
        if temp_dir in cmdline:
            own.add(int(entry.name))
    grew = True
    while grew:
        children = {pid for pid, ppid in parent.items() if ppid in own} - own
        own |= children
        grew = bool(children)
    return sorted(own)


def tear_down(temp_dir: str) -> None:
    """SIGTERM, then SIGKILL to what is left; each waits until the cluster's processes are gone (the event), bounded
    only so that one that never goes fails the test instead of hanging it."""
    for sig, patience_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 120.0)):
        for pid in processes_of(temp_dir):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + patience_s
        while processes_of(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert not processes_of(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


DRIVER = """
set -euo pipefail
source "$1/scripts/common.sh"
base="${TAU2_OUT_DIR}/models/Qwen3-4B-Instruct-2507"
mkdir -p "${GRPO_DATA%/*}" "${TAU2_OUT_DIR}/checkpoints/rft" "${base}"
printf '{}\\n' >"${GRPO_DATA}" && printf '{}\\n' >"${base}/config.json"
ray_stop_cluster() { :; }  # never `ray stop` (every Ray on this machine): the test stops this cluster by pid
step_job() { :; }  # the cluster is this test's, not slime's job
eval "real_$(declare -f step_check)"
step_check() {  # the data only: no checkpoint or model is made here
  local arg keep=() skip=0
  for arg in "$@"; do
    if ((skip)); then skip=0; elif [[ "${arg}" == --checkpoint || "${arg}" == --hf-model ]]; then skip=1; else keep+=("${arg}"); fi
  done
  real_step_check "${keep[@]}"
}
TAU2_USER_API_BASE="" SIZING_FORCE=1 plan_stage grpo  # train_grpo.sh's plan: printed as the cluster comes up
"""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The cluster (head 127.0.0.2, worker 127.0.0.3) as the scripts start it, and the env they were given."""
    base = tmp_path_factory.mktemp("cluster")
    (base / "hostfile").write_text(f"# the head's own line is skipped\n{HEAD} slots=2\n{WORKER} slots=2\n")
    fake_nvidia_smi(base / "bin")
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths live under it
    env = {"PATH": f"{base / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "HOME": str(base), "LANG": "C.UTF-8", "TAU2_OUT_DIR": str(base / "out"), "SLIME_DIR": str(SLIME_DIR),
           "MEGATRON_DIR": str(MEGATRON_DIR), "PYTHON": sys.executable, "TAU2_GPU_LAYOUT": "4",
           "HOSTFILE": str(base / "hostfile"), "RAY_WORKER_LAUNCH": "local", "RAY_TEMP_DIR": temp_dir,
           "MASTER_ADDR": HEAD, "SLIME_HOST_IP": HEAD, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
           "RAY_GCS_PORT": str(free_port()), "RAY_DASHBOARD_PORT": str(free_port()), "RAY_JOIN_TIMEOUT": "60",
           "TAU2_USER_API_BASE": f"http://{HEAD}:30100/v1", "RAY_USAGE_STATS_ENABLED": "0",
           "GRPO_DATA": str(base / "out/data/tasks/tau2_train_all_tasks.jsonl")}
    try:
        proc = subprocess.run(["bash", "-c", DRIVER, "driver", str(ROOT)], env=env, capture_output=True, text=True,
                              timeout=150, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield {"env": env, "stdout": proc.stdout, "stderr": proc.stderr, "base": base}
    finally:
        import ray

        ray.shutdown()
        tear_down(temp_dir)


@pytest.fixture(scope="module")
def driver(ray_cluster: dict) -> Iterator[None]:
    import ray

    paths = os.pathsep.join(map(str, (SLIME_DIR, MEGATRON_DIR, SGLANG_DOUBLE, ROOT)))
    ray.init(address=f"{HEAD}:{ray_cluster['env']['RAY_GCS_PORT']}", _node_ip_address=HEAD, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": paths}})
    yield
    ray.shutdown()


def dry_run(ray_cluster: dict, **env: str) -> Result:
    """train_grpo.sh's dry run for the same cluster: the flags slime gets and the plan it prints."""
    keep = ("HOSTFILE", "MASTER_ADDR", "SLIME_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TAU2_GPU_LAYOUT",
            "TAU2_USER_API_BASE")
    result = run_script("train_grpo.sh", ray_cluster["base"], **{k: ray_cluster["env"][k] for k in keep}, **env)
    assert result.rc == 0, result.text
    return result


def planned_nodes(result: Result) -> list[tuple[str, str]]:
    """Per GPU of the placement group, in slime's order, (node, what the plan runs there): 'actor', 'rollout' or
    'actor+rollout'."""
    out = []
    for line in plan(result):
        node, what = line.split(" ", 1)[0], line.split(": ", 1)[1]
        role = "+".join(r for r, word in (("actor", "actor ranks"), ("rollout", "SGLang engines")) if word in what)
        out += [(node, role)] * GPUS_PER_NODE
    return out


def placed_nodes(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(node of each actor bundle, node of each rollout bundle) as slime's create_placement_groups places them."""
    import ray
    from ray.util.placement_group import placement_group_table, remove_placement_group
    from slime.ray.placement_group import create_placement_groups

    pgs = create_placement_groups(args)
    pg = pgs["actor"][0]
    try:
        ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        where = placement_group_table(pg)["bundles_to_node_id"]
        actor_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
        actor = [ips[where[i]] for i in pgs["actor"][1][:actor_gpus]]
        rollout = [ips[where[i]] for i in pgs["rollout"][1][:args.rollout_num_gpus]]
    finally:
        remove_placement_group(pg)
    return actor, rollout


def slime_args(argv: list[str]) -> argparse.Namespace:
    """slime's placement arguments from the job's argv (the other flags are the stage tests' business)."""
    placement = ("--actor-num-nodes", "--actor-num-gpus-per-node", "--rollout-num-gpus", "--colocate")
    got = flags([tok for i, tok in enumerate(argv) if tok in placement or (i and argv[i - 1] in placement[:3])])
    actor_nodes, per_node = int(got["--actor-num-nodes"]), int(got["--actor-num-gpus-per-node"])
    colocate = "--colocate" in got
    rollout = actor_nodes * per_node if colocate else int(got["--rollout-num-gpus"])  # slime's default when colocated
    return argparse.Namespace(actor_num_nodes=actor_nodes, actor_num_gpus_per_node=per_node, rollout_num_gpus=rollout,
                              colocate=colocate, debug_train_only=False, debug_rollout_only=False,
                              rollout_external=False, use_critic=False)


def test_the_scripts_start_a_two_node_cluster_and_check_it(ray_cluster: dict, driver: None) -> None:
    import ray

    nodes = {n["NodeManagerAddress"]: n["Resources"].get("GPU") for n in ray.nodes() if n["Alive"]}
    assert nodes == {HEAD: GPUS_PER_NODE, WORKER: GPUS_PER_NODE}
    assert (f"cluster check: 2 node(s) joined ({HEAD}, {WORKER}); on every node 1 file(s) written on the head read "
            "back, 1 data file(s) identical to the head's (size, sha256), 0 HF model(s) and 0 Megatron checkpoint(s) "
            "complete; GLOO_SOCKET_IFNAME=lo names an interface with an address; NCCL_SOCKET_IFNAME=lo names an "
            "interface with an address") in ray_cluster["stderr"]
    joined = [c[2] for c in Result(0, ray_cluster["stdout"], "").commands if c[:2] == ["bash", "-c"]]
    assert len(joined) == 1 and f"--node-ip-address {WORKER}" in joined[0] and f"SLIME_HOST_IP={WORKER}" in joined[0]
    assert f"ray start --address {HEAD}:{ray_cluster['env']['RAY_GCS_PORT']}" in joined[0]
    assert not (ray_cluster["base"] / "out/checkpoints/grpo/.tau2-shared-check").exists()  # removed once read


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_slime_places_the_2_node_layout_where_the_plan_says(ray_cluster: dict, driver: None, mode: str) -> None:
    result = dry_run(ray_cluster, GRPO_ASYNC="1" if mode == "async" else "0")
    args = slime_args(slime_job(result, "train_async.py" if mode == "async" else "train.py")[1])
    actor, rollout = placed_nodes(args)
    planned = planned_nodes(result)
    assert actor == [node for node, role in planned if "actor" in role]
    assert rollout == [node for node, role in planned if "rollout" in role]
    if mode == "async":  # the actor on the lower address (the head), the engines on the worker
        assert (actor, rollout) == ([HEAD, HEAD], [WORKER, WORKER])
    else:  # colocated: every GPU of both nodes trains and rolls out
        assert actor == rollout == [HEAD, HEAD, WORKER, WORKER]


def test_the_check_names_a_worker_that_did_not_join_and_a_node_that_lacks_an_input(ray_cluster: dict,
                                                                                      driver: None) -> None:
    from tau2_rl_pipeline.cluster import check

    views = check.wait_for_nodes(3, GPUS_PER_NODE, [HEAD, WORKER, "127.0.0.4"], timeout_s=1.0)
    assert check.joined_problems(views, num_nodes=3, gpus_per_node=GPUS_PER_NODE,
                                 expect=[HEAD, WORKER, "127.0.0.4"]) == ["worker 127.0.0.4 has not joined the Ray cluster"]
    token = ray_cluster["base"] / "token"
    token.write_text("abc")
    inputs = check.Inputs(data=[str(token), "/nonexistent/data"], models=[str(ray_cluster["base"])])
    seen = check.read_on_every_node(views, [str(token)], inputs)
    assert sorted(v.ip for v in seen) == [HEAD, WORKER] and all(v.tokens == {str(token): "abc"} for v in seen)
    assert all(v.data[str(token)] == check.read_data(str(token)) for v in seen)  # read on each node: same bytes
    problems = check.storage_problems(seen, {str(token): "abc"}, inputs, HEAD)
    assert problems == [line for ip in (HEAD, WORKER) for line in (
        f"node {ip} does not see /nonexistent/data: {check.SHARED_STORAGE_HINT}",
        f"node {ip}: HF model {ray_cluster['base']} has no config.json")]


def run_check(ray_cluster: dict, *args: str) -> tuple[int, list[str]]:
    """The cluster check as scripts/cluster.sh runs it on the head (a second driver beside the test's): its exit
    status and the lines it printed."""
    env = {**ray_cluster["env"], "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "tau2_rl_pipeline.cluster.check", "--address",
                           f"{HEAD}:{env['RAY_GCS_PORT']}", "--nodes", "2", "--gpus-per-node", str(GPUS_PER_NODE),
                           "--expect", f"{HEAD},{WORKER}", "--timeout", "60", *args], env=env, capture_output=True,
                          text=True, timeout=150, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("cluster check")]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, lines


def test_the_check_refuses_a_resume_whose_tracked_iteration_is_incomplete(ray_cluster: dict, driver: None) -> None:
    """A resumed run loads its own save (train_grpo.sh and train_sft.sh check it: test_cluster_scripts.py): a tracked
    iteration without the metadata.json Megatron writes last stops the run in one line, naming the node; each node
    reads its own copy (one directory here, so the worker's line is the "1 more")."""
    save = write_checkpoint(ray_cluster["base"] / "checkpoints/grpo", tracker="20")
    (save / "iter_0000020/metadata.json").rename(save / "metadata.json.partial")
    assert run_check(ray_cluster, "--checkpoint", str(save)) == (1, [
        f"cluster check failed: node {HEAD}: checkpoint {save} has no iter_0000020/metadata.json (a save that did not "
        "finish) (and 1 more)"])
    (save / "metadata.json.partial").rename(save / "iter_0000020/metadata.json")
    rc, (line,) = run_check(ray_cluster, "--checkpoint", str(save))
    assert rc == 0 and "0 HF model(s) and 1 Megatron checkpoint(s) complete" in line


def test_the_check_refuses_an_interface_name_a_node_lacks(ray_cluster: dict, driver: None) -> None:
    """Each node's task reads that node's interfaces (cluster/net.py: Gloo's exact names, NCCL's prefixes)."""
    rc, (line,) = run_check(ray_cluster, "--interface", "NCCL_SOCKET_IFNAME=l", "--interface", "GLOO_SOCKET_IFNAME=l")
    said = re.fullmatch(rf"cluster check failed: node {HEAD}: GLOO_SOCKET_IFNAME=l names no network interface there "
                        r"\(it has: (.*)\) \(and 1 more\)", line)
    assert rc == 1 and said and "lo" in said[1].split(", "), line
    rc, (line,) = run_check(ray_cluster, "--interface", "NCCL_SOCKET_IFNAME=l", "--interface", "GLOO_SOCKET_IFNAME=lo")
    assert rc == 0 and line.endswith("; NCCL_SOCKET_IFNAME=l names an interface with an address; GLOO_SOCKET_IFNAME=lo "
                                     "names an interface with an address")
