"""The cost model's rollout step (tau2_rl_pipeline/scale/cost.py, scale/turns.py): the batch drains over the turn
distribution, an engine decodes at once only what its KV cache holds, and the floor stands on the step's footing.
Each test fails on the model before issue 30 (every episode decoding for every turn at full batch, no KV cap, the
floor without the harness's efficiency)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tau2_rl_pipeline.scale import cost
from tau2_rl_pipeline.scale.presets import PRESETS
from tau2_rl_pipeline.scale.sizing import Layout, Work, sglang_memory
from tau2_rl_pipeline.scale.turns import GOLD_ACTIONS, longest_in_batch, mean_turns, still_running, turns_pmf

MODELS = Path(__file__).resolve().parents[1] / "scripts" / "models"
MODEL = cost.load_model(PRESETS["qwen3-8b"], MODELS)
USER = cost.load_model(PRESETS[cost.USER_MODEL], MODELS)
ONE_NODE = Layout(nodes=1, gpus_per_node=4, tp=2, rollout_gpus=4, colocated=True)


def test_the_turn_distribution_is_p6s() -> None:
    """P6 (bench/README.md): gold actions of the 178 train tasks, two turns more each; 5% of episodes to the cap."""
    assert sum(GOLD_ACTIONS.values()) == 178
    gold_mean = sum((a + 2) * n for a, n in GOLD_ACTIONS.items()) / 178
    assert gold_mean == pytest.approx(6.54, abs=0.005)
    assert mean_turns(30) == pytest.approx(0.95 * gold_mean + 0.05 * 30)
    assert sum(turns_pmf(40).values()) == pytest.approx(1)
    assert still_running(1, 30) == pytest.approx(1) and still_running(16, 30) == pytest.approx(0.05)
    assert still_running(31, 30) == 0
    assert longest_in_batch(64, 30) == 30 and longest_in_batch(8, 30) == 15  # 1 - 0.95^8 = 0.34: no tail expected


def test_the_batch_drains_over_the_turns() -> None:
    """64 episodes, 30 turns: past turn 15 only the tail's 3.2 episodes decode; the step costs far less than every
    episode decoding for all 30 turns, and exactly the sum of its turns with the episodes still running."""
    step = cost.grpo_step(MODEL, USER, ONE_NODE, 4, Work(16, 4, 30))
    held = sglang_memory(MODEL, ONE_NODE)["kv_tokens"]
    user_held = sglang_memory(USER, Layout(1, 1, rollout_gpus=1, mem_fraction=0.85, train=False))["kv_tokens"]

    def turn(t: int, running: float) -> float:
        return (cost.reply_s(MODEL, 1, max(running / 4, 1), t, held, 150)
                + cost.reply_s(USER, 1, max(running / 4, 1), t, user_held, 60))

    by_hand = sum(turn(t, 64 * still_running(t, 30)) for t in range(1, 31)) / 0.9
    assert step.rollout_s == pytest.approx(by_hand)
    full_batch = sum(turn(t, 64) for t in range(1, 31)) / 0.9  # the old assumption, with the same contexts
    assert step.rollout_s < 0.6 * full_batch


def test_an_engine_decodes_at_once_only_what_its_kv_cache_holds() -> None:
    """256 episodes at turn 8 on an engine holding 100k tokens: 18k for the three shared system turns, 36 episodes'
    own 2250 tokens at a time in 7.1 rounds, and the 494k tokens it cannot keep prefilled again."""
    per_engine, held, own = 256, 100_000, 7.5 * 300
    at_once = (held - 3 * 6000) // own
    rounds = per_engine / at_once
    decode = 150 * rounds * cost.decode_step_s(MODEL, 1, at_once, 6000 + own)
    prefill = 2 * MODEL.active_params * (per_engine * own - (held - 18_000)) / (989e12 * 0.5)
    assert (at_once, round(rounds, 1)) == (36, 7.1)
    assert cost.reply_s(MODEL, 1, per_engine, 8, held, 150) == pytest.approx(decode + prefill)
    # with room for all, one round and nothing prefilled again
    assert cost.reply_s(MODEL, 1, per_engine, 8, 10**7, 150) == pytest.approx(
        150 * cost.decode_step_s(MODEL, 1, per_engine, 6000 + own))


def test_the_step_pays_for_a_small_kv_cache() -> None:
    """The recipe's 1024 episodes on one node: at memory fraction 0.35 an engine holds fewer tokens than its episodes
    want, and the step takes longer than the KV reads alone explain; the table's column says what each engine
    wants and holds."""
    work = Work(64, 16, 40)
    roomy = cost.grpo_step(MODEL, USER, ONE_NODE, 4, work)
    small = Layout(nodes=1, gpus_per_node=4, tp=2, rollout_gpus=4, colocated=True, mem_fraction=0.35)
    tight = cost.grpo_step(MODEL, USER, small, 4, work)
    assert roomy.kv_wanted <= roomy.kv_held and tight.kv_wanted > tight.kv_held
    assert tight.rollout_s > 1.2 * roomy.rollout_s  # 570 s against 440 s
    assert tight.train_s == roomy.train_s
    roomier = Layout(nodes=1, gpus_per_node=4, tp=2, rollout_gpus=4, colocated=True, mem_fraction=0.8)
    assert cost.grpo_step(MODEL, USER, roomier, 4, work).rollout_s == pytest.approx(roomy.rollout_s)  # both hold all


def test_the_floor_stands_on_the_steps_footing() -> None:
    """As many engines and user-simulator GPUs as episodes: every engine holds one episode, the step is its floor."""
    work = Work(2, 4, 30)
    many = Layout(nodes=1, gpus_per_node=8, tp=2, rollout_gpus=8, colocated=True)
    step = cost.grpo_step(MODEL, USER, many, 8, work)
    assert step.rollout_s == pytest.approx(step.floor_s)
    assert step.floor_s > step.cpu_s
