"""The nodes a slime stage runs on, where slime places its actor and engines there, and the Ray commands.

On slime's conventions (its scripts/run-qwen3-235B-A22B.sh and docs "Multi-Node Training"): a Ray head on this node,
`ray start --address` on each worker, slime's job submitted from the head. One node (default); HOSTFILE=FILE (the
head here, MASTER_ADDR, and a worker on each other node the file lists, started over ssh, or here with
RAY_WORKER_LAUNCH=local: a cluster on loopback addresses); RAY_ADDRESS=URL (a cluster that is up, e.g. Slurm's or
KubeRay's: its jobs API; nothing is started or stopped, NUM_NODES and GPUS_PER_NODE say what it holds). Every node
gives Ray the same GPUS_PER_NODE GPUs (POLICY_GPUS). The order slime places GPUs in is scale/placement.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tau2_rl_pipeline.launch.machine import Machine
from tau2_rl_pipeline.launch.settings import GpuLayout, Reader, Refused, positive
from tau2_rl_pipeline.scale.placement import node_shares

IFNAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
NODE_LINE = "one node per line: ADDRESS [slots=N]"


def is_ipv4(addr: str) -> bool:
    return bool(re.fullmatch(r"[0-9]{1,3}(\.[0-9]{1,3}){3}", addr)) and all(int(o) <= 255 for o in addr.split("."))


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster of a stage: its nodes, how they are reached, and the network settings slime needs."""

    nodes: int
    gpus_per_node: int
    policy_gpus: str
    master: str
    workers: tuple[str, ...] = ()
    ray_address: str = ""
    launch: str = "ssh"  # RAY_WORKER_LAUNCH
    ssh: tuple[str, ...] = ()
    join_timeout: int = 120
    temp_dir: str = ""
    gcs_port: int = 6379
    dashboard_port: int = 8265
    head_lost_timeout: int = 60
    interfaces: tuple[str, ...] = ()  # the set GLOO_/NCCL_SOCKET_IFNAME, as NAME=VALUE
    network: dict[str, str] = field(default_factory=dict)  # SLIME_HOST_IP and the interface variables that are set

    @property
    def joined(self) -> bool:
        return bool(self.ray_address)

    @property
    def jobs_api(self) -> str:
        return self.ray_address.rstrip("/") if self.joined else f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def on_loopback(self) -> bool:
        """All nodes loopback addresses of this one machine (several raylets here)."""
        return all(a.startswith("127.") for a in (self.master, *self.workers))


