"""Before a multi-node slime run: every node joined, with its GPUs, network interfaces and inputs.

Before a multi-node slime run: every node the layout needs has joined the Ray cluster with its GPUs, has the network
interfaces GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name (net.py), and sees the stage's checkpoint and data
paths where the head sees them (storage every node mounts at the same path), with the same content: the data file
identical to the head's (size and sha256), the HF model and the Megatron checkpoint(s) the run loads complete
(inputs.py says what complete means for each).

Why: slime's actors on a worker load `--load` and save `--save` by path, and decide where a resumed run starts from
`latest_checkpointed_iteration.txt` there; a worker with its own local directory would start at another rollout id
or train from other weights, and slime's check of that (`assert len(set(start_rollout_ids)) == 1`) fires only after
every model has loaded. A worker that never joined leaves slime's placement group waiting with no end.

scripts/cluster.sh runs it on the head of a cluster it started (a Ray driver at the head's GCS address), and as a Ray
job on a cluster it joined (Slurm, KubeRay: `ray job submit -- python -m ...`, no --address):

    python -m tau2_rl_pipeline.cluster.check --address 10.0.0.1:6379 --nodes 2 --gpus-per-node 8 \
        --expect 10.0.0.1,10.0.0.2 --interface GLOO_SOCKET_IFNAME=eth0 --token /ckpt/grpo/.tau2-shared-check=TOKEN \
        --data /data/tasks.jsonl --checkpoint /ckpt/rft --hf-model /models/Qwen3-4B

It prints `cluster check: ...` and exits 0, or prints one line `cluster check failed: ...` naming the node and what
it lacks, and exits 1. `joined_problems`, `interface_problems` and `storage_problems` are the pure verdicts; Ray is
at the edges.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tau2_rl_pipeline.cluster.inputs import (
    CheckpointFacts,
    DirFacts,
    FileFacts,
    checkpoint_missing,
    data_differs,
    hf_model_missing,
    read_checkpoint,
    read_data,
    read_hf_model,
)
from tau2_rl_pipeline.cluster.net import VARIABLES, Interfaces, interface_problem, read_interfaces

SHARED_STORAGE_HINT = "put checkpoints and data on storage every node mounts at the same path"


@dataclass(frozen=True)
class NodeView:
    """What one alive Ray node has and sees: its address, its GPUs, the token files' contents (None: not there), what
    it has at each input path (inputs.py) and its network interfaces (net.py)."""

    ip: str
    gpus: float
    tokens: dict[str, str | None] = field(default_factory=dict)
    data: dict[str, FileFacts] = field(default_factory=dict)
    models: dict[str, DirFacts] = field(default_factory=dict)
    checkpoints: dict[str, CheckpointFacts] = field(default_factory=dict)
    interfaces: Interfaces = field(default_factory=dict)


@dataclass(frozen=True)
class Inputs:
    """The paths a stage reads, by kind."""

    data: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)


def joined_problems(nodes: list[NodeView], *, num_nodes: int, gpus_per_node: int, expect: list[str]) -> list[str]:
    """What keeps the cluster from holding the layout's nodes: an expected address with no alive node, too few
    nodes with enough GPUs."""
    ips = {n.ip for n in nodes}
    missing = [ip for ip in expect if ip not in ips]
    if missing:
        return [f"worker {ip} has not joined the Ray cluster" for ip in missing]
    short = [n for n in nodes if n.gpus < gpus_per_node]
    enough = len(nodes) - len(short)
    if enough < num_nodes:
        detail = "".join(f"; {n.ip} gives Ray {n.gpus:g} GPU(s)" for n in short)
        return [f"the Ray cluster has {enough} node(s) with {gpus_per_node} GPUs, the layout needs {num_nodes}{detail}"]
    return []


def interface_problems(nodes: list[NodeView], settings: list[tuple[str, str]], head: str) -> list[str]:
    """Each node must have what each interface variable names (net.py's rules): every worker gets the head's
    values on `ray start`, and a worker whose interface has another name would fail only in Gloo's or NCCL's setup.
    The head's problems come first."""
    return [f"node {node.ip}: {why}" for node in sorted(nodes, key=lambda n: n.ip != head)
            for variable, value in settings if (why := interface_problem(variable, value, node.interfaces, "there"))]


def storage_problems(nodes: list[NodeView], tokens: dict[str, str], inputs: Inputs, head: str) -> list[str]:
    """Each node must read back every token the head wrote, see every input, have the data file the head has and a
    complete HF model and checkpoint. The head's problems come first; another node's incomplete copy of what is
    complete on the head points at the storage."""
    ref = next((n for n in nodes if n.ip == head), NodeView(head, 0))
    out = []
    for node in sorted(nodes, key=lambda n: n.ip != head):
        for path, token in tokens.items():
            got = node.tokens.get(path)
            if got != token:
                seen = "does not see" if got is None else "sees another"
                out.append(f"node {node.ip} {seen} {path} written on the head: {SHARED_STORAGE_HINT}")
        out += _content_problems(node, ref, inputs)
    return out


def _content_problems(node: NodeView, ref: NodeView, inputs: Inputs) -> list[str]:
    out = []
    for path in inputs.data:
        facts = node.data.get(path, FileFacts(None))
        if facts.size is None:
            out.append(f"node {node.ip} does not see {path}: {SHARED_STORAGE_HINT}")
        elif why := data_differs(facts, ref.data.get(path, FileFacts(None))):
            out.append(f"node {node.ip}: data file {path} {why}: {SHARED_STORAGE_HINT}")
    kinds = (("HF model", inputs.models, node.models, ref.models, hf_model_missing, DirFacts(None)),
             ("checkpoint", inputs.checkpoints, node.checkpoints, ref.checkpoints, checkpoint_missing,
              CheckpointFacts(DirFacts(None))))
    for what, paths, got, heads, missing, absent in kinds:
        for path in paths:
            facts = got.get(path, absent)
            if facts.files is None:
                out.append(f"node {node.ip} does not see {path}: {SHARED_STORAGE_HINT}")
            elif why := missing(facts):
                shared = node is not ref and path in heads and missing(heads[path]) is None
                out.append(f"node {node.ip}: {what} {path} {why}"
                           + (f" (the head's is complete: {SHARED_STORAGE_HINT})" if shared else ""))
    return out


def _read(tokens: list[str], inputs: Inputs) -> tuple[dict[str, str | None], dict, dict, dict, Interfaces]:
    """On one node: the token files' contents, what is at each input path, its network interfaces."""
    got: dict[str, str | None] = {}
    for path in tokens:
        try:
            with open(path, encoding="utf-8") as f:
                got[path] = f.read()
        except OSError:
            got[path] = None
    return (got, {p: read_data(p) for p in inputs.data}, {p: read_hf_model(p) for p in inputs.models},
            {p: read_checkpoint(p) for p in inputs.checkpoints}, read_interfaces())


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def wait_for_nodes(num_nodes: int, gpus_per_node: int, expect: list[str], timeout_s: float) -> list[NodeView]:
    """Alive nodes once the layout's have joined, or as they are at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        views = [NodeView(n["NodeManagerAddress"], n.get("Resources", {}).get("GPU", 0.0)) for n in alive_nodes()]
        if not joined_problems(views, num_nodes=num_nodes, gpus_per_node=gpus_per_node, expect=expect) \
                or time.monotonic() >= deadline:
            return views
        time.sleep(1.0)


def read_on_every_node(views: list[NodeView], tokens: list[str], inputs: Inputs) -> list[NodeView]:
    """One task pinned to each alive node reads the paths there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ids = {n["NodeManagerAddress"]: n["NodeID"] for n in alive_nodes()}
    read = ray.remote(num_cpus=0)(_read)
    refs = [read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(ids[v.ip], soft=False)).remote(
        tokens, inputs) for v in views]
    return [NodeView(v.ip, v.gpus, *answer) for v, answer in zip(views, ray.get(refs))]


