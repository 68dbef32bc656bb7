"""The multi-node pre-flight's verdicts (tau2_rl_pipeline/slime_plugins/cluster_check.py), pure: which node did not
join, has too few GPUs, or does not see a path. The same functions over a real two-raylet cluster:
tests/contract/test_ray_cluster.py."""

from __future__ import annotations

import pytest

from tau2_rl_pipeline.slime_plugins.cluster_check import (
    SHARED_STORAGE_HINT,
    NodeView,
    build_parser,
    joined_problems,
    storage_problems,
)


def test_a_worker_that_did_not_join_is_named() -> None:
    views = [NodeView("10.0.0.1", 8)]
    assert joined_problems(views, num_nodes=2, gpus_per_node=8, expect=["10.0.0.1", "10.0.0.2"]) == [
        "worker 10.0.0.2 has not joined the Ray cluster"]
    assert joined_problems(views + [NodeView("10.0.0.2", 8)], num_nodes=2, gpus_per_node=8,
                           expect=["10.0.0.1", "10.0.0.2"]) == []


def test_too_few_nodes_with_enough_gpus_names_the_short_one() -> None:
    """A joined cluster (no addresses expected): the count of nodes giving Ray the GPUs the layout needs."""
    views = [NodeView("10.0.0.1", 8), NodeView("10.0.0.2", 4)]
    assert joined_problems(views, num_nodes=2, gpus_per_node=8, expect=[]) == [
        "the Ray cluster has 1 node(s) with 8 GPUs, the layout needs 2; 10.0.0.2 gives Ray 4 GPU(s)"]
    assert joined_problems(views, num_nodes=1, gpus_per_node=8, expect=[]) == []


def test_a_node_that_does_not_read_back_the_heads_token_is_named() -> None:
    ckpt = "/ckpt/grpo/.tau2-shared-check"
    views = [NodeView("10.0.0.1", 8, {ckpt: "t1"}, {"/data/x": True}),
             NodeView("10.0.0.2", 8, {ckpt: None}, {"/data/x": True}),
             NodeView("10.0.0.3", 8, {ckpt: "t0"}, {"/data/x": False})]
    assert storage_problems(views, {ckpt: "t1"}, ["/data/x"]) == [
        f"node 10.0.0.2 does not see {ckpt} written on the head: {SHARED_STORAGE_HINT}",
        f"node 10.0.0.3 sees another {ckpt} written on the head: {SHARED_STORAGE_HINT}",
        f"node 10.0.0.3 does not see /data/x: {SHARED_STORAGE_HINT}"]
    assert storage_problems(views[:1], {ckpt: "t1"}, ["/data/x"]) == []


def test_token_arguments_are_path_equals_token() -> None:
    args = build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--token", "/a=b/c=tok"])
    assert args.token == [("/a=b/c", "tok")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--token", "/a/b"])
