"""Advantage-weighted SFT as the recipe defines it: A = r - V*(prompt), V* the reference's pass rate on the task,
normalised over the whole batch, w = clamp(clamp(A_norm, -3, 3) + 1, 0.1, 5), a per-example mean of w * CE; the
numbers of issue 24 through the reward post-process the local pipeline and slime both run (learning/reward.py),
then the loss and a real step of the local trainer. slime's own loss plumbing calling the custom loss module, and
V* reaching slime's samples from the difficulty stage's task rows, are in tests/contract/test_slime_awsft.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning import awsft
from tau2_rl_pipeline.learning.curriculum import CurriculumTracker
from tau2_rl_pipeline.learning.losses import awsft_loss, local_awsft_loss, low_var_kl
from tau2_rl_pipeline.learning.reward import post_process
from tau2_rl_pipeline.local.examples import TrainExample
from tau2_rl_pipeline.local.trainer import LocalTrainer, TrainConfig


def formula_weight(a: float) -> float:
    """The recipe's definition, written out in plain Python."""
    return min(max(min(max(a, -3.0), 3.0) + 1.0, 0.1), 5.0)


def samples(groups: list[tuple[str, list[float], float | None]]) -> list[SimpleNamespace]:
    """Completed samples as the rollout leaves them: (task id, its group's rewards, its V* or None = unmeasured)."""
    out = []
    for task_id, rewards, v_star in groups:
        meta = {"domain": "mock", "task_id": task_id, **({} if v_star is None else {awsft.BASELINE_KEY: v_star})}
        out += [SimpleNamespace(reward=r, metadata={**meta, "raw_reward": float(r >= 1.0)}, remove_sample=False,
                                status=SimpleNamespace(name="COMPLETED")) for r in rewards]
    return out


def weights(groups, cfg: Tau2Config | None = None, tracker: CurriculumTracker | None = None) -> list[float]:
    cfg = cfg or Tau2Config.from_env({})
    return post_process(samples(groups), 4, cfg, tracker or CurriculumTracker(cfg), "awsft")[1]


def test_the_weight_follows_the_formula():
    for a in (-7.0, -3.0, -1.0, -0.95, -0.5, 0.0, 0.5, 1.5, 3.0, 9.0):
        assert awsft.weight(a) == pytest.approx(formula_weight(a))
    assert min(awsft.weight(a) for a in (-9.0, -3.0)) == 0.1  # every episode is imitated a little, none unlearned


def test_an_all_fail_group_is_imitated_less_than_the_success_and_as_little_as_the_other_failures():
    got = weights([("a", [1, 0, 0, 0], 0.0), ("b", [0, 0, 0, 0], 0.0)])
    assert got == pytest.approx([3.475] + [0.646] * 7, abs=5e-4)
    # GRPO's per-group z-score (the earlier AWSFT input) gave [2.5, .5, .5, .5, 1, 1, 1, 1]
    grpo = post_process(samples([("a", [1, 0, 0, 0], 0.0), ("b", [0, 0, 0, 0], 0.0)]), 4, Tau2Config.from_env({}),
                        CurriculumTracker(Tau2Config.from_env({})))[1]
    assert [formula_weight(a) for a in grpo] == pytest.approx([2.5, 0.5, 0.5, 0.5, 1, 1, 1, 1], abs=1e-4)


def test_no_failure_outweighs_a_success():
    got = weights([("a", [0, 0, 0, 1e-4], 0.0), ("b", [1, 0, 1, 0], 0.0)])
    successes, failures = [got[4], got[6]], got[:4] + [got[5], got[7]]
    assert min(successes) > 2.5 and max(failures) < 0.5  # the group z-score gave the 1e-4 failure 2.471, them 1.866


def test_the_reference_pass_rate_is_the_baseline_and_its_fallback():
    got = weights([("easy", [1, 0, 0, 0], 0.9), ("hard", [1, 0, 0, 0], 0.1)])
    assert got[4] > got[0] and got[5] > got[1]  # beating a hard task's reference counts for more, failing it less
    # a task without V* gets the batch's mean measured V*: here 0.5 for "new", as if it had been measured so
    assert weights([("easy", [1, 0, 0, 0], 0.9), ("new", [1, 0, 1, 0], None)]) == \
        weights([("easy", [1, 0, 0, 0], 0.9), ("new", [1, 0, 1, 0], 0.9)])
    # none measured: every baseline is the same constant, which the batch normalisation removes
    assert weights([("a", [1, 0, 0, 0], None), ("b", [1, 1, 0, 0], None)]) == \
        pytest.approx(weights([("a", [1, 0, 0, 0], 0.3), ("b", [1, 1, 0, 0], 0.3)]))
    with pytest.raises(ValueError, match=r"reference_pass_rate'\]=1.5 must be a pass rate in \[0, 1\]"):
        weights([("a", [1, 0, 0, 0], 1.5)])


