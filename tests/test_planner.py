"""The stage planner (tau2_rl_pipeline/launch) called directly: the plan object, not the printed text.

The dry runs' text is pinned by tests/test_golden.py and read by the script tests; here the decisions, each in
a few milliseconds: slime's argv and placement, the sizing sheet's refusals, the off-policy rule shared with the
in-run guard, the runtime env without secrets, the one-line refusals of bad settings.
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from tau2_rl_pipeline.launch.build import plan_stage
from tau2_rl_pipeline.launch.machine import Machine
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.settings import Refused
from tau2_rl_pipeline.slime_plugins.offpolicy_guard import refusal

BASE = {"TAU2_OUT_DIR": "/nowhere/out", "SLIME_DIR": "/opt/test-slime", "MEGATRON_DIR": "/opt/test-megatron",
        "DRY_RUN": "1"}


class Bare(Machine):
    """A machine with none of the stage's inputs yet, free ports, and `mem` bytes of memory."""

    def __init__(self, mem: int = 0) -> None:
        self.mem = mem

    def is_file(self, path: str) -> bool:
        return path.endswith(".sh") and super().is_file(path)  # the model flag files are the checkout's

    def is_dir(self, path: str) -> bool:
        return False

    def exists(self, path: str) -> bool:
        return False

    def port_in_use(self, port: int) -> bool:
        return False

    def interface_problem(self, setting: str) -> str | None:
        return None

    def mem_total(self) -> int:
        return self.mem


def plan(stage: str, machine: Machine | None = None, **env: str) -> StagePlan:
    return plan_stage(stage, f"{stage}.sh", {**BASE, **env}, "/tmp", machine=machine or Bare())


def flags(argv: list[str]) -> dict[str, str | None]:
    return {tok: (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None)
            for i, tok in enumerate(argv) if tok.startswith("--")}


