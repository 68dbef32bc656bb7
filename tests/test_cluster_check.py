"""The multi-node pre-flight's verdicts (tau2_rl_pipeline/cluster/check.py and inputs.py), pure:
which node did not join, has too few GPUs, does not see a path, has a data file other than the head's or an
incomplete HF model or Megatron checkpoint. Each node's facts are read from its own directory here (as each host reads
its own mount of one path). The same functions over a real two-raylet cluster: tests/contract/test_ray_cluster.py;
the checkpoint verdict over what Megatron's own dist_checkpointing.save writes: tests/contract/test_checkpoint_check.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tau2_rl_pipeline.cluster.check import (
    SHARED_STORAGE_HINT,
    Inputs,
    NodeView,
    build_parser,
    joined_problems,
    storage_problems,
)
from tau2_rl_pipeline.cluster.inputs import (
    FileFacts,
    checkpoint_missing,
    data_differs,
    hf_model_missing,
    read_checkpoint,
    read_data,
    read_hf_model,
    tracked_dir,
)

HEAD = "10.0.0.1"
DATA, MODEL, CKPT = "/shared/data/tasks.jsonl", "/shared/models/Qwen3-4B", "/shared/models/Qwen3-4B_torch_dist"
INPUTS = Inputs([DATA], [MODEL], [CKPT])


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
    views = [NodeView(HEAD, 8, {ckpt: "t1"}), NodeView("10.0.0.2", 8, {ckpt: None}), NodeView("10.0.0.3", 8, {ckpt: "t0"})]
    assert storage_problems(views, {ckpt: "t1"}, Inputs(), HEAD) == [
        f"node 10.0.0.2 does not see {ckpt} written on the head: {SHARED_STORAGE_HINT}",
        f"node 10.0.0.3 sees another {ckpt} written on the head: {SHARED_STORAGE_HINT}"]
    assert storage_problems(views[:1], {ckpt: "t1"}, Inputs(), HEAD) == []


def test_token_arguments_are_path_equals_token() -> None:
    args = build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--token", "/a=b/c=tok"])
    assert args.token == [("/a=b/c", "tok")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--token", "/a/b"])


# ---- content: what each node has at the paths the stage reads ----------------------------------------------------
def write_model(root: Path) -> Path:
    """A sharded Hugging Face checkpoint as `save_pretrained` leaves it: config, index, the shards it names."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "qwen3"}')
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for shard in shards:
        (root / shard).write_bytes(b"\0" * 64)
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"embed": shards[0], "lm_head": shards[1], "norm": shards[1]}}))
    return root


def write_checkpoint(root: Path, tracker: str = "release") -> Path:
    """A torch_dist checkpoint in the layout Megatron writes (test_checkpoint_check.py checks it against Megatron's own
    save): the tracker, and in the directory it names common.pt, torch's .metadata, the shards, metadata.json."""
    name = "release" if tracker == "release" else f"iter_{int(tracker):07d}"
    (root / name).mkdir(parents=True)
    (root / "latest_checkpointed_iteration.txt").write_text(tracker)
    for file in ("common.pt", ".metadata", "__0_0.distcp"):
        (root / name / file).write_bytes(b"x")
    (root / name / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                           "common_backend": "torch", "common_backend_version": 1}))
    return root


def host(root: Path, data: str = "{}\n") -> Path:
    """One host's copy of the shared directory: the data, a complete model and checkpoint."""
    (root / "data").mkdir(parents=True)
    (root / "data/tasks.jsonl").write_text(data)
    write_model(root / "model")
    write_checkpoint(root / "ckpt")
    return root


def node(ip: str, root: Path) -> NodeView:
    """What a node reports when it reads the inputs at its own mount `root`."""
    return NodeView(ip, 8, data={DATA: read_data(str(root / "data/tasks.jsonl"))},
                    models={MODEL: read_hf_model(str(root / "model"))},
                    checkpoints={CKPT: read_checkpoint(str(root / "ckpt"))})


def verdicts(tmp_path: Path, worker: Path) -> list[str]:
    return storage_problems([node(HEAD, host(tmp_path / "head")), node("10.0.0.2", worker)], {}, INPUTS, HEAD)


def test_identical_complete_inputs_on_every_node_pass(tmp_path: Path) -> None:
    assert verdicts(tmp_path, host(tmp_path / "w")) == []


def test_an_empty_model_directory_on_a_worker_is_refused(tmp_path: Path) -> None:
    worker = host(tmp_path / "w")
    for file in (worker / "model").iterdir():
        file.unlink()
    assert verdicts(tmp_path, worker) == [(f"node 10.0.0.2: HF model {MODEL} has no config.json (the head's is "
                                          f"complete: {SHARED_STORAGE_HINT})")]


