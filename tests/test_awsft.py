"""Advantage-weighted SFT: the loss against its formula on hand-made batches and a real step of the local trainer.
slime's own loss plumbing calling the custom loss module is in tests/contract/test_slime_awsft.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tau2_rl_pipeline.learning.losses import awsft_loss, awsft_weights, local_awsft_loss, low_var_kl
from tau2_rl_pipeline.local.trainer import LocalTrainer, TrainConfig, TrainExample


def formula_weight(a: float) -> float:
    """The issue's definition, written out in plain Python."""
    return min(max(min(max(a, -3.0), 3.0) + 1.0, 0.1), 5.0)


def test_weights_follow_the_formula():
    advantages = [-7.0, -3.0, -1.0, -0.95, -0.5, 0.0, 0.5, 1.5, 3.0, 9.0]
    got = awsft_weights(torch.tensor(advantages)).tolist()
    assert got == pytest.approx([formula_weight(a) for a in advantages])
    assert got == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.5, 1.0, 1.5, 2.5, 4.0, 4.0])
    assert min(got) > 0  # every episode is imitated a little, none is unlearned


def test_loss_is_the_weighted_token_mean_plus_kl_on_a_hand_made_batch():
    logprobs = torch.tensor([[0.0, -1.0, -2.0, -0.5], [0.0, -0.25, -3.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.float32)
    advantages = torch.tensor([[2.0], [-0.5]])  # weights 3.0 and 0.5
    ref = torch.tensor([[0.0, -1.5, -2.0, -9.0], [0.0, -0.25, -2.0, -1.5]])
    loss, metrics = local_awsft_loss(logprobs, advantages, mask, ref_logprobs=ref, kl_coef=0.1)

    nll = (3.0 * (1.0 + 2.0) + 0.5 * (0.25 + 3.0 + 1.0)) / 5  # mask-1 tokens only, over the 5 of them

    def k3(lp: float, rf: float) -> float:
        return torch.tensor(rf - lp).exp().item() - 1 - (rf - lp)

    kl = (k3(-1, -1.5) + k3(-2, -2) + k3(-0.25, -0.25) + k3(-3, -2) + k3(-1, -1.5)) / 5
    assert metrics["awsft_nll"] == pytest.approx(nll)
    assert metrics["kl"] == pytest.approx(kl)
    assert float(loss.detach()) == pytest.approx(nll + 0.1 * kl)
    assert metrics["awsft_weight"] == pytest.approx((3.0 * 2 + 0.5 * 3) / 5)
    loss.backward()
    grad = logprobs.grad  # d loss / d logp = -w / N + 0.1 * (1 - exp(ref - logp)) / N on mask-1 tokens, else 0
    expected = -torch.tensor([[3.0], [0.5]]) / 5 + 0.1 * (1 - (ref - logprobs.detach()).exp()) / 5
    assert torch.allclose(grad, expected * mask, atol=1e-6)


def test_num_tokens_sets_the_denominator_and_kl_is_optional():
    logprobs = torch.tensor([[0.0, -1.0, -2.0]])
    mask = torch.tensor([[0, 1, 1]], dtype=torch.float32)
    loss, metrics = local_awsft_loss(logprobs, torch.tensor([[0.0]]), mask, num_tokens=6)
    assert float(loss) == pytest.approx(3.0 / 6) and "kl" not in metrics
    with pytest.raises(ValueError, match="kl_coef"):
        awsft_loss(logprobs, torch.tensor([[0.0]]), lambda x: x.sum(), kl_coef=0.1)
    assert torch.equal(low_var_kl(logprobs, logprobs), torch.zeros_like(logprobs))


# ---------------------------------------------------------------------------------------------------------------
# the local trainer


def _one_step(model_dir: Path, log_dir: Path, example: TrainExample, **cfg) -> tuple[float, float, dict]:
    trainer = LocalTrainer(model_dir, TrainConfig(log_jsonl=log_dir / "metrics.jsonl", lr=1e-3, **cfg))
    before = trainer.evaluate([example])
    record = trainer.awsft_step([example])
    return before, trainer.evaluate([example]), record


def test_awsft_step_imitates_in_proportion_to_the_advantage(tiny_small_dir, small_tokenizer, tmp_path):
    ids = small_tokenizer.encode("<|im_start|>assistant\nI created the task for you.<|im_end|>",
                                 add_special_tokens=False)
    mask = [0, 0, 0] + [1] * (len(ids) - 3)
    good = TrainExample(input_ids=ids, loss_mask=mask, advantage=2.0)
    bad = TrainExample(input_ids=ids, loss_mask=mask, advantage=-2.0)
    before, after_good, record = _one_step(tiny_small_dir, tmp_path / "good", good)
    _, after_bad, _ = _one_step(tiny_small_dir, tmp_path / "bad", bad)
    assert after_good < after_bad < before  # both imitated (weights 3.0 and 0.1), the good one far more
    assert record["stage"] == "awsft" and record["awsft_weight"] == pytest.approx(3.0)
    logged = [json.loads(line) for line in (tmp_path / "good" / "metrics.jsonl").read_text().splitlines()]
    assert logged[0]["stage"] == "awsft" and "awsft_nll" in logged[0]
    _, _, with_kl = _one_step(tiny_small_dir, tmp_path / "kl", good, kl_coef=0.1)
    assert with_kl["kl"] == 0.0  # the first step starts at the reference
    assert "kl" not in record
