"""The stage scripts on several nodes (scripts/cluster.sh): their dry runs, flag by flag, and their one-line errors.

As in test_scripts.py: a dry run prints each command; here what the node count, the hostfile, a running cluster
(RAY_ADDRESS) and the interface variables make of them, and the plan (which node runs what) each dry run prints.
slime's own parser reads these argvs in the contract tier (tests/contract/test_stage_argv.py), and slime's own
placement-group code places a 2-node layout on a real two-raylet cluster there (tests/contract/test_ray_cluster.py).
Real (non-dry) runs only where the check fails before anything starts: an interface this node lacks, a worker that
ssh cannot reach (the real ssh client against a port nothing listens on).
"""

from __future__ import annotations

import itertools
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from test_scripts import SLIME, Result, flags, run_script, runtime_env, slime_job

MASTER = "10.0.0.1"
NETWORK = {"MASTER_ADDR": MASTER, "SLIME_HOST_IP": MASTER, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
           "TAU2_USER_API_BASE": "http://10.0.0.1:30100/v1"}


def hostfile(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "hostfile"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def workers(n: int) -> list[str]:
    return [f"10.0.0.{i}" for i in range(2, n + 1)]


def dry(script: str, tmp_path: Path, **env: str) -> Result:
    result = run_script(script, tmp_path, **env)
    assert result.rc == 0, result.text
    return result


def cluster(tmp_path: Path, nodes: int, script: str = "train_grpo.sh", **env: str) -> Result:
    """A dry run on `nodes` nodes: this one (the head) and the workers of a hostfile."""
    return dry(script, tmp_path, HOSTFILE=hostfile(tmp_path, MASTER, *[f"{w} slots=8" for w in workers(nodes)]),
               **NETWORK, **env)


def plan(result: Result) -> list[str]:
    """The plan's node lines: `<address> (<role>): <what runs there>`."""
    return re.findall(r"^\w+\.sh:   ((?:\d+\.\d+\.\d+\.\d+|node-\d+) \((?:head|worker|node)\): .*)$", result.stderr,
                      flags=re.MULTILINE)


def check_job(result: Result) -> dict[str, list[str]]:
    """The cluster check's flags (each may repeat), run before slime's job."""
    cmd = next(c for c in result.commands if "tau2_rl_pipeline.cluster.check" in c)
    argv = cmd[cmd.index("tau2_rl_pipeline.cluster.check") + 1:]
    out: dict[str, list[str]] = {}
    for flag, value in itertools.pairwise(argv):
        if flag.startswith("--"):
            out.setdefault(flag, []).append(value)
    return out


def one_line_error(result: Result) -> str:
    """The one error line of a run that stopped before running anything (a dry run's warnings may come before)."""
    assert result.rc == 1 and result.stdout == "", result.text
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], result.stderr
    return errors[0]


# ---- placement flags and the plan -------------------------------------------------------------------------------
def test_one_node_is_todays_layout(tmp_path: Path) -> None:
    result = dry("train_grpo.sh", tmp_path)
    got = flags(slime_job(result, "train.py")[1])
    assert (got["--actor-num-nodes"], got["--actor-num-gpus-per-node"]) == ("1", "4") and "--colocate" in got
    assert not any(c[0] == "ssh" or "tau2_rl_pipeline.cluster.check" in " ".join(c) for c in result.commands)
    assert plan(result) == ["127.0.0.1 (head): actor ranks 0-3; SGLang engines 0-3 (1 GPU(s) each)"]


