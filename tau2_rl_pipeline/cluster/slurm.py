"""A stage on a Slurm allocation, from the batch script to a clean teardown.

The batch script comes from settings; inside the allocation a Ray head starts on the first
node and a worker on each other one (`srun -w NODE ray start ... --block`), the unchanged stage script joined to
that cluster through RAY_ADDRESS (it runs the cluster check and the job), then a clean teardown.

Why here and not in the stage scripts: the decisions (which nodes, how many GPUs each, which Ray ports, what the
batch script says) are pure functions of Slurm's environment and the settings, tested directly; the processes are at
the edges (`run_allocation`). scripts/slurm.sh is the door:

    bash scripts/slurm.sh --nodes 2 --gpus-per-node 8 --partition gpu --time 24:00:00 train_grpo.sh

writes the batch script under $LOG_DIR/slurm and submits it with `sbatch`; `DRY_RUN=1` prints the script and the plan
instead. Requeue is resume: the script asks for `--requeue` (unless `--no-requeue`); a job that Slurm requeues after
a node failure starts the stage again on its new nodes, with new Ray ports (a requeued job keeps its SLURM_JOB_ID, so
the ports follow SLURM_RESTART_COUNT too), and the stage resumes from its checkpoint directory as a rerun does. Beside
the stage the launcher runs the cluster watch (cluster/watch.py): a node that leaves the Ray cluster (its link cut
before Slurm calls it DOWN, its raylet or the head's Ray killed) would leave slime's driver waiting with no end, so the
launcher stops the stage and requeues the job itself (`scontrol requeue`), up to --max-restarts times.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tau2_rl_pipeline.cluster.watch import knock

PREFIX = "slurm: "
ROOT = Path(__file__).resolve().parents[2]
# The GPU layouts of scripts/common.sh (TAU2_GPU_LAYOUT): the GPUs each node gives Ray (the policy's). POLICY_GPUS
# overrides them there and here.
LAYOUT_POLICY_GPUS = {"8": (0, 1, 2, 3), "4": (0, 1), "2": (0,)}
STAGES = ("train_sft.sh", "train_rft.sh", "train_grpo.sh")  # the stage scripts whose job runs on the Ray cluster
PORT_BASE, PORT_BLOCKS, PORTS_PER_RUN = 20000, 1000, 8  # below Linux's ephemeral range (32768+), above Ray's workers


class SlurmError(ValueError):
    """A setting or an allocation the launcher refuses: its message is the one line printed."""


# ---- the allocation -------------------------------------------------------------------------------------------
def expand_nodelist(spec: str) -> list[str]:
    """Slurm's compressed host list (`SLURM_JOB_NODELIST`) as names, in order: `gpu[01-03,7],login1` ->
    gpu01, gpu02, gpu03, gpu7, login1. Zero padding is kept; several bracket groups in one name multiply
    (`r[1-2]n[1-2]`)."""
    names: list[str] = []
    for item in _split_top_level(spec.strip()):
        if not item:
            raise SlurmError(f"node list {spec!r} has an empty entry")
        names.extend(_expand_one(item, spec))
    if not names:
        raise SlurmError("the node list is empty")
    return names


def _split_top_level(spec: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    items.append(spec[start:])
    return items


def _expand_one(item: str, spec: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        if "[" in item or "]" in item:
            raise SlurmError(f"node list {spec!r}: unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    out = []
    for part in match.group(1).split(","):
        bounds = part.split("-")
        if len(bounds) == 1 and bounds[0].isdigit():
            numbers = [bounds[0]]
        elif len(bounds) == 2 and all(b.isdigit() for b in bounds) and int(bounds[0]) <= int(bounds[1]):
            width = len(bounds[0])
            numbers = [str(n).zfill(width) for n in range(int(bounds[0]), int(bounds[1]) + 1)]
        else:
            raise SlurmError(f"node list {spec!r}: {part!r} is not a number or a range a-b")
        out.extend(name for n in numbers for name in _expand_one(head + n + tail, spec))
    return out


def gpus_on_node(env: Mapping[str, str]) -> int | None:
    """The GPUs Slurm gave this job on a node, from its gres: SLURM_GPUS_ON_NODE, else the count of SLURM_JOB_GPUS
    (`0,1,2,3`), else SLURM_GPUS_PER_NODE (`[type:]N`); None when the job asked for no GPU."""
    if (value := env.get("SLURM_GPUS_ON_NODE", "").strip()).isdigit():
        return int(value)
    if value := env.get("SLURM_JOB_GPUS", "").strip():
        return len([g for g in value.split(",") if g])
    if match := re.fullmatch(r"(?:[\w.-]+:)?(\d+)", env.get("SLURM_GPUS_PER_NODE", "").strip()):
        return int(match.group(1))
    return None


def policy_gpus(env: Mapping[str, str]) -> tuple[int, ...]:
    """The GPU indices of a node that Ray gets, as the stage scripts choose them: POLICY_GPUS, else the layout's."""
    if value := env.get("POLICY_GPUS", "").strip():
        if not re.fullmatch(r"\d+(,\d+)*", value):
            raise SlurmError(f"POLICY_GPUS={value} must be comma-separated GPU ids, e.g. 0,1")
        return tuple(int(g) for g in value.split(","))
    layout = env.get("TAU2_GPU_LAYOUT", "8")
    if layout not in LAYOUT_POLICY_GPUS:
        raise SlurmError(f"TAU2_GPU_LAYOUT={layout} is not one of: {', '.join(LAYOUT_POLICY_GPUS)}")
    return LAYOUT_POLICY_GPUS[layout]