def test_the_curriculum_weight_never_raises_a_failures_weight():
    cfg = Tau2Config.from_env({})
    assert weights([("solved", [1, 1, 1, 0], 0.0)], cfg) == pytest.approx([1.5, 1.5, 1.5, 0.1], abs=1e-5)
    tracker = CurriculumTracker(cfg)
    for _ in range(10):
        tracker.record("mock/solved", True)  # solved so far: curriculum weight 0.1
    got = weights([("solved", [1, 1, 1, 0], 0.0)], cfg, tracker)
    assert tracker.weight("mock/solved") == 0.1
    assert got == pytest.approx([0.15, 0.15, 0.15, 0.01], abs=1e-5)  # was [1.05, 1.05, 1.05, 0.85]
    assert awsft.with_curriculum(0.1, 2.0, True) == 0.1 and awsft.with_curriculum(2.0, 2.0, True) == 4.0  # c > 1
    assert awsft.with_curriculum(2.0, 2.0, False) == 2.0  # ... raises only a success's weight
    off = Tau2Config.from_env({"TAU2_APPLY_CURRICULUM_WEIGHTS": "0"})
    assert weights([("solved", [1, 1, 1, 0], 0.0)], off, tracker) == pytest.approx([1.5, 1.5, 1.5, 0.1], abs=1e-5)


def shaped_samples(groups: list[tuple[str, list[tuple[float, float]], float | None]]) -> list[SimpleNamespace]:
    """Completed samples with partial credit: (task id, its group's (task reward, shaped reward) pairs, its V*)."""
    out = []
    for task_id, pairs, v_star in groups:
        meta = {"domain": "mock", "task_id": task_id, **({} if v_star is None else {awsft.BASELINE_KEY: v_star})}
        out += [SimpleNamespace(reward=shaped, metadata={**meta, "raw_reward": raw}, remove_sample=False,
                                status=SimpleNamespace(name="COMPLETED")) for raw, shaped in pairs]
    return out


# the seed's first batch ([1,0,0,0] and [0,0,0,0], V* = 0) as the rollout scores it with partial credit on
WITH_PARTIAL_CREDIT = [("a", [(1.0, 1.2), (0.0, 0.25), (0.0, 0.1), (0.0, 0.0)], 0.0),
                       ("b", [(0.0, 0.2), (0.0, 0.05), (0.0, 0.0), (0.0, 0.0)], 0.0)]


def test_a_and_v_star_come_from_the_binary_task_reward_by_default():
    """Seed 002 scores A = r - V* with the binary task reward, the scale of V* (a pass rate): partial credit in the
    shaped reward changes nothing by default, and moves the weights only under TAU2_AWSFT_REWARD=shaped."""
    cfg = Tau2Config.from_env({})
    assert cfg.use_partial_credit and cfg.awsft_reward == "task"
    got = post_process(shaped_samples(WITH_PARTIAL_CREDIT), 4, cfg, CurriculumTracker(cfg), "awsft")[1]
    assert got == pytest.approx([3.475] + [0.646] * 7, abs=5e-4)  # the seed's numbers (tested above on 0/1 rewards)
    shaped_cfg = Tau2Config.from_env({"TAU2_AWSFT_REWARD": "shaped"})
    shaped = post_process(shaped_samples(WITH_PARTIAL_CREDIT), 4, shaped_cfg, CurriculumTracker(shaped_cfg),
                          "awsft")[1]
    rewards = [shaped for _, pairs, _ in WITH_PARTIAL_CREDIT for _, shaped in pairs]
    assert shaped == pytest.approx(awsft.batch_weights(rewards, [0.0] * 8, [True] * 8))
    assert max(abs(x - y) for x, y in zip(got, shaped)) > 0.1  # partial credit ranks the failures
    assert shaped[1] > shaped[2] > shaped[3] and got[1] == got[2] == got[3]