@pytest.mark.parametrize("nodes", [2, 4])
def test_the_scripts_start_a_cluster_from_a_hostfile(tmp_path: Path, nodes: int) -> None:
    result = cluster(tmp_path, nodes)
    cmds = result.commands
    head = next(c for c in cmds if c[:3] == ["env", "CUDA_VISIBLE_DEVICES=0,1,2,3", "ray"])
    assert flags(head)["--node-ip-address"] == MASTER and "--head" in head
    joins = [c for c in cmds if c[0] == "ssh" and "ray start" in c[-1]]
    assert [c[-2] for c in joins] == workers(nodes)
    for worker, join in zip(workers(nodes), joins):
        line = join[-1]
        assert line.startswith(f"cd {SLIME} && env ")
        assert f"SLIME_HOST_IP={worker} " in line and "GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo" in line
        assert f"--address {MASTER}:6379 --node-ip-address {worker} --num-gpus 4" in line
    got = flags(slime_job(result, "train.py")[1])
    assert (got["--actor-num-nodes"], got["--actor-num-gpus-per-node"]) == (str(nodes), "4") and "--colocate" in got
    # before slime's job: every node joined and sees the checkpoint it writes and the data it reads
    check = next(i for i, c in enumerate(cmds) if "tau2_rl_pipeline.cluster.check" in c)
    assert check < next(i for i, c in enumerate(cmds) if f"{SLIME}/train.py" in c)
    checked = check_job(result)
    assert checked["--expect"] == [",".join([MASTER, *workers(nodes)])] and checked["--nodes"] == [str(nodes)]
    assert checked["--address"] == [f"{MASTER}:6379"]  # a Ray driver on the head
    assert checked["--interface"] == ["GLOO_SOCKET_IFNAME=lo", "NCCL_SOCKET_IFNAME=lo"]  # each node's, as it joined
    (token,) = checked["--token"]
    assert token.startswith(str(tmp_path / "out/checkpoints/grpo/.tau2-shared-check="))
    assert (checked["--data"], checked["--checkpoint"], checked["--hf-model"]) == (
        [str(tmp_path / "out/data/tasks/tau2_train_all_tasks.jsonl")], [str(tmp_path / "out/checkpoints/rft")],
        [str(tmp_path / "out/models/Qwen3-4B-Instruct-2507")])
    # the EXIT trap stops the workers, then the head
    assert cmds[-1] == ["ray", "stop"] and [c[-2] for c in cmds if c[0] == "ssh" and c[-1] == "ray stop"] == workers(nodes)
    assert len(plan(result)) == nodes and plan(result)[0].startswith(f"{MASTER} (head): actor ranks 0-3; SGLang")
    lines = result.stderr.splitlines()  # one screen: a header, a line per node, the user simulator's, together
    start = next(i for i, line in enumerate(lines) if "cluster plan: " in line)
    assert [line.split(": ", 1)[0] for line in lines[start:start + nodes + 2]] == ["train_grpo.sh"] * (nodes + 2)
    assert "user simulator: " in lines[start + nodes + 1]


@pytest.mark.parametrize("nodes, actor_nodes, rollout", [(2, 1, 4), (4, 2, 8)])
def test_async_grpo_gives_the_actor_the_first_nodes_and_the_rollout_the_rest(tmp_path: Path, nodes: int,
                                                                             actor_nodes: int, rollout: int) -> None:
    result = cluster(tmp_path, nodes, GRPO_ASYNC="1")
    got = flags(slime_job(result, "train_async.py")[1])
    assert (got["--actor-num-nodes"], got["--actor-num-gpus-per-node"]) == (str(actor_nodes), "4")
    assert got["--rollout-num-gpus"] == str(rollout) and "--colocate" not in got
    lines = plan(result)
    assert all("actor ranks" in line and "SGLang" not in line for line in lines[:actor_nodes])
    assert all("SGLang engines" in line and "actor" not in line for line in lines[actor_nodes:])


@pytest.mark.parametrize("script, env", [("train_grpo.sh", {}), ("train_grpo.sh", {"GRPO_ASYNC": "1"}),
                                         ("train_sft.sh", {}), ("train_rft.sh", {})])
@pytest.mark.parametrize("nodes, layout, per_node", [(1, "8", "4"), (2, "8", "4"), (4, "4", "2")])
def test_every_stage_tells_slime_the_gpus_of_a_node(tmp_path: Path, script: str, env: dict[str, str], nodes: int,
                                                   layout: str, per_node: str) -> None:
    """slime's --num-gpus-per-node (default 8) is what its rollout-engine address allocation counts as one node: with
    4 or 2 Ray GPUs per node and the default, the engines of the second node were given the head's host."""
    extra = {"TAU2_GPU_LAYOUT": layout, **env}
    if nodes == 1:
        result = dry(script, tmp_path, **extra)
    else:
        hosts = hostfile(tmp_path, MASTER, *[f"{w} slots={per_node}" for w in workers(nodes)])
        result = dry(script, tmp_path, HOSTFILE=hosts, **NETWORK, **extra)
    (job,) = [c for c in result.commands if any(a.endswith(("/train.py", "/train_async.py")) for a in c)]
    assert job.count("--num-gpus-per-node") == 1 and flags(job)["--num-gpus-per-node"] == per_node


def test_the_plan_follows_slimes_order_by_node_ip(tmp_path: Path) -> None:
    """slime sorts its placement group's GPUs by node IP as numbers: 10.0.0.9 before the head 10.0.0.10."""
    net = {**NETWORK, "MASTER_ADDR": "10.0.0.10", "SLIME_HOST_IP": "10.0.0.10"}
    result = dry("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.9"), GRPO_ASYNC="1", **net)
    assert plan(result) == ["10.0.0.9 (worker): actor ranks 0-3",
                            "10.0.0.10 (head): SGLang engines 0-3 (1 GPU(s) each)"]


