"""What each node of a slime run holds, in slime's order: its training actors and its SGLang GPUs.

slime orders its placement group's GPUs by node IP, then GPU id, and gives the actor the first ones and the rollout
engines the next ones (the same ones when colocated): scripts/cluster.sh's `print_cluster_plan` prints that order.
Host memory is a node's, so it must be counted per node: with asynchronous GRPO on 2 nodes of 4 GPUs the first node
holds 4 training actors and the second 4 SGLang GPUs, not 4 of each. Pure: no I/O.
"""

from __future__ import annotations


def _overlap(lo: int, hi: int, start: int, end: int) -> int:
    return max(0, min(hi, end) - max(lo, start))


def node_loads(actor_gpus: int, rollout_gpus: int, node_gpus: int, colocated: bool) -> list[tuple[int, int]]:
    """(training actors, SGLang GPUs) of each node that holds either, in slime's order; `node_gpus` is what each
    node gives Ray (GPUS_PER_NODE)."""
    if node_gpus < 1:
        raise ValueError(f"node_gpus must be at least 1, not {node_gpus}")
    start = 0 if colocated else actor_gpus
    used = max(actor_gpus, start + rollout_gpus)
    return [(_overlap(k * node_gpus, (k + 1) * node_gpus, 0, actor_gpus),
             _overlap(k * node_gpus, (k + 1) * node_gpus, start, start + rollout_gpus))
            for k in range(max(1, -(-used // node_gpus)))]
