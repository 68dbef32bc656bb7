"""Advantage-weighted SFT: the loss against its formula on hand-made batches, a real step of the local trainer,
and slime's own loss plumbing (slime 624b824's `loss_function`, run on CPU) calling the custom loss module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tau2_rl_pipeline.losses import (
    awsft_loss,
    awsft_weights,
    local_awsft_loss,
    low_var_kl,
)
from tau2_rl_pipeline.trainer import LocalTrainer, TrainConfig, TrainExample

ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = ROOT.parent / "shared" / "third_party"
SLIME = THIRD_PARTY / "slime-624b824"
MEGATRON = THIRD_PARTY / "megatron-lm-1dcf0daf"


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


# ---------------------------------------------------------------------------------------------------------------
# slime's real plumbing

SLIME_PROBE = textwrap.dedent("""
    import json, socket, sys
    from argparse import Namespace
    import torch, torch.distributed as dist
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    from megatron.core import parallel_state as mpu
    mpu.initialize_model_parallel(1, 1)
    from slime.backends.megatron_utils.loss import loss_function

    spec = json.loads(sys.argv[1])
    torch.manual_seed(0)
    total, responses = spec["total_lengths"], spec["response_lengths"]
    logits = torch.randn(1, sum(total), spec["vocab"], requires_grad=True)
    tokens = [torch.randint(0, spec["vocab"], (n,)) for n in total]
    masks = [torch.tensor(m, dtype=torch.float32) for m in spec["loss_masks"]]
    advantages = [a * torch.ones(n) for a, n in zip(spec["advantages"], responses)]
    ref = [torch.tensor(r) for r in spec["ref_log_probs"]]
    args = Namespace(loss_type="custom_loss", custom_loss_function_path=spec["path"], calculate_per_token_loss=False,
                     recompute_loss_function=False, allgather_cp=False, rollout_temperature=1.0,
                     log_probs_chunk_size=-1, entropy_coef=0.0, use_kl_loss=True, kl_loss_coef=spec["kl_coef"],
                     kl_loss_type="low_var_kl")
    batch = {"unconcat_tokens": tokens, "total_lengths": total, "response_lengths": responses, "loss_masks": masks,
             "rollout_mask_sums": None, "advantages": advantages, "ref_log_probs": ref}
    loss, normalizer, log = loss_function(args, batch, 1, len(total), logits)
    loss.backward()
    print(json.dumps({"loss": float(loss), "keys": log["keys"], "values": log["values"].tolist(),
                      "logits": logits.detach().tolist(), "tokens": [t.tolist() for t in tokens],
                      "grad_norm": float(logits.grad.norm())}))
""")


def _slime_importable() -> bool:
    return (SLIME / "slime" / "backends" / "megatron_utils" / "loss.py").is_file() and (MEGATRON / "megatron").is_dir()


@pytest.mark.skipif(not _slime_importable(), reason="needs slime 624b824 and Megatron-LM in ../shared/third_party")
def test_slimes_loss_function_runs_the_custom_loss_with_what_it_expects():
    """slime's `loss_function` (--loss-type custom_loss) loads our function by its dotted path and calls it with
    its batch, logits and per-sample-mean reducer; the result is the formula on the same numbers, rescaled as
    slime rescales its own losses (per-sample mean, times num_microbatches / global batch = 1/2 here)."""
    spec = {"path": "tau2_rl_pipeline.slime_awsft.awsft_loss_function", "vocab": 11, "kl_coef": 0.05,
            "total_lengths": [6, 5], "response_lengths": [3, 4], "loss_masks": [[1, 1, 0], [1, 0, 1, 1]],
            "advantages": [1.5, -0.5], "ref_log_probs": [[-2.0, -2.5, -1.0], [-3.0, -2.0, -2.2, -2.4]]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SLIME), str(MEGATRON), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", SLIME_PROBE, json.dumps(spec)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    # The same loss computed here from the same logits, as slime lays them out (packed, position t predicts t+1).
    logits = torch.tensor(out["logits"])[0]
    logp_all = torch.log_softmax(logits, dim=-1)
    expected, offset = 0.0, 0
    for toks, total, resp, mask, adv, ref in zip(out["tokens"], spec["total_lengths"], spec["response_lengths"],
                                                 spec["loss_masks"], spec["advantages"], spec["ref_log_probs"]):
        positions = range(offset + total - resp - 1, offset + total - 1)
        lp = torch.stack([logp_all[p, toks[p - offset + 1]] for p in positions])
        m = torch.tensor(mask, dtype=torch.float32)
        kl = low_var_kl(lp, torch.tensor(ref))
        expected += float(((-formula_weight(adv) * lp + spec["kl_coef"] * kl) * m).sum() / m.sum())
        offset += total
    assert out["loss"] == pytest.approx(expected / 2, rel=1e-5)
    assert {"loss", "awsft_nll", "awsft_weight", "kl"} <= set(out["keys"])
    assert out["grad_norm"] > 0
