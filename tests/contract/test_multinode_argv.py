"""The stage scripts' argv on 2 and 4 nodes, and after a crash, read by slime's own parse_args (parse_argv.py).

On several nodes: slime's parser and validation accept the placement the scripts derive from the hostfile, and the
world size and rollout GPUs are what the dry run's plan says. After a crash: the scripts pass `--load <its own
checkpoint>` with no `--start-rollout-id` and no `--finetune`, so slime keeps its start rollout id unset and its
train.py starts at the rollout its actors loaded + 1 (slime/backends/megatron_utils/actor.py: `start_rollout_id =
loaded_rollout_id + 1`, the iteration Megatron's `read_metadata` reads from latest_checkpointed_iteration.txt);
every node reads that same file because the checkpoint directory is on storage every node sees (checked before
training by cluster_check). A fresh start passes `--start-rollout-id 0` and loads the initial weights only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from contract_tier import SLIME_DIR
from test_cluster_scripts import MASTER, NETWORK, hostfile, workers
from test_scripts import run_script
from test_stage_argv import HERE, program_of

RUNS = {  # name -> (script, nodes, extra environment)
    "grpo-2": ("train_grpo.sh", 2, {}),
    "grpo-4": ("train_grpo.sh", 4, {}),
    "grpo-async-2": ("train_grpo.sh", 2, {"GRPO_ASYNC": "1"}),
    "grpo-async-4": ("train_grpo.sh", 4, {"GRPO_ASYNC": "1"}),
    "sft-4": ("train_sft.sh", 4, {}),
}


def slime_argv(base: Path, script: str, nodes: int, **env: str) -> dict:
    hosts = hostfile(base, MASTER, *workers(nodes)) if nodes > 1 else ""
    result = run_script(script, base, **({"HOSTFILE": hosts, **NETWORK} if hosts else {}), **env)
    assert result.rc == 0, result.text
    (job,) = [found for found in map(program_of, result.commands) if found and found[0].startswith("train")]
    return {"program": "slime", "argv": job[1], "env": job[2]}


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    base = tmp_path_factory.mktemp("multinode")
    (base / "out/checkpoints/rft").mkdir(parents=True)  # the KL reference slime's validation looks for
    jobs = {name: slime_argv(base, script, nodes, **env) for name, (script, nodes, env) in RUNS.items()}
    jobs["grpo-fresh"] = slime_argv(base, "train_grpo.sh", 2)
    # a crash after the checkpoint of rollout 40: GRPO_CKPT_DIR holds it (as Megatron writes it)
    grpo = base / "out/checkpoints/grpo"
    (grpo / "iter_0000040").mkdir(parents=True)
    (grpo / "latest_checkpointed_iteration.txt").write_text("40")
    jobs["grpo-resume"] = slime_argv(base, "train_grpo.sh", 2)
    (base / "jobs.json").write_text(json.dumps(list(jobs.values())))
    proc = subprocess.run([sys.executable, str(HERE / "parse_argv.py"), str(base / "jobs.json"), str(base / "out.json")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = dict(zip(jobs, json.loads((base / "out.json").read_text())))
    bad = {name: (a["error"], a["unknown"]) for name, a in answers.items() if a["error"] or a["unknown"]}
    assert not bad
    return {"base": base, **{name: a["args"] for name, a in answers.items()}}


@pytest.mark.parametrize("name, nodes, actor_nodes, rollout", [
    ("grpo-2", 2, 2, 8), ("grpo-4", 4, 4, 16), ("grpo-async-2", 2, 1, 4), ("grpo-async-4", 4, 2, 8), ("sft-4", 4, 4, 0)])
def test_slime_accepts_the_multi_node_placement(parsed: dict, name: str, nodes: int, actor_nodes: int,
                                                rollout: int) -> None:
    args = parsed[name]
    assert (args["actor_num_nodes"], args["actor_num_gpus_per_node"]) == (actor_nodes, 4)
    assert args["num_gpus_per_node"] == 4  # what slime's engine address allocation counts as one node (not its 8)
    assert args["world_size"] == actor_nodes * 4
    assert args["data_parallel_size"] == actor_nodes * 4 // args["tensor_model_parallel_size"]
    if name.startswith("sft"):
        assert args["debug_train_only"] is True
    else:
        assert args["rollout_num_gpus"] == rollout and args["colocate"] is ("async" not in name)


def test_a_fresh_start_begins_at_rollout_zero_from_the_initial_weights(parsed: dict) -> None:
    args = parsed["grpo-fresh"]
    assert args["load"] == str(parsed["base"] / "out/checkpoints/rft") and args["start_rollout_id"] == 0
    assert args["finetune"] is args["no_load_optim"] is args["no_load_rng"] is True


def test_a_resume_continues_after_the_last_checkpointed_rollout(parsed: dict) -> None:
    from megatron.training.checkpointing import read_metadata

    args = parsed["grpo-resume"]
    grpo = parsed["base"] / "out/checkpoints/grpo"
    assert args["load"] == args["save"] == str(grpo)
    # left unset: slime's train.py takes the rollout its actors loaded + 1; optimizer and RNG state come back too
    assert args["start_rollout_id"] is None
    assert not (args["finetune"] or args["no_load_optim"] or args["no_load_rng"])  # Megatron's defaults: off
    assert read_metadata(str(grpo / "latest_checkpointed_iteration.txt")) == (40, False)  # so it starts at 41
    actor = (SLIME_DIR / "slime/backends/megatron_utils/actor.py").read_text()
    assert "start_rollout_id = loaded_rollout_id + 1" in actor  # the rule this test relies on, at 624b824
