"""Before a multi-node slime run: every node the layout needs has joined the Ray cluster with its GPUs, and every node
sees the stage's checkpoint and data paths where the head sees them (storage every node mounts at the same path).

Why: slime's actors on a worker load `--load` and save `--save` by path, and decide where a resumed run starts from
`latest_checkpointed_iteration.txt` there; a worker with its own local directory would start at another rollout id
or train from other weights, and slime's check of that (`assert len(set(start_rollout_ids)) == 1`) fires only after
every model has loaded. A worker that never joined leaves slime's placement group waiting with no end.

scripts/cluster.sh runs it on the head of a cluster it started (a Ray driver at the head's GCS address), and as a Ray
job on a cluster it joined (Slurm, KubeRay: `ray job submit -- python -m ...`, no --address):

    python -m tau2_rl_pipeline.slime_plugins.cluster_check --address 10.0.0.1:6379 --nodes 2 --gpus-per-node 8 \
        --expect 10.0.0.1,10.0.0.2 --token /ckpt/grpo/.tau2-shared-check=TOKEN --exists /data/tasks.jsonl

It prints `cluster check: ...` and exits 0, or prints one line `cluster check failed: ...` naming the node and what
it lacks, and exits 1. `problems` is the pure comparison; Ray is at the edges.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SHARED_STORAGE_HINT = "put checkpoints and data on storage every node mounts at the same path"


@dataclass(frozen=True)
class NodeView:
    """What one alive Ray node has and sees: its address, its GPUs, the token files' contents (None: not there) and
    which of the paths exist on it."""

    ip: str
    gpus: float
    tokens: dict[str, str | None] = field(default_factory=dict)
    exists: dict[str, bool] = field(default_factory=dict)


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


def storage_problems(nodes: list[NodeView], tokens: dict[str, str], exists: list[str]) -> list[str]:
    """Each node must read back every token the head wrote and see every path."""
    out = []
    for node in nodes:
        for path, token in tokens.items():
            got = node.tokens.get(path)
            if got != token:
                seen = "does not see" if got is None else "sees another"
                out.append(f"node {node.ip} {seen} {path} written on the head: {SHARED_STORAGE_HINT}")
        out += [f"node {node.ip} does not see {path}: {SHARED_STORAGE_HINT}" for path in exists
                if not node.exists.get(path, False)]
    return out


def _read(tokens: list[str], exists: list[str]) -> tuple[dict[str, str | None], dict[str, bool]]:
    """On one node: the token files' contents and which paths exist."""
    import os

    got: dict[str, str | None] = {}
    for path in tokens:
        try:
            with open(path, encoding="utf-8") as f:
                got[path] = f.read()
        except OSError:
            got[path] = None
    return got, {path: os.path.exists(path) for path in exists}


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


def read_on_every_node(views: list[NodeView], tokens: list[str], exists: list[str]) -> list[NodeView]:
    """One task pinned to each alive node reads the paths there."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ids = {n["NodeManagerAddress"]: n["NodeID"] for n in alive_nodes()}
    read = ray.remote(num_cpus=0)(_read)
    refs = [read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(ids[v.ip], soft=False)).remote(
        tokens, exists) for v in views]
    return [NodeView(v.ip, v.gpus, *answer) for v, answer in zip(views, ray.get(refs))]


def parse_token(text: str) -> tuple[str, str]:
    path, sep, token = text.rpartition("=")
    if not sep or not path or not token:
        raise argparse.ArgumentTypeError(f"{text!r} is not PATH=TOKEN")
    return path, token


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", default=None,
                        help="the head's GCS address HOST:PORT, this node being the head; unset inside a Ray job")
    parser.add_argument("--nodes", type=int, required=True, help="nodes the layout needs")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="Ray GPUs each of them must give")
    parser.add_argument("--expect", default="", help="comma-separated node addresses that must have joined")
    parser.add_argument("--token", type=parse_token, action="append", default=[],
                        help="PATH=TOKEN: a file the head wrote; every node must read TOKEN from PATH")
    parser.add_argument("--exists", action="append", default=[], help="a path every node must see")
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
    if not problems:
        tokens = dict(args.token)
        views = read_on_every_node(views, list(tokens), args.exists)
        problems = storage_problems(views, tokens, args.exists)
    if problems:
        print(f"cluster check failed: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        return 1
    print(f"cluster check: {len(views)} node(s) joined ({', '.join(sorted(v.ip for v in views))}); "
          f"{len(args.token) + len(args.exists)} path(s) seen on every node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
