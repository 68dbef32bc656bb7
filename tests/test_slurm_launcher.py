"""The Slurm launcher's decisions (tau2_rl_pipeline/cluster/slurm.py), pure: the node list, the GPUs per node and the
layout's refusal, the Ray ports of each run, the batch script and the dry run of scripts/slurm.sh. The launcher on a
real Slurm (slurmctld, slurmd and munge on namespaced hosts): tests/contract/test_slurm_tier.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from test_scripts import ROOT

from tau2_rl_pipeline.cluster.slurm import (
    Allocation,
    RayPorts,
    Settings,
    SlurmError,
    expand_nodelist,
    gpus_on_node,
    on_head,
    plan_lines,
    policy_gpus,
    ray_ports,
    ray_start_argv,
    refusal,
    render_batch,
    srun_container,
    verdict,
    visible_devices,
)


@pytest.mark.parametrize(("spec", "names"), [
    ("node1", ["node1"]),
    ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
    ("gpu[08-11],login1", ["gpu08", "gpu09", "gpu10", "gpu11", "login1"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("a[7],b-c[1-2]", ["a7", "b-c1", "b-c2"]),
    ("t2s12-h[1,3]", ["t2s12-h1", "t2s12-h3"]),
])
def test_node_lists_expand_as_slurm_writes_them(spec: str, names: list[str]) -> None:
    assert expand_nodelist(spec) == names


@pytest.mark.parametrize("spec", ["", "node[1-", "node[3-1]", "node[a-b]", "n1,,n2", "node]"])
def test_a_bad_node_list_is_one_line(spec: str) -> None:
    with pytest.raises(SlurmError) as caught:
        expand_nodelist(spec)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("env", "gpus"), [
    ({"SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_GPUS": "0,1"}, 8),
    ({"SLURM_JOB_GPUS": "2,3,4,5"}, 4),
    ({"SLURM_GPUS_PER_NODE": "h100:4"}, 4),
    ({"SLURM_GPUS_PER_NODE": "2"}, 2),
    ({}, None),
])
def test_gpus_per_node_come_from_the_jobs_gres(env: dict, gpus: int | None) -> None:
    assert gpus_on_node(env) == gpus


def alloc(nodes: str = "n[1-2]", gpus: str | None = "8", restart: str | None = None) -> Allocation:
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodes}
    if gpus is not None:
        env["SLURM_GPUS_ON_NODE"] = gpus
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = restart
    return Allocation.from_env(env)


def test_the_allocation_is_read_from_slurms_environment() -> None:
    a = alloc(restart="2")
    assert (a.job_id, a.restart, a.nodes, a.gpus_per_node) == (4242, 2, ("n1", "n2"), 8)
    assert alloc().restart == 0  # the first run has no SLURM_RESTART_COUNT
    with pytest.raises(SlurmError, match="SLURM_JOB_ID is not set: run this inside a Slurm allocation"):
        Allocation.from_env({})


@pytest.mark.parametrize(("a", "want", "gpus", "line"), [
    (alloc(), 2, (0, 1, 2, 3), None),
    (alloc(), 3, (0,), "the allocation has 2 node(s) (n1,n2) but the job was planned for 3"),
    (alloc(gpus=None), 2, (0,), "the allocation has no GPUs: ask for them with --gres=gpu:N"),
    (alloc(gpus="2"), 2, (0, 1, 2, 3), "each node has 2 GPU(s) from Slurm but the layout gives Ray GPUs 0,1,2,3"),
    (alloc(nodes="n1,n1"), 2, (0,), "the allocation lists a node twice: n1,n1"),
])
def test_the_allocation_is_checked_against_the_layout(a: Allocation, want: int, gpus: tuple, line: str | None) -> None:
    got = refusal(a, want, gpus)
    assert (got is None) if line is None else (got is not None and got.startswith(line)), got


def test_the_layouts_ray_gpus_follow_the_stage_scripts() -> None:
    assert policy_gpus({}) == (0, 1, 2, 3)
    assert policy_gpus({"TAU2_GPU_LAYOUT": "2"}) == (0,)
    assert policy_gpus({"TAU2_GPU_LAYOUT": "2", "POLICY_GPUS": "4,5"}) == (4, 5)
    with pytest.raises(SlurmError, match="TAU2_GPU_LAYOUT=3 is not one of: 8, 4, 2"):
        policy_gpus({"TAU2_GPU_LAYOUT": "3"})


def test_ray_takes_the_layouts_gpus_among_those_slurm_made_visible() -> None:
    assert visible_devices("4,5,6,7", (0, 1)) == "4,5"
    assert visible_devices(None, (0, 1)) == "0,1"
    with pytest.raises(SlurmError, match="Slurm made 1 GPU"):
        visible_devices("3", (0, 1))


def test_a_requeued_run_never_reuses_its_ray_ports() -> None:
    runs = [ray_ports(4242, r) for r in range(8)]
    used = [p for ports in runs for p in (ports.gcs, ports.dashboard, ports.agent_listen, ports.node_manager)]
    assert len(used) == len(set(used))  # the restarts of one job
    neighbours = {ray_ports(j, 0).gcs for j in range(4242, 4242 + 100)}
    assert len(neighbours) == 100  # and the jobs submitted around it
    assert all(20000 <= p < 32768 for p in used)  # below the kernel's ephemeral ports


def test_ray_start_lines_for_the_head_and_a_worker() -> None:
    ports = RayPorts(20000, 20001, 20002, 20003)
    head = ray_start_argv("10.0.0.1", 4, ports, None)
    assert head[:3] == ["ray", "start", "--block"] and "--head" in head
    assert head[head.index("--port") + 1] == "20000" and head[head.index("--dashboard-port") + 1] == "20001"
    worker = ray_start_argv("10.0.0.2", 4, ports, "10.0.0.1")
    assert worker[worker.index("--address") + 1] == "10.0.0.1:20000" and "--head" not in worker
    assert worker[worker.index("--node-ip-address") + 1] == "10.0.0.2"
    assert worker[worker.index("--node-manager-port") + 1] == "20003"  # inside the run's block


def test_a_node_lost_requeues_the_job_up_to_max_restarts() -> None:
    lost = "worker 10.0.0.2 left the Ray cluster during the job (Ray marked its node dead: ...)"
    assert verdict(0, None, 0, 3) == (False, "the stage ended with status 0")
    assert verdict(2, None, 0, 3) == (False, "the stage ended with status 2")  # a failure of its own: no requeue
    requeue, line = verdict(1, lost, 1, 3)
    assert requeue and line == f"{lost}; requeueing the job (restart 2 of at most 3): it resumes from the stage's last checkpoint"
    requeue, line = verdict(1, lost, 3, 3)
    assert not requeue and line.startswith(f"{lost}; the job has been restarted 3 time(s), --max-restarts 3: it ends")
    assert not verdict(1, lost, 0, 0)[0]  # --no-requeue


def test_the_batch_script_carries_the_settings() -> None:
    settings = Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8, partition="gpu", account="proj",
                        time="24:00:00", container_image="nvcr.io/nvidia/pytorch:24.05", container_mounts="/data:/data",
                        sbatch_lines=("--qos=high",), output_dir="/out/slurm", root="/repo")
    script = render_batch(settings)
    for line in ("#SBATCH --nodes=2", "#SBATCH --gres=gpu:8", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --time=24:00:00",
                 "#SBATCH --qos=high", "#SBATCH --output=/out/slurm/%x-%j.out", "#SBATCH --exclusive"):
        assert line + "\n" in script, line
    assert script.splitlines()[-1] == ("exec python3 -m tau2_rl_pipeline.cluster.slurm run --nodes 2 --python python3 "
                                      "--max-restarts 3 --container-image nvcr.io/nvidia/pytorch:24.05 --container-mounts /data:/data "
                                      "-- train_grpo.sh")
    assert "\ncd " not in script  # the job runs where it was submitted from (sbatch's default), as the stage would
    # every #SBATCH line comes before the first command, as sbatch reads them
    first_command = next(i for i, line in enumerate(script.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(script.splitlines()) if line.startswith("#SBATCH"))
    plain = render_batch(Settings(stage="train_sft.sh", nodes=1, gpus_per_node=4, requeue=False, exclusive=False))
    assert "#SBATCH --no-requeue\n" in plain and "--partition" not in plain and "--container" not in plain
    assert "--exclusive" not in plain and "--max-restarts 0 " in plain  # no requeue: no restart either


def test_with_a_container_every_step_and_the_stage_run_in_it() -> None:
    settings = Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8, container_image="nvcr.io/x/slime:1",
                        container_mounts="/data:/data", root="/repo")
    assert srun_container(settings) == ["--container-image=nvcr.io/x/slime:1", "--container-mounts=/repo,/data:/data",
                                        "--container-workdir=/repo"]
    stage = on_head(settings, "n1", ["bash", "/repo/scripts/train_grpo.sh"])
    assert stage[:5] == ["srun", "--nodes=1", "--ntasks=1", "--overlap", "--nodelist=n1"]
    assert stage[5:8] == srun_container(settings) and stage[8:] == ["bash", "/repo/scripts/train_grpo.sh"]
    bare = Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8, root="/repo")
    assert srun_container(bare) == [] and on_head(bare, "n1", ["bash", "x.sh"]) == ["bash", "x.sh"]


@pytest.mark.parametrize(("settings", "line"), [
    (Settings(stage="pipeline.sh", nodes=2, gpus_per_node=8), "stage 'pipeline.sh' is not one that runs on Ray"),
    (Settings(stage="train_grpo.sh", nodes=0, gpus_per_node=8), "--nodes 0 and --gpus-per-node 8 must be positive"),
    (Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8, sbatch_lines=("qos=high",)), "--sbatch-line 'qos=high'"),
    (Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8, container_mounts="/a:/a"), "--container-mounts needs"),
    (Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8, max_restarts=-1), "--max-restarts -1 must be 0 or more"),
])
def test_bad_settings_are_refused_in_one_line(settings: Settings, line: str) -> None:
    assert (settings.problems() or "").startswith(line)


def test_the_plan_names_each_nodes_part() -> None:
    settings = Settings(stage="train_grpo.sh", nodes=2, gpus_per_node=8)
    lines = plan_lines(settings, alloc(restart="1"), (0, 1, 2, 3))
    assert lines[0].startswith("plan: 2 node(s) x 8 GPU(s) (gres), Ray GPUs 0,1,2,3 of each; job 4242, restart 1")
    assert lines[1].startswith("  n1: Ray head, then the stage") and lines[2].startswith("  n2: Ray worker")
    assert lines[3].endswith("NUM_NODES=2 GPUS_PER_NODE=4 bash scripts/train_grpo.sh")


def door(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "slurm.sh"), *args], capture_output=True, text=True,
                          check=False, env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin", **env})


def test_the_dry_run_prints_the_batch_script_and_the_plan() -> None:
    proc = door("--nodes", "2", "--gpus-per-node", "4", "--time", "2:00:00", "train_grpo.sh", DRY_RUN="1",
                TAU2_OUT_DIR="/nowhere")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash\n#SBATCH --job-name=tau2-grpo\n") and "#SBATCH --time=2:00:00" in proc.stdout
    assert "#SBATCH --output=/nowhere/logs/slurm/%x-%j.out" in proc.stdout
    assert "slurm: plan: 2 node(s) x 4 GPU(s) (gres), Ray GPUs 0,1,2,3 of each" in proc.stderr
    assert "slurm: dry run: not submitted" in proc.stderr
    assert not os.path.exists("/nowhere")


def test_the_door_refuses_a_layout_the_nodes_cannot_hold_in_one_line() -> None:
    proc = door("--nodes", "2", "--gpus-per-node", "2", "train_grpo.sh", DRY_RUN="1")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == ("slurm: error: --gpus-per-node 2 is fewer than the layout's Ray GPUs 0,1,2,3 on each node "
                           "(TAU2_GPU_LAYOUT / POLICY_GPUS)\n")


def test_the_batch_script_on_the_page_is_what_the_dry_run_prints() -> None:
    """docs/multi-node.md ("On Slurm") shows a dry run, command and output: the command run here prints it, this
    checkout's path in place of the page's."""
    text = (ROOT / "docs" / "multi-node.md").read_text()
    block = re.search(r"\n\n((?: {4}\$ .*\n)(?: {4}.*\n)+)", text[text.index("**On Slurm.**"):]).group(1)
    command, *shown = [line[4:] for line in block.splitlines()]
    words = shlex.split(command.removeprefix("$ "))
    env = dict(w.split("=", 1) for w in words[:words.index("bash")])
    assert words[words.index("bash") + 1] == "scripts/slurm.sh"
    proc = door(*words[words.index("bash") + 2:], **env)
    assert proc.returncode == 0, proc.stderr
    printed = (proc.stdout + proc.stderr).replace(str(ROOT), "/shared/tau2-cookbook")
    assert printed.splitlines() == shown
