"""slime custom loss: advantage-weighted SFT (losses.awsft_loss) inside slime's Megatron training step.

    --loss-type custom_loss --custom-loss-function-path tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function

scripts/train_grpo.sh passes both when GRPO_ALGORITHM=awsft. slime 624b824 calls the function as
`func(args, batch, logits, sum_of_sample_mean)` from `loss_function` in slime/backends/megatron_utils/loss.py and
rescales what it returns for Megatron exactly as for its own losses. Everything else of the GRPO run stays: the
episodes, the reward post-process (its group-normalized, curriculum-weighted advantages arrive as
batch["advantages"], one value per response token) and the reference model (--use-kl-loss loads it; its
log-probs arrive as batch["ref_log_probs"], and the KL term uses --kl-loss-coef and --kl-loss-type).

slime is imported inside the call: this module is loaded by dotted path in slime's training process, and
imports (and tests) without slime elsewhere.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

from tau2_rl_pipeline.learning.losses import awsft_loss


def awsft_loss_function(args: Namespace, batch: dict[str, Any], logits: Any,
                        sum_of_sample_mean: Callable[[Any], Any]) -> tuple[Any, dict[str, Any]]:
    """Weighted NLL of the response tokens plus kl_loss_coef * KL to the reference; metrics for slime's logger."""
    import torch
    from slime.backends.megatron_utils.loss import get_log_probs_and_entropy
    from slime.utils.ppo_utils import compute_approx_kl

    _, scored = get_log_probs_and_entropy(
        logits, args=args, unconcat_tokens=batch["unconcat_tokens"], total_lengths=batch["total_lengths"],
        response_lengths=batch["response_lengths"], with_entropy=False)
    log_probs = torch.cat(scored["log_probs"], dim=0)
    advantages = torch.cat(batch["advantages"], dim=0)
    kl, kl_coef = None, 0.0
    if args.use_kl_loss:
        ref_log_probs = torch.cat(batch["ref_log_probs"], dim=0)
        kl = compute_approx_kl(log_probs, ref_log_probs, kl_loss_type=args.kl_loss_type)
        kl_coef = args.kl_loss_coef
    loss, metrics = awsft_loss(log_probs, advantages, sum_of_sample_mean, kl=kl, kl_coef=kl_coef)
    if log_probs.numel() == 0:  # as slime's own losses: keep the graph connected on a rank with no tokens
        loss = loss + 0 * logits.sum()
    return loss, metrics