def test_a_hard_weight_above_one_never_raises_a_failures_weight():
    """TAU2_CURRICULUM_HARD_WEIGHT=2 on a task whose reference never solves it: its failures sit above the batch's
    level (the easy task's failures fall 0.9 below their V*), so they weigh more than 1; c = 2 leaves them so
    (it doubled them before), and still doubles a success's weight above 1."""
    cfg = Tau2Config.from_env({"TAU2_CURRICULUM_HARD_WEIGHT": "2"})
    groups = [("easy", [1, 0, 0, 0], 0.9), ("hard", [0, 0, 0, 0], 0.0)]
    plain = weights(groups, cfg)
    tracker = CurriculumTracker(cfg)
    for _ in range(6):
        tracker.record("mock/hard", False)  # hard so far: curriculum weight 2
    got = weights(groups, cfg, tracker)
    assert tracker.weight("mock/hard") == 2.0
    assert plain[4:] == pytest.approx([1.681] * 4, abs=5e-4) and got[4:] == pytest.approx(plain[4:])  # unchanged
    assert [2 * w for w in plain[4:]] != pytest.approx(got[4:])  # (what the earlier composition gave)
    solved = weights([("easy", [1, 0, 0, 0], 0.9), ("hard", [1, 0, 0, 0], 0.0)], cfg, tracker)
    assert solved[4] == pytest.approx(min(2 * weights([("easy", [1, 0, 0, 0], 0.9),
                                                        ("hard", [1, 0, 0, 0], 0.0)], cfg)[4], 5.0))


@pytest.mark.parametrize("name", ["TAU2_CURRICULUM_HARD_WEIGHT", "TAU2_CURRICULUM_SOLVED_WEIGHT"])
def test_the_config_refuses_curriculum_weights_the_recipe_cannot_use(name):
    """Above AWSFT's largest weight (5) a curriculum weight only saturates it: every success of the task weighs 5."""
    from tau2_rl_pipeline.config import ConfigError

    assert getattr(Tau2Config.from_env({name: "5"}), name.removeprefix("TAU2_").lower()) == 5.0
    with pytest.raises(ConfigError, match=f"{name}=6.0 must be <= 5.0"):
        Tau2Config.from_env({name: "6"})


def test_aborted_and_removed_samples_get_weight_zero_and_stay_out_of_the_statistics():
    batch = samples([("a", [1, 0, 0, 0], 0.0), ("b", [0, 0, 0, 0], 0.0)])
    batch[7].status = SimpleNamespace(name="ABORTED")
    cfg = Tau2Config.from_env({})
    got = post_process(batch, 4, cfg, CurriculumTracker(cfg), "awsft")[1]
    assert got[7] == 0.0
    assert got[:7] == pytest.approx(awsft.batch_weights([1, 0, 0, 0, 0, 0, 0], [0.0] * 7, [True] * 7))


# ---------------------------------------------------------------------------------------------------------------
# the loss


def test_per_example_mean_of_w_times_ce_two_episodes_of_2_and_8_tokens():
    logprobs = torch.cat([torch.zeros(2, 1), -torch.ones(2, 8)], 1)  # CE 1 per token
    mask = torch.zeros(2, 9)
    mask[0, 1:3] = 1  # 2 tokens
    mask[1, 1:9] = 1  # 8 tokens
    weights_ = torch.tensor([[2.5], [0.5]])
    assert local_awsft_loss(logprobs, weights_, mask)[0].item() == pytest.approx(1.5)  # the recipe (and slime)
    assert local_awsft_loss(logprobs, weights_, mask, reduction="token_mean")[0].item() == pytest.approx(0.9)