def test_a_model_without_weights_or_with_a_shard_missing_is_refused(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m")
    assert hf_model_missing(read_hf_model(str(model))) is None
    (model / "model-00002-of-00002.safetensors").unlink()
    assert hf_model_missing(read_hf_model(str(model))) == ("lacks model-00002-of-00002.safetensors, named in its "
                                                           "model.safetensors.index.json")
    (model / "model.safetensors.index.json").write_text("{}")
    assert hf_model_missing(read_hf_model(str(model))) == ("has an model.safetensors.index.json that is not an index "
                                                           "(JSON with a weight_map)")
    (model / "model.safetensors.index.json").unlink()
    assert hf_model_missing(read_hf_model(str(model))) is None  # one unindexed shard: a single-file model
    (model / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert hf_model_missing(read_hf_model(str(model))) == "has no weight files (*.safetensors or *.bin)"
    (model / "pytorch_model.bin").write_bytes(b"w")
    assert hf_model_missing(read_hf_model(str(model))) is None


def test_an_empty_checkpoint_directory_on_a_worker_is_refused(tmp_path: Path) -> None:
    worker = host(tmp_path / "w")
    for path in sorted((worker / "ckpt").rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    assert verdicts(tmp_path, worker) == [
        (f"node 10.0.0.2: checkpoint {CKPT} has no latest_checkpointed_iteration.txt (not a Megatron "
        f"checkpoint: scripts/convert_hf_to_megatron.sh writes one) (the head's is complete: {SHARED_STORAGE_HINT})")]


def test_a_checkpoint_missing_its_iteration_directory_is_refused(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path / "ck", tracker="40")
    assert checkpoint_missing(read_checkpoint(str(ckpt))) is None
    (ckpt / "iter_0000040").rename(ckpt / "iter_0000039")
    assert checkpoint_missing(read_checkpoint(str(ckpt))) == ("has no iter_0000040, which its "
                                                              "latest_checkpointed_iteration.txt names")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("39\n")  # Megatron strips the tracker's text
    assert checkpoint_missing(read_checkpoint(str(ckpt))) is None
    for file, says in (("__0_0.distcp", "has no iter_0000039/*.distcp shards"), (".metadata", "has no iter_0000039/.metadata"),
                       ("common.pt", "has no iter_0000039/common.pt"), ("metadata.json", "has no iter_0000039/metadata.json (a save that did not finish)")):
        (ckpt / "iter_0000039" / file).unlink()
        assert checkpoint_missing(read_checkpoint(str(ckpt))) == says
    (ckpt / "latest_checkpointed_iteration.txt").write_text("latest")
    assert checkpoint_missing(read_checkpoint(str(ckpt))) == ("has a latest_checkpointed_iteration.txt holding "
                                                              "'latest', not an iteration or 'release'")


def test_a_resume_whose_tracked_iteration_is_incomplete_on_one_node_is_refused(tmp_path: Path) -> None:
    """On a resume the run loads its own save (scripts/common.sh loaded_checkpoint): the iteration the tracker names
    must be complete on every node, not only on the head."""
    save = "/shared/checkpoints/grpo"
    head, worker = (write_checkpoint(tmp_path / name, tracker="20") for name in ("head", "worker"))
    (worker / "iter_0000020/metadata.json").unlink()  # a save that never reached this node's storage in full
    views = [NodeView(ip, 8, checkpoints={save: read_checkpoint(str(root))}) for ip, root in
             ((HEAD, head), ("10.0.0.2", worker))]
    assert storage_problems(views, {}, Inputs(checkpoints=[save]), HEAD) == [
        (f"node 10.0.0.2: checkpoint {save} has no iter_0000020/metadata.json (a save that did not finish) (the "
         f"head's is complete: {SHARED_STORAGE_HINT})")]


def test_megatrons_tracker_names_its_directory() -> None:
    assert [tracked_dir(t) for t in ("release", " 7\n", "0", "-1", "x", "")] == [
        "release", "iter_0000007", "iter_0000000", None, None, None]


def test_a_data_file_that_differs_on_one_host_is_refused(tmp_path: Path) -> None:
    head, same, shorter, edited = (host(tmp_path / name, data) for name, data in (
        ("h", '{"id": 1}\n'), ("s", '{"id": 1}\n'), ("t", '{"id"'), ("e", '{"id": 2}\n')))
    views = [node(HEAD, head), node("10.0.0.2", same), node("10.0.0.3", shorter), node("10.0.0.4", edited)]
    problems = storage_problems(views, {}, INPUTS, HEAD)
    digest = read_data(str(edited / "data/tasks.jsonl")).sha256
    theirs = read_data(str(head / "data/tasks.jsonl")).sha256
    assert problems == [
        f"node 10.0.0.3: data file {DATA} is 5 bytes, the head's 10: {SHARED_STORAGE_HINT}",
        (f"node 10.0.0.4: data file {DATA} has sha256 {digest[:12]}..., the head's {theirs[:12]}...: "
        f"{SHARED_STORAGE_HINT}")]
    assert data_differs(FileFacts(10, "a"), FileFacts(None)) is None  # no head copy: the head's own line says so


def test_the_heads_own_problem_comes_first_and_is_not_blamed_on_storage(tmp_path: Path) -> None:
    head = host(tmp_path / "h")
    (head / "data/tasks.jsonl").unlink()
    (head / "model/config.json").unlink()
    worker = host(tmp_path / "w")
    (worker / "model/config.json").unlink()
    problems = storage_problems([node("10.0.0.2", worker), node(HEAD, head)], {}, INPUTS, HEAD)
    assert problems == [f"node {HEAD} does not see {DATA}: {SHARED_STORAGE_HINT}",
                        f"node {HEAD}: HF model {MODEL} has no config.json",
                        f"node 10.0.0.2: HF model {MODEL} has no config.json"]


def test_input_arguments_by_kind() -> None:
    args = build_parser().parse_args(["--nodes", "2", "--gpus-per-node", "8", "--data", "/d", "--checkpoint", "/c",
                                      "--hf-model", "/m", "--data", "/e"])
    assert (args.data, args.checkpoint, args.hf_model) == (["/d", "/e"], ["/c"], ["/m"])