@dataclass(frozen=True)
class RayPorts:
    """The ports one run's Ray takes on each node. Ray's own defaults are fixed numbers (6379, 8265, 52365) or
    random: a requeued job whose old raylet still holds one on a node (a node cut off and back) would fail to start.
    The raylet's own port (random by default) is kept inside the run's block too."""

    gcs: int
    dashboard: int
    agent_listen: int
    node_manager: int


def ray_ports(job_id: int, restart: int) -> RayPorts:
    """A block of ports per run: the job's id and its restart count pick it, so the runs of one job (up to
    PORTS_PER_RUN restarts in a row) and of neighbouring job ids never share one."""
    block = (job_id * PORTS_PER_RUN + restart % PORTS_PER_RUN) % PORT_BLOCKS
    base = PORT_BASE + block * 10
    return RayPorts(gcs=base, dashboard=base + 1, agent_listen=base + 2, node_manager=base + 3)


@dataclass(frozen=True)
class Allocation:
    """What Slurm gave the job, from the batch script's environment."""

    job_id: int
    restart: int
    nodes: tuple[str, ...]
    gpus_per_node: int | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Allocation:
        job_id = env.get("SLURM_JOB_ID", "")
        if not job_id.isdigit():
            raise SlurmError("SLURM_JOB_ID is not set: run this inside a Slurm allocation (sbatch; bash scripts/slurm.sh)")
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        restart = env.get("SLURM_RESTART_COUNT", "0") or "0"
        if not restart.isdigit():
            raise SlurmError(f"SLURM_RESTART_COUNT={restart} is not a count")
        return cls(int(job_id), int(restart), tuple(expand_nodelist(nodelist)), gpus_on_node(env))


def refusal(alloc: Allocation, want_nodes: int | None, gpus: tuple[int, ...]) -> str | None:
    """Why this allocation cannot run the stage's layout (one line), or None: the node count asked for, and on
    each node the GPUs Ray is to get (indices into the GPUs Slurm gave the job there)."""
    if want_nodes is not None and len(alloc.nodes) != want_nodes:
        return (f"the allocation has {len(alloc.nodes)} node(s) ({','.join(alloc.nodes)}) but the job was planned "
                f"for {want_nodes}")
    if len(set(alloc.nodes)) != len(alloc.nodes):
        return f"the allocation lists a node twice: {','.join(alloc.nodes)}"
    if alloc.gpus_per_node is None:
        return "the allocation has no GPUs: ask for them with --gres=gpu:N (scripts/slurm.sh --gpus-per-node N)"
    if max(gpus) >= alloc.gpus_per_node:
        return (f"each node has {alloc.gpus_per_node} GPU(s) from Slurm but the layout gives Ray GPUs "
                f"{','.join(map(str, gpus))} (TAU2_GPU_LAYOUT / POLICY_GPUS): ask for at least {max(gpus) + 1} "
                "a node")
    return None


