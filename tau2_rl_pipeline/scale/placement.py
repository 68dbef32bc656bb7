"""What each node of a slime run holds, in slime's order: its training actors and its SGLang GPUs.

slime orders its placement group's GPUs by node IP, then GPU id, and gives the actor the first ones and the rollout
engines the next ones (the same ones when colocated), each engine `engine_gpus` consecutive ones. This module is the
one place that order is written: the dry run's cluster plan (launch/cluster.py) prints it and the sizing sheet counts
host memory by it. Host memory is a node's, so it must be counted per node: with asynchronous GRPO on 2 nodes of 4
GPUs the first node holds 4 training actors and the second 4 SGLang GPUs, not 4 of each. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


def _overlap(lo: int, hi: int, start: int, end: int) -> int:
    return max(0, min(hi, end) - max(lo, start))


@dataclass(frozen=True)
class NodeShare:
    """One node's share, as ranges [lo, hi): the actor ranks it holds and the SGLang engines that touch it."""

    actors: tuple[int, int]
    engines: tuple[int, int]
    rollout_gpus: int

    @property
    def num_actors(self) -> int:
        return self.actors[1] - self.actors[0]


def node_shares(actor_gpus: int, rollout_gpus: int, node_gpus: int, colocated: bool, nodes: int,
                engine_gpus: int = 1) -> list[NodeShare]:
    """Each of `nodes` nodes' share in slime's order; `node_gpus` is what each node gives Ray (GPUS_PER_NODE)."""
    if node_gpus < 1:
        raise ValueError(f"node_gpus must be at least 1, not {node_gpus}")
    start = 0 if colocated else actor_gpus
    out = []
    for k in range(nodes):
        lo, hi = k * node_gpus, (k + 1) * node_gpus
        actors = (min(lo, actor_gpus), min(hi, actor_gpus))
        rollout = _overlap(lo, hi, start, start + rollout_gpus)
        engines = (0, 0)
        if rollout:
            first, last = max(lo, start) - start, min(hi, start + rollout_gpus) - start
            engines = (first // engine_gpus, -(-last // engine_gpus))
        out.append(NodeShare(actors, engines, rollout))
    return out


def node_loads(actor_gpus: int, rollout_gpus: int, node_gpus: int, colocated: bool) -> list[tuple[int, int]]:
    """(training actors, SGLang GPUs) of each node that holds either, in slime's order."""
    if node_gpus < 1:
        raise ValueError(f"node_gpus must be at least 1, not {node_gpus}")
    used = max(actor_gpus, (0 if colocated else actor_gpus) + rollout_gpus)
    return [(s.num_actors, s.rollout_gpus)
            for s in node_shares(actor_gpus, rollout_gpus, node_gpus, colocated, max(1, -(-used // node_gpus)))]