def test_engines_span_the_gpus_per_engine(tmp_path: Path) -> None:
    result = cluster(tmp_path, 2, GRPO_ASYNC="1", ROLLOUT_GPUS_PER_ENGINE="2")
    assert plan(result)[1] == "10.0.0.2 (worker): SGLang engines 0-1 (2 GPU(s) each)"
    assert flags(slime_job(result, "train_async.py")[1])["--rollout-num-gpus-per-engine"] == "2"


@pytest.mark.parametrize("script", ["train_sft.sh", "train_rft.sh"])
def test_sft_and_rft_train_on_every_node(tmp_path: Path, script: str) -> None:
    result = cluster(tmp_path, 4, script)
    got = flags(slime_job(result, "train_async.py")[1])
    assert (got["--actor-num-nodes"], got["--actor-num-gpus-per-node"]) == ("4", "4")
    assert "--rollout-num-gpus" not in got and "--colocate" not in got
    assert plan(result)[3] == "10.0.0.4 (worker): actor ranks 12-15"
    saved = "rft" if script == "train_rft.sh" else "sft"
    checked = check_job(result)
    assert checked["--token"][0].startswith(str(tmp_path / f"out/checkpoints/{saved}/"))
    data = "out/data/sft_seed_plus_rft.jsonl" if script == "train_rft.sh" else "out/data/sft_seed.jsonl"
    start = "out/checkpoints/sft" if script == "train_rft.sh" else "out/models/Qwen3-4B-Instruct-2507_torch_dist"
    assert (checked["--data"], checked["--checkpoint"], checked["--hf-model"]) == (  # RFT starts from SFT's checkpoint
        [str(tmp_path / data)], [str(tmp_path / start)], [str(tmp_path / "out/models/Qwen3-4B-Instruct-2507")])