def visible_devices(step_visible: str | None, gpus: tuple[int, ...]) -> str:
    """CUDA_VISIBLE_DEVICES for Ray on a node: the layout's GPU indices taken from the devices Slurm made visible to
    the step (its own CUDA_VISIBLE_DEVICES, which need not start at 0), or the indices themselves without one."""
    if not step_visible:
        return ",".join(map(str, gpus))
    devices = [d for d in step_visible.split(",") if d]
    if max(gpus) >= len(devices):
        raise SlurmError(f"Slurm made {len(devices)} GPU(s) visible to this step ({step_visible}), the layout needs "
                         f"{','.join(map(str, gpus))}")
    return ",".join(devices[g] for g in gpus)


def verdict(rc: int, lost: str | None, restart: int, max_restarts: int) -> tuple[bool, str]:
    """After a run: (requeue?, the line that says why). A node that left the Ray cluster (the watch's line) is a
    fault the checkpoint heals: the job goes back to Slurm's queue and resumes there, up to max_restarts times in all
    (SLURM_RESTART_COUNT counts Slurm's own requeues too). Anything else ends the job with the stage's status."""
    if lost is None:
        return False, f"the stage ended with status {rc}"
    if restart >= max_restarts:
        return False, (f"{lost}; the job has been restarted {restart} time(s), --max-restarts {max_restarts}: "
                       "it ends here; sbatch its script again to resume from the last checkpoint")
    return True, (f"{lost}; requeueing the job (restart {restart + 1} of at most {max_restarts}): it resumes from "
                  "the stage's last checkpoint")


# ---- the batch script -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """What the batch script asks Slurm for, and what the launcher runs in it."""

    stage: str
    nodes: int
    gpus_per_node: int
    partition: str = ""
    account: str = ""
    time: str = ""
    container_image: str = ""
    container_mounts: str = ""
    sbatch_lines: tuple[str, ...] = ()
    requeue: bool = True
    max_restarts: int = 3
    exclusive: bool = True
    output_dir: str = ""
    root: str = str(ROOT)
    python: str = "python3"
    stage_args: tuple[str, ...] = field(default_factory=tuple)

    def problems(self) -> str | None:
        if self.stage not in STAGES:
            return f"stage {self.stage!r} is not one that runs on Ray (one of: {', '.join(STAGES)})"
        if self.nodes < 1 or self.gpus_per_node < 1:
            return f"--nodes {self.nodes} and --gpus-per-node {self.gpus_per_node} must be positive"
        for line in self.sbatch_lines:
            if not line.startswith("-") or "\n" in line:
                return f"--sbatch-line {line!r} must be one sbatch option, e.g. --qos=high"
        if self.max_restarts < 0:
            return f"--max-restarts {self.max_restarts} must be 0 or more"
        if self.container_mounts and not self.container_image:
            return "--container-mounts needs --container-image"
        return None


def srun_container(settings: Settings) -> list[str]:
    """The options that run a step in the container (pyxis's srun options), or none."""
    if not settings.container_image:
        return []
    out = [f"--container-image={settings.container_image}"]
    mounts = ",".join(m for m in (settings.root, settings.container_mounts) if m)
    return [*out, f"--container-mounts={mounts}", f"--container-workdir={settings.root}"]


def on_head(settings: Settings, head: str, argv: list[str]) -> list[str]:
    """A command of the launcher's on the first node (the stage script, the cluster watch): in the batch script
    itself, or in the container (a step beside the head's Ray step) when there is one."""
    if not settings.container_image:
        return argv
    return ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={head}", *srun_container(settings), *argv]


def run_argv(settings: Settings) -> list[str]:
    """The launcher's command in the batch script, with the settings it needs in the allocation."""
    argv = [settings.python, "-m", "tau2_rl_pipeline.cluster.slurm", "run", "--nodes", str(settings.nodes),
            "--python", settings.python, "--max-restarts", str(settings.max_restarts if settings.requeue else 0)]
    if settings.container_image:
        argv += ["--container-image", settings.container_image]
    if settings.container_mounts:
        argv += ["--container-mounts", settings.container_mounts]
    return [*argv, "--", settings.stage, *settings.stage_args]