def parse_token(text: str) -> tuple[str, str]:
    path, sep, token = text.rpartition("=")
    if not sep or not path or not token:
        raise argparse.ArgumentTypeError(f"{text!r} is not PATH=TOKEN")
    return path, token


def parse_interface(text: str) -> tuple[str, str]:
    variable, _, value = text.partition("=")  # NCCL's exact names start with `=`: NCCL_SOCKET_IFNAME==eth0
    if variable not in VARIABLES or not value:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE with NAME one of {', '.join(VARIABLES)}")
    return variable, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=None,
                        help="the head's GCS address HOST:PORT, this node being the head; unset inside a Ray job")
    parser.add_argument("--nodes", type=int, required=True, help="nodes the layout needs")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="Ray GPUs each of them must give")
    parser.add_argument("--expect", default="", help="comma-separated node addresses that must have joined")
    parser.add_argument("--interface", type=parse_interface, action="append", default=[],
                        help="NAME=VALUE: an interface variable every node gets; it must name an interface of each")
    parser.add_argument("--token", type=parse_token, action="append", default=[],
                        help="PATH=TOKEN: a file the head wrote; every node must read TOKEN from PATH")
    parser.add_argument("--data", action="append", default=[],
                        help="a data file every node must have, the same size and sha256 as the head's")
    parser.add_argument("--hf-model", action="append", default=[],
                        help="a Hugging Face model directory every node must have complete: config.json, weights")
    parser.add_argument("--checkpoint", action="append", default=[],
                        help="a Megatron checkpoint the run loads, complete on every node: its tracked iteration")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the nodes to join")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import ray

    # The readers run in Ray's workers on every node: they import this package from where the head has it.
    package_root = str(Path(__file__).resolve().parents[2])
    runtime_env = {"env_vars": {"PYTHONPATH": package_root}}
    if args.address:
        ray.init(address=args.address, _node_ip_address=args.address.rsplit(":", 1)[0], log_to_driver=False,
                 runtime_env=runtime_env)
    else:
        ray.init(log_to_driver=False)
    expect = [ip for ip in args.expect.split(",") if ip]
    views = wait_for_nodes(args.nodes, args.gpus_per_node, expect, args.timeout)
    problems = joined_problems(views, num_nodes=args.nodes, gpus_per_node=args.gpus_per_node, expect=expect)
    tokens = dict(args.token)
    inputs = Inputs(args.data, args.hf_model, args.checkpoint)
    if not problems:
        views = read_on_every_node(views, list(tokens), inputs)
        head = args.address.rsplit(":", 1)[0] if args.address else ray.util.get_node_ip_address()
        problems = interface_problems(views, args.interface, head) + storage_problems(views, tokens, inputs, head)
    if problems:
        print(f"cluster check failed: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        return 1
    print(f"cluster check: {len(views)} node(s) joined ({', '.join(sorted(v.ip for v in views))}); on every node "
          f"{len(tokens)} file(s) written on the head read back, {len(inputs.data)} data file(s) identical to the "
          f"head's (size, sha256), {len(inputs.models)} HF model(s) and {len(inputs.checkpoints)} Megatron "
          "checkpoint(s) complete" + "".join(f"; {v}={x} names an interface with an address"
                                            for v, x in args.interface))
    return 0


if __name__ == "__main__":
    sys.exit(main())