def test_sync_grpo_colocates_and_async_splits_the_gpus() -> None:
    sync = plan("grpo")
    assert sync.entry == "train.py" and sync.placement.mode == "colocate" and "--colocate" in sync.argv
    assert sync.sheet is not None and sync.sheet.refusal is None
    split = plan("grpo", GRPO_ASYNC="1")
    got = flags(split.argv)
    assert split.entry == "train_async.py" and got["--rollout-num-gpus"] == "2" and "--colocate" not in got
    assert got["--sglang-server-concurrency"] == str(2 * 64 // 2)  # (eta + 1) rollouts' samples over 2 engines


def test_the_off_policy_rule_is_the_guards() -> None:
    """A synchronous run without partial rollout samples every episode with the weights it trains: allowed
    unmasked and without TIS, by the planner and by the in-run guard alike; async without either is refused by
    both with the same line."""
    sync = plan("grpo", GRPO_MASK_OFFPOLICY="0", GRPO_USE_TIS="0", GRPO_PARTIAL_ROLLOUT="0")
    assert refusal(Namespace(**{flag.lstrip("-").replace("-", "_"): flag in sync.argv for flag in (
        "--partial-rollout", "--use-tis", "--mask-offpolicy-in-partial-rollout")})) is None
    with pytest.raises(Refused) as err:
        plan("grpo", GRPO_ASYNC="1", GRPO_MASK_OFFPOLICY="0", GRPO_USE_TIS="0")
    guard = refusal(Namespace(rollout_function_path="x.generate_rollout_fully_async", partial_rollout=True,
                              mask_offpolicy_in_partial_rollout=False, use_tis=False))
    assert str(err.value) == guard


def test_the_sizing_sheet_refuses_in_one_line_unless_forced() -> None:
    with pytest.raises(Refused) as err:
        plan("grpo", MODEL="qwen3-8b", TRAIN_TP="1")
    assert "training needs" in str(err.value) and "SIZING_FORCE=1" in str(err.value) and "\n" not in str(err.value)
    forced = plan("grpo", MODEL="qwen3-8b", TRAIN_TP="1", SIZING_FORCE="1")
    assert any(n.startswith("warning: training needs") for n in forced.notes)


def test_host_memory_is_refused_over_host_mem_gb_and_warned_over_this_machine() -> None:
    assert any("host memory, per node: 217.0 GiB" in n for n in plan("grpo", MODEL="qwen3-8b").notes)
    with pytest.raises(Refused, match="host memory: a node needs 217.0 GiB, over 95% of HOST_MEM_GB=200"):
        plan("grpo", MODEL="qwen3-8b", HOST_MEM_GB="200")
    real = plan_stage("grpo", "g", {**BASE, "MODEL": "qwen3-8b", "DRY_RUN": "1"}, "/tmp", machine=Bare(128 * 2**30))
    assert not any("this machine's" in n for n in real.notes)  # a dry run does not judge this machine


@pytest.mark.parametrize("env, words", [
    ({"MODEL": "qwen3-9b"}, "MODEL=qwen3-9b is not one of"),
    ({"RECIPE": "paper"}, "RECIPE=paper is not one of"),
    ({"GRPO_N_SAMPLES": "four"}, "GRPO_N_SAMPLES=four must be a positive integer"),
    ({"GRPO_ASYNC": "maybe"}, "GRPO_ASYNC=maybe must be true or false"),
    ({"NUM_NODES": "2"}, "NUM_NODES=2: list the workers in HOSTFILE"),
    ({"HOSTFILE": "x", "RAY_ADDRESS": "http://10.0.0.1:8265"}, "HOSTFILE and RAY_ADDRESS are both set"),
])
def test_bad_settings_are_one_line(env: dict[str, str], words: str) -> None:
    with pytest.raises(Refused) as err:
        plan("grpo", **env)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_secrets_stay_out_of_the_argv_and_the_runtime_env() -> None:
    p = plan("grpo", WANDB_API_KEY="sk-planner-SECRET", TAU2_JUDGE_API_KEY="sk-judge-SECRET")
    assert "--use-wandb" in p.argv and not any("SECRET" in a for a in p.argv)
    assert "SECRET" not in str(p.runtime_env) and any("TAU2_JUDGE_API_KEY" in n for n in p.notes)
    assert "SECRET" not in p.to_bash()  # what the script evaluates: the secrets stay in its environment only


def test_a_running_cluster_is_joined_and_its_nodes_planned(tmp_path) -> None:
    p = plan("sft", RAY_ADDRESS="http://10.1.0.1:8265", NUM_NODES="2", GPUS_PER_NODE="8", GLOO_SOCKET_IFNAME="lo",
             NCCL_SOCKET_IFNAME="lo")
    assert [s.verb for s in p.steps] == ["cd", "check", "job"]  # nothing started or stopped
    assert (p.placement.actor_nodes, p.placement.actor_gpus_per_node) == (2, 8)
    assert [n for n in p.notes if "(node):" in n] == ["  node-0 (node): actor ranks 0-7", "  node-1 (node): actor ranks 8-15"]


def test_a_recipe_sets_the_grpo_batch() -> None:
    got = flags(plan("grpo", RECIPE="qwen3-8b-tau2").argv)
    assert (got["--rollout-batch-size"], got["--n-samples-per-prompt"], got["--num-rollout"]) == ("64", "16", "60")


def test_the_planners_door_prints_a_refusal_in_one_line_and_a_plan_in_shell_words(monkeypatch, capsys) -> None:
    """tau2_rl_pipeline.launch.__main__, the stage scripts' one call: a bad setting is one `SCRIPT: error:` line and
    exit 1 with nothing on stdout; a dry run's plan is shell words on stdout, its notes on stderr."""
    from tau2_rl_pipeline.launch.__main__ import main

    monkeypatch.setenv("DRY_RUN", "maybe")
    assert main(["grpo", "--prog", "train_grpo.sh"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "train_grpo.sh: error: DRY_RUN=maybe must be 0 or 1\n"
    monkeypatch.setenv("DRY_RUN", "1")
    monkeypatch.setenv("TAU2_OUT_DIR", "/nonexistent/out")
    assert main(["download", "--prog", "download.sh"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("export ") and "step_" in out, out


def test_one_stage_graph_both_backends_read() -> None:
    """Each training stage starts from an earlier one; slime's stages load the checkpoint their start saves, the local
    pipeline compares each stage with its start, and a stage outside the recipe is refused by name."""
    from tau2_rl_pipeline.launch.recipe import STAGE_GRAPH, starts_from
    from tau2_rl_pipeline.local.demo_report import COMPARISONS

    seen = ["base"]
    for stage in STAGE_GRAPH:
        assert stage.starts_from in seen, stage
        seen.append(stage.name)
    saves = {"base": flags(plan("sft").argv)["--load"], "sft": flags(plan("sft").argv)["--save"],
             "rft": flags(plan("rft").argv)["--save"]}
    assert flags(plan("rft").argv)["--load"] == saves[starts_from("rft")] == saves["sft"]
    for algorithm in ("grpo", "awsft"):
        assert flags(plan("grpo", GRPO_ALGORITHM=algorithm).argv)["--load"] == saves[starts_from(algorithm)]
    assert COMPARISONS == (("base", "sft"), ("sft", "rft"), ("rft", "grpo"), ("rft", "awsft"))
    # scripts/pipeline.sh runs slime's training stages in the recipe's order, each after the stage it starts from
    headers = [s.args[0].split()[3].rstrip(":") for s in plan("pipeline").steps if s.verb == "header"]
    trained = [h for h in headers if h in {s.name for s in STAGE_GRAPH}]
    assert trained == ["sft", "rft", "grpo"], headers
    with pytest.raises(KeyError, match="no training stage 'ppo' in the recipe"):
        starts_from("ppo")