def render_batch(settings: Settings) -> str:
    """The batch script: #SBATCH lines from the settings, then the launcher with this checkout on PYTHONPATH. The
    submitting shell's environment (the stage's settings) reaches the job: sbatch's default --export=ALL."""
    name = settings.stage.removesuffix(".sh").removeprefix("train_")
    lines = ["#!/bin/bash", f"#SBATCH --job-name=tau2-{name}", f"#SBATCH --nodes={settings.nodes}",
             "#SBATCH --ntasks-per-node=1", f"#SBATCH --gres=gpu:{settings.gpus_per_node}"]
    if settings.exclusive:
        lines.append("#SBATCH --exclusive")
    lines.append("#SBATCH --requeue" if settings.requeue else "#SBATCH --no-requeue")
    # a requeued run appends to the first one's output, so the job's whole story is in one file
    lines.append("#SBATCH --open-mode=append")
    if settings.output_dir:
        lines.append(f"#SBATCH --output={settings.output_dir}/%x-%j.out")
    for option, value in (("partition", settings.partition), ("account", settings.account),
                          ("time", settings.time)):
        if value:
            lines.append(f"#SBATCH --{option}={value}")
    lines += [f"#SBATCH {line}" for line in settings.sbatch_lines]
    lines += ["# Written by scripts/slurm.sh (tau2_rl_pipeline/cluster/slurm.py); sbatch it again to rerun.",
              "set -euo pipefail",
              f'export PYTHONPATH={shlex.quote(settings.root)}"${{PYTHONPATH:+:${{PYTHONPATH}}}}"',
              f"exec {shlex.join(run_argv(settings))}", ""]
    return "\n".join(lines)


def plan_lines(settings: Settings, alloc: Allocation | None, gpus: tuple[int, ...]) -> list[str]:
    """What the job will do, node by node: from the allocation inside it, from the settings before it exists."""
    nodes = list(alloc.nodes) if alloc else [f"node-{i}" for i in range(settings.nodes)]
    ports = ray_ports(alloc.job_id, alloc.restart) if alloc else None
    where = (f"job {alloc.job_id}, restart {alloc.restart} (SLURM_RESTART_COUNT)" if alloc else
             "the allocation's nodes in Slurm's order")
    port_text = (f"GCS port {ports.gcs}, dashboard {ports.dashboard}" if ports else
                 "Ray ports from SLURM_JOB_ID and SLURM_RESTART_COUNT")
    per_node = alloc.gpus_per_node if alloc else settings.gpus_per_node
    out = [f"plan: {len(nodes)} node(s) x {per_node} GPU(s) (gres), Ray GPUs {','.join(map(str, gpus))} "
           f"of each; {where}; {port_text}"]
    for i, node in enumerate(nodes):
        role = "Ray head, then the stage" if i == 0 else "Ray worker"
        out.append(f"  {node}: {role} (srun --nodes=1 --ntasks=1 -w {node} ray start ... --block)")
    out.append(f"  then: RAY_ADDRESS=http://<head>:<dashboard> NUM_NODES={len(nodes)} GPUS_PER_NODE={len(gpus)} "
               f"bash scripts/{shlex.join([settings.stage, *settings.stage_args])}")
    return out


# ---- in the allocation ----------------------------------------------------------------------------------------
def say(line: str) -> None:
    print(PREFIX + line, file=sys.stderr, flush=True)


def ray_start_argv(ip: str, gpus: int, ports: RayPorts, head_ip: str | None) -> list[str]:
    """`ray start --block` for one node: the head (head_ip None) or a worker joining it."""
    argv = ["ray", "start", "--block", "--node-ip-address", ip, "--num-gpus", str(gpus), "--disable-usage-stats",
            "--dashboard-agent-listen-port", str(ports.agent_listen), "--node-manager-port", str(ports.node_manager)]
    if head_ip is None:
        return [*argv, "--head", "--port", str(ports.gcs), "--dashboard-host", "0.0.0.0",
                "--dashboard-port", str(ports.dashboard)]
    return [*argv, "--address", f"{head_ip}:{ports.gcs}"]


def node_main(args: argparse.Namespace) -> int:
    """In a node's srun step: Ray on the layout's GPUs of those Slurm made visible to the step, this node's own
    SLIME_HOST_IP, in the foreground (the step ends with it)."""
    gpus = tuple(int(g) for g in args.gpus.split(","))
    try:
        devices = visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    except SlurmError as exc:
        say(f"error: {exc}")
        return 1
    os.environ.update(CUDA_VISIBLE_DEVICES=devices, SLIME_HOST_IP=args.ip)
    ports = RayPorts(*(int(p) for p in args.ports.split(",")))
    argv = ray_start_argv(args.ip, len(gpus), ports, args.head_ip)
    os.execvp(argv[0], argv)
    return 1  # not reached