def test_joining_a_running_cluster_starts_and_stops_nothing(tmp_path: Path) -> None:
    result = dry("train_grpo.sh", tmp_path, RAY_ADDRESS="http://10.1.0.1:8265", NUM_NODES="2", GPUS_PER_NODE="8",
                 GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo", TAU2_USER_API_BASE="http://10.1.0.1:30100/v1")
    assert not any("ray" in c and ("start" in c or "stop" in c) for c in result.commands)
    options, argv = slime_job(result, "train.py")
    assert "--address=http://10.1.0.1:8265" in options
    got = flags(argv)
    assert (got["--actor-num-nodes"], got["--actor-num-gpus-per-node"]) == ("2", "8")
    env = runtime_env(options)["env_vars"]
    assert env["MASTER_ADDR"] == "10.1.0.1" and env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    assert any("tau2_rl_pipeline.cluster.check" in " ".join(c) and "--address=http://10.1.0.1:8265" in c for c in result.commands)


def test_joining_a_running_cluster_checks_the_interfaces_on_its_nodes_not_here(tmp_path: Path) -> None:
    """The script may run off the cluster (it submits jobs to RAY_ADDRESS): the interface names are the nodes' to
    have, and the cluster check asks each of them; this machine is not judged."""
    result = dry("train_grpo.sh", tmp_path, RAY_ADDRESS="http://10.1.0.1:8265", NUM_NODES="2", GPUS_PER_NODE="8",
                 GLOO_SOCKET_IFNAME="nosuch0", NCCL_SOCKET_IFNAME="=nosuch", TAU2_USER_API_BASE="http://10.1.0.1:30100/v1")
    assert "nosuch" not in result.stderr
    assert check_job(result)["--interface"] == ["GLOO_SOCKET_IFNAME=nosuch0", "NCCL_SOCKET_IFNAME==nosuch"]


@pytest.mark.parametrize("script, save, init", [
    ("train_grpo.sh", "out/checkpoints/grpo", "out/checkpoints/rft"),
    ("train_sft.sh", "out/checkpoints/sft", "out/models/Qwen3-4B-Instruct-2507_torch_dist")])
def test_the_check_covers_the_checkpoint_the_run_loads(tmp_path: Path, script: str, save: str, init: str) -> None:
    """A fresh run loads the initial checkpoint, a resumed one its own save (the tracker there): the check names the
    one slime's --load names. GRPO's reference model reads the initial one on every start (--ref-load, with
    --use-kl-loss): still checked on a resume."""
    save_dir, init_dir = str(tmp_path / save), str(tmp_path / init)
    fresh = cluster(tmp_path, 2, script)
    entry = "train.py" if script == "train_grpo.sh" else "train_async.py"
    assert check_job(fresh)["--checkpoint"] == [init_dir] == [flags(slime_job(fresh, entry)[1])["--load"]]
    (tmp_path / save).mkdir(parents=True)
    (tmp_path / save / "latest_checkpointed_iteration.txt").write_text("20\n")
    resumed = cluster(tmp_path, 2, script)
    got = flags(slime_job(resumed, entry)[1])
    assert got["--load"] == save_dir and "--finetune" not in got
    if script == "train_grpo.sh":
        assert check_job(resumed)["--checkpoint"] == [save_dir, init_dir] and got["--ref-load"] == init_dir
    else:
        assert check_job(resumed)["--checkpoint"] == [save_dir] and "--ref-load" not in got


def test_each_node_announces_its_own_address(tmp_path: Path) -> None:
    """SLIME_HOST_IP differs per node: never in the job's runtime env (it would be the head's on every node)."""
    options, _ = slime_job(cluster(tmp_path, 2), "train.py")
    env = runtime_env(options)["env_vars"]
    assert "SLIME_HOST_IP" not in env and env["MASTER_ADDR"] == MASTER and env["NCCL_SOCKET_IFNAME"] == "lo"
    assert MASTER in env["no_proxy"].split(",") and "10.0.0.2" in env["no_proxy"].split(",")


# ---- one-line errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lines, says", [
    (["10.0.0.2", "node-3"], "line 2: 'node-3' is not an IPv4 address"),
    (["10.0.0.2 slots=x"], "line 1: 'slots=x' is not slots=N"),
    (["10.0.0.2 slots=2"], "line 1: 10.0.0.2 has slots=2, fewer than the GPUS_PER_NODE=4"),
    (["# the workers", "10.0.0.2", "10.0.0.2"], "line 3: 10.0.0.2 is listed twice"),
    (["10.0.0.2 slots=8 extra"], "line 1: unexpected 'extra'"),
    (["10.0.0.300"], "line 1: '10.0.0.300' is not an IPv4 address"),
    ([MASTER], "lists no worker besides the head"),
])
def test_a_bad_hostfile_line_is_named(tmp_path: Path, lines: list[str], says: str) -> None:
    result = run_script("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, *lines), **NETWORK)
    assert says in one_line_error(result)


def test_a_hostfile_from_windows_with_tabs_blank_lines_and_comments_is_read(tmp_path: Path) -> None:
    """CRLF line ends, a byte-order mark, tabs and spaces around the fields, blank lines, comments: the same cluster
    as the plain file."""
    text = ("\ufeff# nodes\r\n" f"{MASTER}\tslots=8\r\n" "\r\n" "  \t\r\n" " 10.0.0.2  slots=4 \t# worker\r\n"
            "\t10.0.0.3\r\n" "10.0.0.4 slots=8")
    path = tmp_path / "hostfile"
    path.write_bytes(text.encode("utf-8"))
    result = dry("train_grpo.sh", tmp_path, HOSTFILE=str(path), **NETWORK)
    assert [c[-2] for c in result.commands if c[0] == "ssh" and "ray start" in c[-1]] == workers(4)
    assert plan(result) == plan(cluster(tmp_path, 4))


@pytest.mark.parametrize("env, line, says", [
    ({"SLIME_HOST_IP": "10.0.0.9"}, "10.0.0.9", "10.0.0.9 is the head machine (its SLIME_HOST_IP)"),
    ({}, "127.0.0.2", "127.0.0.2 is the head machine (a loopback address is this machine)"),
])
def test_a_worker_line_naming_the_head_machine_is_refused(tmp_path: Path, env: dict[str, str], line: str,
                                                          says: str) -> None:
    result = run_script("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, MASTER, "10.0.0.2", line),
                        **{**NETWORK, **env})
    error = one_line_error(result)
    assert f"line 3: {says}: list each other machine once; the head's own line is MASTER_ADDR={MASTER}" in error


def test_a_worker_line_naming_an_address_of_this_machine_stops_a_real_run(tmp_path: Path) -> None:
    own = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    own = [a for a in own if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", a) and not a.startswith("127.")]
    if not own:
        pytest.skip("hostname -I lists no IPv4 address here")
    stage_inputs(tmp_path / "out")
    calls = tmp_path / "calls"
    result = run_script("train_sft.sh", tmp_path, dry=False, path_prefix=str(fake_cluster_tools(tmp_path)),
                        HOSTFILE=hostfile(tmp_path, own[0]), CALLS=str(calls), **HEAD_HERE)
    assert f"line 1: {own[0]} is the head machine (an address of this machine: hostname -I)" in one_line_error(result)
    assert not calls.exists()  # nothing started
    assert dry("train_sft.sh", tmp_path, HOSTFILE=hostfile(tmp_path, own[0]), **HEAD_HERE)  # a dry run may plan elsewhere


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "SLIME_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"])
def test_a_missing_interface_variable_is_named(tmp_path: Path, missing: str) -> None:
    env = {k: v for k, v in NETWORK.items() if k != missing}
    result = run_script("train_sft.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.2"), **env)
    assert one_line_error(result).startswith(f"train_sft.sh: error: {missing} is not set")