def read_cluster(r: Reader, gpus: GpuLayout, machine: Machine) -> Cluster:
    """The cluster of the settings, refused in one line where they disagree (cluster.sh's rules, in its order)."""
    hostfile, ray_address = r.get("HOSTFILE"), r.get("RAY_ADDRESS")
    launch = r.choice("RAY_WORKER_LAUNCH", "ssh", ("ssh", "local"))
    join_timeout = r.uint("RAY_JOIN_TIMEOUT", 120)
    if hostfile and ray_address:
        raise Refused("HOSTFILE and RAY_ADDRESS are both set: start a cluster from a hostfile or join one that is up, "
                      "not both")
    if ray_address and not re.fullmatch(r"https?://[^/]+:[0-9]+/?", ray_address):
        raise Refused(f"RAY_ADDRESS={ray_address} must be the cluster's jobs API, e.g. http://10.0.0.1:8265")
    per_node = r.uint("GPUS_PER_NODE", gpus.num_policy)
    if not ray_address and per_node != gpus.num_policy:
        raise Refused(f"GPUS_PER_NODE={per_node} but each node gives Ray its {gpus.num_policy} policy GPUs "
                      f"(POLICY_GPUS={gpus.policy}); set POLICY_GPUS or TAU2_GPU_LAYOUT instead")
    master = r.get("MASTER_ADDR")
    workers: list[str] = []
    nodes_set = r.get("NUM_NODES")
    if hostfile:
        if not master:
            raise Refused("MASTER_ADDR is not set: with HOSTFILE it is this node's (the Ray head's) address")
        hostfile = r.absolute(hostfile)
        workers = read_hostfile(hostfile, per_node, master, r, launch, machine)
        if not workers:
            raise Refused(f"HOSTFILE {hostfile} lists no worker besides the head (MASTER_ADDR={master})")
        if nodes_set and nodes_set != str(len(workers) + 1):
            raise Refused(f"NUM_NODES={nodes_set} but HOSTFILE {hostfile} holds the head and {len(workers)} worker(s)")
        nodes_set = str(len(workers) + 1)
    nodes = positive("NUM_NODES", nodes_set or "1")
    if not hostfile and not ray_address and nodes > 1:
        raise Refused(f"NUM_NODES={nodes}: list the workers in HOSTFILE (the scripts start them) or join a running "
                      "cluster with RAY_ADDRESS")
    if nodes > 1:
        if ray_address:
            master = master or ray_address.split("://", 1)[1].split(":")[0]
        for name in ("SLIME_HOST_IP", *IFNAMES) if not ray_address else IFNAMES:
            if not r.get(name):
                raise Refused(f"{name} is not set: a {nodes}-node run needs it (see docs/multi-node.md)")
        if not is_ipv4(master) and not ray_address:
            raise Refused(f"MASTER_ADDR={master} must be the head's IPv4 address")
        if r.get("SLIME_HOST_IP") and not is_ipv4(r.get("SLIME_HOST_IP")):
            raise Refused(f"SLIME_HOST_IP={r.get('SLIME_HOST_IP')} must be an IPv4 address")
    interfaces = tuple(f"{n}={r.get(n)}" for n in IFNAMES if r.get(n))
    if interfaces and not ray_address:  # this node, before Ray starts; the cluster check asks every node later
        for setting in interfaces:
            if why := machine.interface_problem(setting):
                r.problem(why)
                break
    network = {n: r.get(n) for n in ("SLIME_HOST_IP", *IFNAMES) if r.get(n)}
    return Cluster(nodes=nodes, gpus_per_node=per_node, policy_gpus=gpus.policy, master=master,
                   workers=tuple(workers), ray_address=ray_address, launch=launch,
                   ssh=tuple(r.get("RAY_SSH", "ssh -o BatchMode=yes -o ConnectTimeout=10").split()),
                   join_timeout=join_timeout, temp_dir=r.get("RAY_TEMP_DIR"), gcs_port=r.uint("RAY_GCS_PORT", 6379),
                   dashboard_port=r.uint("RAY_DASHBOARD_PORT", 8265),
                   head_lost_timeout=r.uint("RAY_HEAD_LOST_TIMEOUT", 60), interfaces=interfaces, network=network)


def read_hostfile(path: str, per_node: int, master: str, r: Reader, launch: str, machine: Machine) -> list[str]:
    """The workers of a hostfile: `ADDRESS [slots=N]` a line as in slime's mpi hostfile, '#' comments, blank lines,
    Windows line ends and a byte-order mark ignored, the head's own line (MASTER_ADDR) skipped. A bad line is
    refused naming it; so is a worker line that is the head machine by another of its addresses."""
    if not machine.is_file(path):
        raise Refused(f"HOSTFILE not found: {path}")
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    seen: list[str] = []
    workers = []
    for number, line in enumerate(lines, 1):
        line = line.replace("\r", "")
        if number == 1:
            line = line.removeprefix("\ufeff")
        words = line.split("#", 1)[0].split(None, 2)
        if not words:
            continue
        addr, slots, extra = (words + ["", ""])[:3]
        where = f"HOSTFILE {path} line {number}"
        if not is_ipv4(addr):
            raise Refused(f"{where}: '{addr}' is not an IPv4 address ({NODE_LINE})")
        if extra:
            raise Refused(f"{where}: unexpected '{extra.strip()}' after the slots ({NODE_LINE})")
        if slots:
            m = re.fullmatch(r"slots=([1-9][0-9]*)", slots)
            if not m:
                raise Refused(f"{where}: '{slots}' is not slots=N")
            if int(m[1]) < per_node:
                raise Refused(f"{where}: {addr} has slots={m[1]}, fewer than the GPUS_PER_NODE={per_node} Ray GPUs "
                              "each node gives")
        if addr in seen:
            raise Refused(f"{where}: {addr} is listed twice")
        seen.append(addr)
        if addr == master:
            continue
        if head := head_machine(addr, master, r, launch, machine):
            raise Refused(f"{where}: {addr} is the head machine ({head}): list each other machine once; the head's own "
                          f"line is MASTER_ADDR={master}")
        workers.append(addr)
    return workers


