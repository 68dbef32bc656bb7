"""The cost on paper (tau2_rl_pipeline/scale/cost.py) and the generated tables the pages carry (scale/tables.py).

The pages' preset, sizing and cost tables must be exactly what the code prints, and what the scale page says in
words about the cost table (training scales with nodes, the rollout does not past its floor, the recipe's step
pays for more nodes) must hold for the numbers the code computes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tau2_rl_pipeline.scale import cost, tables
from tau2_rl_pipeline.scale.presets import PRESETS
from tau2_rl_pipeline.scale.turns import mean_turns

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "scripts" / "models"


def generated_blocks(text: str) -> dict[str, str]:
    pattern = r"<!-- generated: python -m tau2_rl_pipeline\.scale\.tables (\w+) -->.*?<!-- end generated -->"
    return {m.group(1): m.group(0) for m in re.finditer(pattern, text, re.S)}


@pytest.mark.parametrize("page, names", [("docs/models-and-sizing.md", {"presets", "sizing", "cost", "recipe"}),
                                         ("README.md", {"presets", "cost_summary"})])
def test_pages_carry_the_generated_tables(page: str, names: set[str]) -> None:
    blocks = generated_blocks((ROOT / page).read_text())
    assert set(blocks) == names
    for name, text in blocks.items():
        assert text == tables.block(name), f"{page}: regenerate with python -m tau2_rl_pipeline.scale.tables {name}"


def test_tables_cli_names_a_bad_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert tables.main(["nope"]) == 1
    assert capsys.readouterr().err.strip() == "error: no table nope: one of presets, sizing, cost, cost_summary, recipe"


def test_every_input_says_where_it_comes_from() -> None:
    for name, (value, source) in cost.INPUTS.items():
        assert value > 0 and re.match(r"(measured: P\d|assumed|H100 SXM)", source), name


@pytest.mark.parametrize("name", ["qwen3-4b-instruct-2507", "qwen3-8b", "qwen3-30b-a3b"])
def test_training_scales_with_nodes_and_the_rollout_has_a_floor(name: str) -> None:
    rows = [cost.cost_row(name, n, MODELS) for n in (1, 2, 4)]
    train = [r.grpo_step_train_s for r in rows]
    assert train[1] == pytest.approx(train[0] / 2) and train[2] == pytest.approx(train[0] / 4)
    assert len({r.sft_gpu_h for r in rows}) == 1  # compute-bound: the same GPU-hours on any number of nodes
    assert all(r.rollout_floor_s == rows[0].rollout_floor_s for r in rows)
    rollout = [r.grpo_step_rollout_s for r in rows]
    assert rollout[0] > rollout[1] > rollout[2] > rows[0].rollout_floor_s
    gpu_h = [r.grpo_gpu_h for r in rows]
    assert gpu_h[0] < gpu_h[1] < gpu_h[2]  # at 64 episodes a step, each node added costs more than it saves
    assert rows[0].engines_stop_helping <= 64


def test_the_recipe_step_pays_for_more_nodes() -> None:
    one, four = (cost.cost_row("qwen3-8b", n, MODELS, recipe="qwen3-8b-tau2") for n in (1, 4))
    assert (one.grpo_step_rollout_s + one.grpo_step_train_s) > 3 * (four.grpo_step_rollout_s + four.grpo_step_train_s)
    assert four.grpo_gpu_h < 1.25 * one.grpo_gpu_h
    user = cost.load_model(PRESETS[cost.USER_MODEL], MODELS)
    model = cost.load_model(PRESETS["qwen3-8b"], MODELS)
    step = cost.grpo_step(model, user, cost.Layout(nodes=1, gpus_per_node=4, tp=2, rollout_gpus=4), 4,
                          cost.Work(64, 16, 40))
    assert step.cpu_s == pytest.approx(1024 * mean_turns(40) * 11.4e-3 / 3)  # 8.21 turns an episode at 40
    assert 30 < step.cpu_s < 33 and step.floor_s > step.cpu_s / 3  # the rollout process's CPU: the next floor


def test_decode_reads_weights_and_every_episodes_kv_cache() -> None:
    m = cost.load_model(PRESETS["qwen3-8b"], MODELS)
    bw = cost.value("hbm_bytes_s")
    assert cost.decode_step_s(m, 1, 0, 0) == pytest.approx(2 * m.params / bw)
    assert cost.decode_step_s(m, 2, 10, 1000) == pytest.approx((m.params + 10 * 1000 * m.kv_bytes_per_token / 2) / bw)