@pytest.mark.parametrize("env, says", [
    ({"NUM_NODES": "2"}, "NUM_NODES=2: list the workers in HOSTFILE"),
    ({"HOSTFILE": "x", "RAY_ADDRESS": "http://10.0.0.1:8265"}, "HOSTFILE and RAY_ADDRESS are both set"),
    ({"RAY_ADDRESS": "10.0.0.1:6379"}, "RAY_ADDRESS=10.0.0.1:6379 must be the cluster's jobs API"),
    ({"GPUS_PER_NODE": "8"}, "GPUS_PER_NODE=8 but each node gives Ray its 4 policy GPUs"),
    ({"RAY_WORKER_LAUNCH": "pdsh"}, "RAY_WORKER_LAUNCH=pdsh is not one of: ssh local"),
])
def test_inconsistent_cluster_settings_are_one_line(tmp_path: Path, env: dict[str, str], says: str) -> None:
    assert says in one_line_error(run_script("train_grpo.sh", tmp_path, **env))


def test_node_count_must_match_the_hostfile(tmp_path: Path) -> None:
    result = run_script("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.2"), NUM_NODES="4", **NETWORK)
    assert "NUM_NODES=4 but HOSTFILE" in one_line_error(result)


def test_async_training_gpus_must_fill_whole_nodes(tmp_path: Path) -> None:
    result = run_script("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.2", "10.0.0.3"), **NETWORK,
                        GRPO_ASYNC="1", GRPO_ASYNC_ROLLOUT_GPUS="6")
    assert "6 training GPUs on nodes of 4: they must fill whole nodes" in one_line_error(result)


def test_a_loopback_user_simulator_is_refused_on_several_nodes(tmp_path: Path) -> None:
    """slime's rollout may run on any node: 127.0.0.1 would be a different machine from each."""
    result = run_script("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.2"),
                        **{**NETWORK, "TAU2_USER_API_BASE": "http://127.0.0.1:30001/v1"})
    assert "user simulator (start it with scripts/start_user_sim.sh) at http://127.0.0.1:30001/v1 is on loopback" \
        in one_line_error(result)