def head_machine(addr: str, master: str, r: Reader, launch: str, machine: Machine) -> str:
    """Why worker address `addr` is the head machine itself, or ''."""
    if addr == r.get("SLIME_HOST_IP"):
        return "its SLIME_HOST_IP"
    if addr.startswith("127.") and not master.startswith("127."):
        return "a loopback address is this machine"
    if not r.dry and launch == "ssh" and addr in (machine.own_addresses() or []):
        return "an address of this machine: hostname -I"
    return ""


# ---- slime's placement ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where slime puts the actor and the rollout: mode train (SFT, RFT), colocate (synchronous GRPO: every GPU
    trains and rolls out) or split (asynchronous GRPO: `rollout_gpus` serve SGLang, the rest train)."""

    mode: str
    actor_nodes: int
    actor_gpus_per_node: int
    rollout_gpus: int
    node_gpus: int

    @property
    def actor_gpus(self) -> int:
        return self.actor_nodes * self.actor_gpus_per_node

    def flags(self) -> list[str]:
        """slime's placement flags. --num-gpus-per-node on every stage: slime's default is 8, and its engine address
        allocation (slime/ray/rollout.py) counts that many GPUs as one node, so with fewer Ray GPUs per node the
        engines of the next node(s) would be given this node's host, ports and dist_init_addr."""
        out = ["--actor-num-nodes", str(self.actor_nodes), "--actor-num-gpus-per-node", str(self.actor_gpus_per_node),
               "--num-gpus-per-node", str(self.node_gpus)]
        if self.mode == "colocate":
            out.append("--colocate")
        elif self.mode == "split":
            out += ["--rollout-num-gpus", str(self.rollout_gpus)]
        return out


def place(cluster: Cluster, mode: str, rollout: int = 0) -> Placement:
    total = cluster.nodes * cluster.gpus_per_node
    actor, rollout = {"train": (total, 0), "colocate": (total, total), "split": (total - rollout, rollout)}[mode]
    per = cluster.gpus_per_node
    if actor <= per:
        nodes, per_node = 1, actor
    elif actor % per == 0:
        nodes, per_node = actor // per, per
    else:
        raise Refused(f"{actor} training GPUs on nodes of {per}: they must fill whole nodes or fit in one (change "
                      "GRPO_ASYNC_ROLLOUT_GPUS)")
    return Placement(mode, nodes, per_node, rollout, per)


def span(lo: int, hi: int) -> str:
    return f"{lo}-{hi - 1}" if hi > lo + 1 else f"{lo}" if hi == lo + 1 else ""


def plan_lines(cluster: Cluster, p: Placement, engine_gpus: int, user_api_base: str, user_sim_gpus: str) -> list[str]:
    """The nodes in slime's order, one line each: which actor ranks and SGLang engines each holds."""
    if cluster.joined:
        lines = [f"cluster plan: join the Ray cluster at {cluster.ray_address}: {cluster.nodes} node(s) x "
                 f"{cluster.gpus_per_node} GPUs, in node-IP order:"]
        names = [f"node-{i}" for i in range(cluster.nodes)]
    else:
        lines = [f"cluster plan: {cluster.nodes} node(s) x {cluster.gpus_per_node} Ray GPUs (POLICY_GPUS="
                 f"{cluster.policy_gpus} on each), head {cluster.master}:{cluster.gcs_port}, in node-IP order:"]
        names = sorted((cluster.master, *cluster.workers), key=lambda a: tuple(int(o) for o in a.split(".")))
    shares = node_shares(p.actor_gpus, p.rollout_gpus, cluster.gpus_per_node, p.mode == "colocate", cluster.nodes,
                         engine_gpus)
    for name, share in zip(names, shares):
        what = [f"actor ranks {span(*share.actors)}"] if span(*share.actors) else []
        if share.rollout_gpus:
            what.append(f"SGLang engines {span(*share.engines)} ({engine_gpus} GPU(s) each)")
        role = "head" if name == cluster.master else "node" if cluster.joined else "worker"
        lines.append(f"  {name} ({role}): {'; '.join(what) or 'idle'}")
    if p.rollout_gpus:
        lines.append(f"  user simulator: {user_api_base or 'the provider endpoint'} (scripts/start_user_sim.sh on "
                     f"USER_SIM_GPUS={user_sim_gpus}; several behind scripts/start_router.sh)")
    return lines