def test_loss_with_kl_on_a_hand_made_batch_and_its_gradient():
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.25, -3.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.float32)
    w = torch.tensor([[3.0], [0.5]])
    ref = torch.tensor([[0.0, -1.5, -2.0, -9.0], [0.0, -0.25, -2.0, -1.5]])
    loss, metrics = local_awsft_loss(logprobs, w, mask, ref_logprobs=ref, kl_coef=0.1)

    def k3(lp: float, rf: float) -> float:
        return torch.tensor(rf - lp).exp().item() - 1 - (rf - lp)

    nll = (3.0 * (1.0 + 2.0) / 2 + 0.5 * (0.25 + 3.0 + 1.0) / 3) / 2  # each sample's token mean, then the mean
    kl = ((k3(-1, -1.5) + k3(-2, -2)) / 2 + (k3(-0.25, -0.25) + k3(-3, -2) + k3(-1, -1.5)) / 3) / 2
    assert metrics["awsft_nll"] == pytest.approx(nll) and metrics["kl"] == pytest.approx(kl)
    assert float(loss.detach()) == pytest.approx(nll + 0.1 * kl)
    assert metrics["awsft_weight"] == pytest.approx((3.0 + 0.5) / 2)
    loss.backward()
    per = torch.tensor([[2.0], [3.0]]) * 2  # d/d logp = (-w + 0.1 * (1 - exp(ref - logp))) / (tokens_i * samples)
    expected = (-w + 0.1 * (1 - (ref - logprobs.detach()).exp())) / per
    assert torch.allclose(logprobs.grad, expected * mask, atol=1e-6)
    with pytest.raises(ValueError, match="kl_coef"):
        awsft_loss(logprobs, w, lambda x: x.sum(), kl_coef=0.1)
    assert torch.equal(low_var_kl(logprobs, logprobs), torch.zeros_like(logprobs))


# ---------------------------------------------------------------------------------------------------------------
# the local trainer


def _one_step(model_dir: Path, log_dir: Path, examples: list[TrainExample], **cfg) -> tuple[float, float, dict]:
    trainer = LocalTrainer(model_dir, TrainConfig(log_jsonl=log_dir / "metrics.jsonl", lr=1e-3, **cfg))
    before = trainer.evaluate(examples[:1])
    record = trainer.awsft_step(examples)
    return before, trainer.evaluate(examples[:1]), record


def test_awsft_step_imitates_in_proportion_to_the_weight(tiny_small_dir, small_tokenizer, tmp_path):
    ids = small_tokenizer.encode("<|im_start|>assistant\nI created the task for you.<|im_end|>",
                                 add_special_tokens=False)
    mask = [0, 0, 0] + [1] * (len(ids) - 3)
    good = TrainExample(input_ids=ids, loss_mask=mask, weight=3.0)
    bad = TrainExample(input_ids=ids, loss_mask=mask, weight=0.1)
    before, after_good, record = _one_step(tiny_small_dir, tmp_path / "good", [good])
    _, after_bad, _ = _one_step(tiny_small_dir, tmp_path / "bad", [bad])
    assert after_good < after_bad < before  # both imitated, the heavier one far more
    assert record["stage"] == "awsft" and record["awsft_weight"] == pytest.approx(3.0)
    logged = [json.loads(line) for line in (tmp_path / "good" / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["stage"] == "awsft" and "awsft_nll" in logged[0]
    _, _, with_kl = _one_step(tiny_small_dir, tmp_path / "kl", [good], kl_coef=0.1)
    assert with_kl["kl"] == 0.0  # the first step starts at the reference
    assert "kl" not in record
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
        TrainExample(input_ids=ids, loss_mask=mask, weight=-1.0)


def test_the_step_is_a_per_example_mean_unless_token_mean_is_asked(tiny_small_dir, small_tokenizer, tmp_path):
    short = small_tokenizer.encode("<|im_start|>assistant\nOk.<|im_end|>", add_special_tokens=False)
    long = small_tokenizer.encode("<|im_start|>assistant\nI created the task Important Meeting for user 1, as "
                                  "you asked.<|im_end|>", add_special_tokens=False)
    examples = [TrainExample(input_ids=short, loss_mask=[0, 0, 0] + [1] * (len(short) - 3), weight=2.5),
                TrainExample(input_ids=long, loss_mask=[0, 0, 0] + [1] * (len(long) - 3), weight=0.5)]
    per_sample = _one_step(tiny_small_dir, tmp_path / "s", examples, micro_batch_size=1)[2]
    per_token = _one_step(tiny_small_dir, tmp_path / "t", examples, micro_batch_size=2,
                          loss_reduction="token_mean")[2]
    assert per_sample["awsft_weight"] == pytest.approx((2.5 + 0.5) / 2)  # micro-batches add up to the step's mean
    n_short, n_long = len(short) - 3, len(long) - 3
    assert per_token["awsft_weight"] == pytest.approx((2.5 * n_short + 0.5 * n_long) / (n_short + n_long))