WATCH_PREFIX, WATCH_LOST = "cluster watch: ", 3  # tau2_rl_pipeline/cluster/watch.py's line and exit status
WATCH_GRACE_S = 20
REQUEUE_WAIT_S = 300
READY = "Ray runtime started"  # what `ray start` prints once the node's Ray (the head's: GCS, dashboard) is up


class Job:
    """The processes of one run in the allocation: the nodes' Ray steps and the stage; `stop()` ends them all."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, subprocess.Popen]] = []
        self.ready: set[str] = set()
        self.stage: subprocess.Popen | None = None
        self.watch: subprocess.Popen | None = None

    def srun(self, node: str, argv: list[str], settings: Settings) -> subprocess.Popen:
        """A step on one node, its output passed on to the job's (and read for READY)."""
        step = ["srun", "--nodes=1", "--ntasks=1", "--overlap", f"--nodelist={node}", f"--job-name=ray-{node}",
                *srun_container(settings), *argv]
        say(f"+ {shlex.join(step)}")
        proc = subprocess.Popen(step, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
        self.steps.append((node, proc))
        threading.Thread(target=self._relay, args=(node, proc), daemon=True).start()
        return proc

    def _relay(self, node: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            sys.stderr.write(line)
            if READY in line:
                self.ready.add(node)
        sys.stderr.flush()

    def stop(self, grace_s: float = 20) -> None:
        """The stage first (its own EXIT trap ends its job), then each node's Ray step (srun passes SIGTERM on to
        `ray start --block`, which stops that node's Ray); SIGKILL after the grace."""
        procs = ([self.stage] if self.stage else []) + [p for _, p in self.steps]
        for proc in procs:
            if proc.poll() is None:
                try:
                    if proc is self.stage:
                        os.killpg(proc.pid, signal.SIGTERM)
                    elif proc is self.watch:  # a Ray driver that only reads: Ray's exit handlers would abort it
                        proc.kill()
                    else:
                        proc.terminate()
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for_head(job: Job, head: str, ip: str, ports: RayPorts, limit_s: float) -> str | None:
    """Until the head's Ray says it started and its GCS answers: None, or why not (one line)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for _, proc in job.steps):
            node = next(n for n, p in job.steps if p.poll() is not None)
            return f"Ray on {node} ended before the cluster was up (see its lines above)"
        if head in job.ready and knock(ip, ports.gcs, 3):
            return None
        time.sleep(1)
    return f"the Ray head at {ip}:{ports.gcs} did not start within {limit_s:.0f} s (RAY_JOIN_TIMEOUT)"


def run_watched(job: Job, nodes: set[str], watch_argv: list[str]) -> tuple[int, str | None]:
    """Wait for the stage with the cluster watch beside it (tau2_rl_pipeline/cluster/watch.py, started once every
    node's Ray has started): (the stage's status, the watch's line naming the node that left the Ray cluster, or
    None). A node lost stops the stage, which would otherwise wait on it with no end; a stage that fails by itself
    gives the watch WATCH_GRACE_S to say whether a node's loss is why."""
    watch: subprocess.Popen | None = None
    watching, failed_at = True, None
    while True:
        rc = job.stage.poll()
        if watching and watch is None and nodes <= job.ready:
            say(f"+ {shlex.join(watch_argv)}")
            watch = subprocess.Popen(watch_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace")
            job.steps.append(("watch", watch))
            job.watch = watch
        if watching and watch is not None and watch.poll() is not None:
            said = [line.removeprefix(WATCH_PREFIX) for line in watch.stdout.read().splitlines()
                    if line.startswith(WATCH_PREFIX)]
            if watch.returncode == WATCH_LOST and said:
                job.stop()
                return (job.stage.returncode or 1), said[-1]
            say(f"warning: the cluster watch ended without a verdict ({said[-1:] or watch.returncode}); "
                "the stage goes on unwatched")
            watching = False
        if rc is not None:
            failed_at = failed_at or time.monotonic()
            if rc == 0 or not watching or watch is None or time.monotonic() - failed_at > WATCH_GRACE_S:
                return rc, None
        time.sleep(1)


def run_allocation(settings: Settings, env: Mapping[str, str]) -> int:
    alloc = Allocation.from_env(env)
    gpus = policy_gpus(env)
    if why := refusal(alloc, settings.nodes, gpus):
        raise SlurmError(why)
    ports = ray_ports(alloc.job_id, alloc.restart)
    for line in plan_lines(settings, alloc, gpus):
        say(line)
    try:
        ips = {node: socket.gethostbyname(node) for node in alloc.nodes}
    except OSError as exc:
        raise SlurmError(f"cannot resolve the allocation's node names ({exc}): every node must resolve the others") \
            from exc
    head, head_ip = alloc.nodes[0], ips[alloc.nodes[0]]
    job = Job()

    def on_signal(signum, _frame):  # Slurm's SIGTERM on scancel, requeue or time limit
        say(f"got signal {signum} (job {alloc.job_id}, restart {alloc.restart}): stopping the stage and Ray")
        job.stop()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    me = [settings.python, "-m", "tau2_rl_pipeline.cluster.slurm", "node", "--gpus", ",".join(map(str, gpus)),
          "--ports", ",".join(map(str, (ports.gcs, ports.dashboard, ports.agent_listen, ports.node_manager)))]
    try:
        job.srun(head, [*me, "--ip", head_ip], settings)
        limit = float(env.get("RAY_JOIN_TIMEOUT", "120"))
        if why := wait_for_head(job, head, head_ip, ports, limit):
            raise SlurmError(why)
        for node in alloc.nodes[1:]:
            job.srun(node, [*me, "--ip", ips[node], "--head-ip", head_ip], settings)
        stage_env = {**env, "RAY_ADDRESS": f"http://{head_ip}:{ports.dashboard}", "MASTER_ADDR": head_ip,
                     "NUM_NODES": str(len(alloc.nodes)), "GPUS_PER_NODE": str(len(gpus))}
        stage = on_head(settings, head, ["bash", str(Path(settings.root) / "scripts" / settings.stage),
                                         *settings.stage_args])
        say(f"+ {shlex.join(stage)}  (RAY_ADDRESS={stage_env['RAY_ADDRESS']})")
        started = time.monotonic()
        job.stage = subprocess.Popen(stage, env=stage_env, stdin=subprocess.DEVNULL, start_new_session=True)
        watch = on_head(settings, head, [settings.python, "-m", "tau2_rl_pipeline.cluster.watch", "--address",
                                         f"{head_ip}:{ports.gcs}", "--expect", ",".join(ips[n] for n in alloc.nodes)])
        rc, lost = run_watched(job, set(alloc.nodes), watch)
        requeue, line = verdict(rc, lost, alloc.restart, settings.max_restarts)
        say(f"{line} (after {time.monotonic() - started:.0f} s)")
        if not requeue:
            return rc
        job.stop()  # nothing of this run stays; then Slurm ends the batch script (SIGTERM) and queues the job again
        asked = subprocess.run(["scontrol", "requeue", str(alloc.job_id)], capture_output=True, text=True, check=False)
        if asked.returncode != 0:
            raise SlurmError(f"scontrol requeue {alloc.job_id} failed: {(asked.stderr or asked.stdout).strip()}")
        time.sleep(REQUEUE_WAIT_S)
        raise SlurmError(f"Slurm did not requeue job {alloc.job_id} within {REQUEUE_WAIT_S} s of scontrol requeue")
    finally:
        job.stop()


# ---- the door ---------------------------------------------------------------------------------------------------
def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(stage=args.stage, nodes=args.nodes, gpus_per_node=args.gpus_per_node, partition=args.partition,
                    account=args.account, time=args.time, container_image=args.container_image,
                    container_mounts=args.container_mounts, sbatch_lines=tuple(args.sbatch_line),
                    requeue=args.requeue, max_restarts=args.max_restarts, exclusive=args.exclusive, output_dir=args.output_dir,
                    python=args.python, stage_args=tuple(args.stage_args))


def submit_main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Write the batch script and submit it (DRY_RUN=1: print it and the plan)."""
    log_dir = Path(env.get("LOG_DIR") or Path(env.get("TAU2_OUT_DIR") or ROOT / "outputs") / "logs") / "slurm"
    args.output_dir = args.output_dir or str(log_dir.resolve())
    settings = settings_from(args)
    if why := settings.problems():
        raise SlurmError(why)
    gpus = policy_gpus(env)
    if max(gpus) >= settings.gpus_per_node:
        raise SlurmError(f"--gpus-per-node {settings.gpus_per_node} is fewer than the layout's Ray GPUs "
                         f"{','.join(map(str, gpus))} on each node (TAU2_GPU_LAYOUT / POLICY_GPUS)")
    script = render_batch(settings)
    if env.get("DRY_RUN", "0") == "1":
        print(script, end="")
        for line in plan_lines(settings, None, gpus):
            say(line)
        say("dry run: not submitted (sbatch FILE)")
        return 0
    for folder in (log_dir, Path(settings.output_dir)):  # sbatch writes the output only into a folder that exists
        folder.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{settings.stage.removesuffix('.sh')}.sbatch"
    path.write_text(script)
    proc = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SlurmError(f"sbatch {path} failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    job_id = proc.stdout.strip().split(";")[0]
    say(f"submitted job {job_id}: sbatch {path} (output: {settings.output_dir}/tau2-"
        f"{settings.stage.removesuffix('.sh').removeprefix('train_')}-{job_id}.out)")
    print(job_id)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bash scripts/slurm.sh", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    submit = sub.add_parser("submit", help="write the batch script and sbatch it (DRY_RUN=1 prints it)")
    submit.add_argument("--nodes", type=int, default=1, help="nodes of the allocation (default 1)")
    submit.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node asked of Slurm (--gres=gpu:N)")
    submit.add_argument("--partition", default="")
    submit.add_argument("--account", default="")
    submit.add_argument("--time", default="", help="the job's time limit, as sbatch takes it (e.g. 24:00:00)")
    submit.add_argument("--container-image", default="", help="run each step in this image (pyxis's srun option)")
    submit.add_argument("--container-mounts", default="", help="pyxis mounts besides this checkout (SRC:DST,...)")
    submit.add_argument("--sbatch-line", action="append", default=[], help="one more #SBATCH option (repeatable)")
    submit.add_argument("--no-requeue", dest="requeue", action="store_false",
                        help="a node failure ends the job (default: Slurm requeues it and the stage resumes)")
    submit.add_argument("--max-restarts", type=int, default=3,
                        help="how often a node lost from the Ray cluster may requeue the job (default 3)")
    submit.add_argument("--shared-nodes", dest="exclusive", action="store_false",
                        help="do not ask for whole nodes (--exclusive)")
    submit.add_argument("--output-dir", default="", help="where the job's output goes (default $LOG_DIR/slurm)")
    submit.add_argument("--python", default="python3", help="the interpreter that runs the launcher on the nodes")
    submit.add_argument("stage", help="a stage script of scripts/, e.g. train_grpo.sh")
    submit.add_argument("stage_args", nargs=argparse.REMAINDER)
    run = sub.add_parser("run", help="inside the allocation (the batch script): Ray across it, then the stage")
    run.add_argument("--nodes", type=int, required=True)
    run.add_argument("--container-image", default="")
    run.add_argument("--container-mounts", default="")
    run.add_argument("--python", default="python3")
    run.add_argument("--max-restarts", type=int, default=0)
    run.add_argument("stage")
    run.add_argument("stage_args", nargs=argparse.REMAINDER)
    node = sub.add_parser("node", help="in a node's srun step: ray start --block on the layout's GPUs")
    node.add_argument("--gpus", required=True)
    node.add_argument("--ports", required=True)
    node.add_argument("--ip", required=True)
    node.add_argument("--head-ip", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.cmd == "submit":
            return submit_main(args, os.environ)
        if args.cmd == "node":
            return node_main(args)
        stage_args = [a for a in args.stage_args if a != "--"]
        settings = Settings(stage=args.stage, nodes=args.nodes, gpus_per_node=1,
                            container_image=args.container_image, container_mounts=args.container_mounts,
                            python=args.python, max_restarts=args.max_restarts, stage_args=tuple(stage_args))
        return run_allocation(settings, os.environ)
    except SlurmError as exc:
        say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