def test_an_interface_this_node_lacks_stops_a_real_run(tmp_path: Path) -> None:
    net = {**NETWORK, "NCCL_SOCKET_IFNAME": "nosuch0"}
    result = run_script("train_sft.sh", tmp_path, dry=False, HOSTFILE=hostfile(tmp_path, "10.0.0.2"), **net)
    assert one_line_error(result).startswith("train_sft.sh: error: NCCL_SOCKET_IFNAME=nosuch0 names no network "
                                             "interface on this node (it has: ")
    warned = dry("train_sft.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.2"), **net)
    assert "warning: NCCL_SOCKET_IFNAME=nosuch0 names no network interface" in warned.stderr
    # NCCL's syntax (tests/test_cluster_net.py has the rules): a prefix names every interface it starts with; ^ excludes
    for value in ("l", "^docker0,lo", "=lo"):
        assert "network interface" not in dry("train_sft.sh", tmp_path, HOSTFILE=hostfile(tmp_path, "10.0.0.2"),
                                    **{**net, "NCCL_SOCKET_IFNAME": value}).stderr
    assert "GLOO_SOCKET_IFNAME=l names no network interface" in run_script("train_sft.sh", tmp_path, dry=False, **{
        **net, "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "l"}).stderr  # Gloo takes exact names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs an ssh client")
def test_a_worker_ssh_cannot_reach_stops_a_real_run_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for path in ("data/sft_seed.jsonl", "models/Qwen3-4B-Instruct-2507/config.json"):
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text("{}\n")
    (out / "models/Qwen3-4B-Instruct-2507_torch_dist").mkdir()
    (tmp_path / "slime").mkdir()
    port = free_port()  # nothing listens there: ssh's connection is refused, for real
    result = run_script("train_sft.sh", tmp_path, dry=False, SLIME_DIR=str(tmp_path / "slime"),
                        HOSTFILE=hostfile(tmp_path, "127.0.0.5"), RAY_SSH=f"ssh -p {port} -o BatchMode=yes",
                        **{**NETWORK, "MASTER_ADDR": "127.0.0.4", "SLIME_HOST_IP": "127.0.0.4"})
    assert result.rc == 1 and "ray" not in result.stdout
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("train_sft.sh: error: worker 127.0.0.5 (HOSTFILE) is not reachable over ssh")
    assert "Connection refused" in error


def test_every_cluster_setting_reaches_the_commands(tmp_path: Path) -> None:
    result = cluster(tmp_path, 2, RAY_JOIN_TIMEOUT="77", RAY_TEMP_DIR="/t/ray", RAY_SSH="ssh -p 2222",
                     RAY_GCS_PORT="16379")
    head = next(c for c in result.commands if "--head" in c)
    assert flags(head)["--temp-dir"] == "/t/ray" and flags(head)["--port"] == "16379"
    (join,) = [c for c in result.commands if c[-1].startswith(f"cd {SLIME} && ")]
    assert join[:4] == ["ssh", "-p", "2222", "10.0.0.2"]
    assert f"--address {MASTER}:16379" in join[-1] and "--temp-dir /t/ray/node-10.0.0.2" in join[-1]
    assert check_job(result)["--timeout"] == ["77"] and check_job(result)["--address"] == [f"{MASTER}:16379"]
    local = cluster(tmp_path, 2, RAY_WORKER_LAUNCH="local")
    (join,) = [c for c in local.commands if c[-1].startswith(f"cd {SLIME} && ")]
    assert join[:2] == ["bash", "-c"] and "--node-ip-address 10.0.0.2" in join[2]
    assert not any(c[:2] == ["bash", "-c"] and c[2] == "ray stop" for c in local.commands)  # the head's stops all


def leash_of(result: Result) -> str | None:
    """The loop the worker's remote command starts after its `ray start` (None: no leash)."""
    (join,) = [c for c in result.commands if c[-1].startswith(f"cd {SLIME} && ")]
    words = shlex.split(join[-1])
    return words[words.index("setsid") + 3] if "setsid" in words else None


def test_each_worker_started_over_ssh_gets_a_leash_to_the_head(tmp_path: Path) -> None:
    """After its `ray start`, a worker runs a loop that stops its Ray once the head's GCS has not answered for
    RAY_HEAD_LOST_TIMEOUT seconds (on the namespaced hosts, a worker whose link is cut is clean that long after:
    tests/contract/test_hosts_faults.py), and ends once its raylet is gone; none where the workers are this machine
    (the head's stop stops them)."""
    loop = leash_of(cluster(tmp_path, 2, RAY_HEAD_LOST_TIMEOUT="45", RAY_GCS_PORT="16379"))
    assert f"/dev/tcp/{MASTER}/16379" in loop and "SECONDS - last >= 45" in loop and "exec ray stop" in loop
    assert "pgrep -x raylet >/dev/null || exit 0" in loop
    assert "SECONDS - last >= 60" in leash_of(cluster(tmp_path, 2))
    assert leash_of(cluster(tmp_path, 2, RAY_WORKER_LAUNCH="local")) is None
    bad = run_script("train_grpo.sh", tmp_path, HOSTFILE=hostfile(tmp_path, MASTER, *workers(2)), **NETWORK,
                     RAY_HEAD_LOST_TIMEOUT="soon")
    assert bad.rc == 1 and "RAY_HEAD_LOST_TIMEOUT=soon must be a positive integer" in bad.stderr


def test_the_readmes_multi_node_command_dry_runs_as_typed(tmp_path: Path) -> None:
    """README's "Beyond one node" commands as pasted: the line that makes the 2-node hostfile, then the dry run, and
    the plan it promises (eth0 may not exist here: a dry run only warns about an interface this machine lacks)."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text().replace("\\\n", " ")
    (make,) = [ln.strip() for ln in text.splitlines() if ln.startswith("    printf ") and ln.endswith("your nodes")]
    subprocess.run(["bash", "-c", make], cwd=tmp_path, check=True, timeout=60)
    (line,) = [ln.strip() for ln in text.splitlines() if ln.startswith("    HOSTFILE=hostfile ")]
    *assignments, bash, script = line.split()
    assert (bash, script) == ("bash", "scripts/train_grpo.sh")
    env = dict(a.split("=", 1) for a in assignments)
    result = dry("train_grpo.sh", tmp_path, **env)
    assert plan(result) == ["10.0.0.1 (head): actor ranks 0-3; SGLang engines 0-3 (1 GPU(s) each)",
                            "10.0.0.2 (worker): actor ranks 4-7; SGLang engines 4-7 (1 GPU(s) each)"]


def test_a_worker_whose_ray_start_fails_is_named_with_its_last_line(tmp_path: Path) -> None:
    """The runner's worker steps (step_worker, step_workers_wait), as a stage plan calls them, with a stand-in `ray`
    that fails as Ray does when the head's GCS cannot be reached (the real one needs a head:
    tests/contract/test_ray_cluster.py)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ray").write_text("#!/bin/sh\necho 'Connecting to 10.0.0.1:6379'\n"
                                "echo 'ConnectionError: could not reach the GCS at 10.0.0.1:6379' >&2\nexit 1\n")
    (bindir / "ray").chmod(0o755)
    driver = ('source "$1/scripts/common.sh"; MASTER_ADDR=10.0.0.1 RAY_GCS_PORT=6379; for ip in 10.0.0.2 10.0.0.3; do '
              'step_worker "${ip}" "${SLIME_DIR}" 0 ray start --address 10.0.0.1:6379; done; step_workers_wait')
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "TAU2_OUT_DIR": str(tmp_path / "out"),
           "SLIME_DIR": str(tmp_path), "HOSTFILE": hostfile(tmp_path, "10.0.0.2", "10.0.0.3"), "RAY_WORKER_LAUNCH": "local",
           **NETWORK}
    proc = subprocess.run(["bash", "-c", driver, "train_grpo.sh", str(Path(__file__).resolve().parents[1])], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == ("train_grpo.sh: error: worker 10.0.0.2 could not join the Ray "
                                                    "cluster at 10.0.0.1:6379: ConnectionError: could not reach the GCS "
                                                    "at 10.0.0.1:6379")


def test_a_head_address_of_another_node_stops_a_real_run_before_anything_starts(tmp_path: Path) -> None:
    if not subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.strip():
        pytest.skip("hostname -I lists no address here")
    out = tmp_path / "out"
    for path in ("data/sft_seed.jsonl", "models/Qwen3-4B-Instruct-2507/config.json"):
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text("{}\n")
    (out / "models/Qwen3-4B-Instruct-2507_torch_dist").mkdir()
    result = run_script("train_sft.sh", tmp_path, dry=False, SLIME_DIR=str(tmp_path),
                        HOSTFILE=hostfile(tmp_path, "203.0.113.2"),
                        **{**NETWORK, "MASTER_ADDR": "203.0.113.1", "SLIME_HOST_IP": "203.0.113.1"})
    assert result.rc == 1 and not any("ray" in c for c in result.commands)
    assert result.stderr.strip().splitlines()[-1].startswith(
        "train_sft.sh: error: MASTER_ADDR=203.0.113.1 is not an address of this node (it has: ")


# ---- a half-started cluster: whatever failed, every host tried is stopped ----------------------------------------
# Stand-ins for the three tools a real start calls, each appending what it was asked to do to $CALLS: `ssh HOST
# LINE` (the last two arguments, as RAY_SSH passes them), `ray`, and `nvidia-smi -L` (ray_start_head checks the GPU
# ids). The worker in $FAIL_START fails its `ray start` as Ray does when the GCS cannot be reached; the worker in
# $LATE_START finishes its start only once that failure has happened (a worker still starting when another fails).
FAKE_SSH = """#!/bin/bash
host="${@: -2:1}" line="${@: -1}"
case "${line}" in
  true) exit 0 ;;
  "ray stop") echo "stop ${host}" >>"${CALLS}" ;;
  *"ray start"*)
    echo "start ${host}" >>"${CALLS}"
    if [[ "${host}" == "${FAIL_START:-}" ]]; then
      touch "${CALLS}.failed"; echo 'ConnectionError: could not reach the GCS' >&2; exit 1
    fi
    if [[ "${host}" == "${LATE_START:-}" ]]; then
      for _ in $(seq 600); do [[ -e "${CALLS}.failed" ]] && break; sleep 0.1; done
    fi
    echo "started ${host}" >>"${CALLS}" ;;
esac
"""
FAKE_RAY = """#!/bin/bash
case "$1 $2" in
  "start --head") echo "start head" >>"${CALLS}"; [[ -z "${FAIL_HEAD:-}" ]] || exit 1 ;;
  "stop "*) echo "stop head" >>"${CALLS}" ;;
  *) echo "ray $*" >>"${CALLS}" ;;
esac
"""


def fake_cluster_tools(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tools = {"ssh": FAKE_SSH, "ray": FAKE_RAY,
             "nvidia-smi": "#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: NVIDIA H100 (UUID: GPU-$i)\"; done\n"}
    for name, text in tools.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return bindir


def stage_inputs(out: Path) -> None:
    for path in ("data/sft_seed.jsonl", "models/Qwen3-4B-Instruct-2507/config.json"):
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text("{}\n")
    (out / "models/Qwen3-4B-Instruct-2507_torch_dist").mkdir()


HEAD_HERE = {**NETWORK, "MASTER_ADDR": "127.0.0.4", "SLIME_HOST_IP": "127.0.0.4"}  # an address of this node


def test_a_failing_first_worker_leaves_no_worker_running(tmp_path: Path) -> None:
    """Three hosts: the first worker's `ray start` fails while the second's is still starting; the second, which
    did start, is stopped after its start ended, then the head; the error names the first."""
    stage_inputs(tmp_path / "out")
    calls, gcs = tmp_path / "calls", free_port()
    result = run_script("train_sft.sh", tmp_path, dry=False, path_prefix=str(fake_cluster_tools(tmp_path)),
                        SLIME_DIR=str(tmp_path), HOSTFILE=hostfile(tmp_path, "127.0.0.5", "127.0.0.6"),
                        RAY_GCS_PORT=str(gcs), RAY_DASHBOARD_PORT=str(free_port()), CALLS=str(calls),
                        FAIL_START="127.0.0.5", LATE_START="127.0.0.6", **HEAD_HERE)
    assert result.rc == 1
    assert result.stderr.strip().splitlines()[-1] == (f"train_sft.sh: error: worker 127.0.0.5 could not join the Ray "
                                                      f"cluster at 127.0.0.4:{gcs}: ConnectionError: could not reach "
                                                      "the GCS")
    log = calls.read_text().splitlines()
    assert log[0] == "start head" and sorted(log[1:3]) == ["start 127.0.0.5", "start 127.0.0.6"]
    assert log[3:] == ["started 127.0.0.6", "stop 127.0.0.5", "stop 127.0.0.6", "stop head"]


def test_a_head_that_fails_to_start_is_stopped_and_no_worker_started(tmp_path: Path) -> None:
    stage_inputs(tmp_path / "out")
    calls = tmp_path / "calls"
    result = run_script("train_sft.sh", tmp_path, dry=False, path_prefix=str(fake_cluster_tools(tmp_path)),
                        SLIME_DIR=str(tmp_path), HOSTFILE=hostfile(tmp_path, "127.0.0.5", "127.0.0.6"),
                        RAY_GCS_PORT=str(free_port()), RAY_DASHBOARD_PORT=str(free_port()), CALLS=str(calls),
                        FAIL_HEAD="1", **HEAD_HERE)
    assert result.rc == 1 and calls.read_text().splitlines() == ["start head", "stop head"]


def test_stopping_the_cluster_twice_stops_each_host_once(tmp_path: Path) -> None:
    """ray_stop_cluster called by a script, then by the EXIT trap: every host stopped once (the head and workers
    started by the runner's steps, over the stand-in ssh)."""
    bindir = fake_cluster_tools(tmp_path)
    driver = ('source "$1/scripts/common.sh"; WORKER_SSH=(ssh); step_head ray start --head; '
              'for ip in 127.0.0.5 127.0.0.6 127.0.0.7; do step_worker "${ip}" "${SLIME_DIR}" 0 ray start; done; '
              'step_workers_wait; ray_stop_cluster; ray_stop_cluster')
    calls = tmp_path / "calls"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "TAU2_OUT_DIR": str(tmp_path / "out"),
           "SLIME_DIR": str(tmp_path), "HOSTFILE": hostfile(tmp_path, "127.0.0.5", "127.0.0.6", "127.0.0.7"),
           "RAY_GCS_PORT": str(free_port()), "RAY_DASHBOARD_PORT": str(free_port()), "CALLS": str(calls), **HEAD_HERE}
    proc = subprocess.run(["bash", "-c", driver, "train_grpo.sh", str(Path(__file__).resolve().parents[1])], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    log = calls.read_text().splitlines()
    assert sorted(line for line in log if line.startswith("stop")) == [
        "stop 127.0.0.5", "stop 127.0.0.6", "stop 127.0.0.7", "stop head"]
    assert log[-1] == "stop head"
