"""slime custom loss: advantage-weighted SFT (losses.awsft_loss) inside slime's Megatron training step.

    --loss-type custom_loss --custom-loss-function-path tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function

scripts/train_grpo.sh passes both when GRPO_ALGORITHM=awsft. slime 624b824 calls the function as
`func(args, batch, logits, sum_of_sample_mean)` from `loss_function` in slime/backends/megatron_utils/loss.py and
rescales what it returns for Megatron exactly as for its own losses: `sum_of_sample_mean` is its per-sample mean,
or its per-token sum under --calculate-per-token-loss (TAU2_LOSS_REDUCTION=token_mean). The episodes and the
reference model stay the GRPO run's (--use-kl-loss loads it; its log-probs arrive as batch["ref_log_probs"], and
the KL term uses --kl-loss-coef and --kl-loss-type). The weights come from the reward post-process: when slime's
args name this loss, slime_plugins.adapter.reward_post_process returns each sample's AWSFT weight
(learning/awsft.py: reward over the task's reference pass rate, which the difficulty stage wrote into the task
index row and slime copied onto the sample, normalised over the rollout batch) in place of GRPO's advantages, and
slime's grpo estimator hands it on unchanged as batch["advantages"], one value per response token.

slime is imported inside the call: this module is loaded by dotted path in slime's training process, and
imports (and tests) without slime elsewhere.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

from tau2_rl_pipeline.learning.losses import awsft_loss

LOSS_FUNCTION_PATH = "tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function"


def is_awsft(args: Namespace) -> bool:
    """Whether slime's args train with this loss (what the reward post-process then computes weights for)."""
    return (getattr(args, "loss_type", None) == "custom_loss"
            and getattr(args, "custom_loss_function_path", None) == LOSS_FUNCTION_PATH)


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
    weights = torch.cat(batch["advantages"], dim=0)  # the AWSFT weights (reward_post_process), per token
    kl, kl_coef = None, 0.0
    if args.use_kl_loss:
        ref_log_probs = torch.cat(batch["ref_log_probs"], dim=0)
        kl = compute_approx_kl(log_probs, ref_log_probs, kl_loss_type=args.kl_loss_type)
        kl_coef = args.kl_loss_coef
    loss, metrics = awsft_loss(log_probs, weights, sum_of_sample_mean, kl=kl, kl_coef=kl_coef)
    if log_probs.numel() == 0:  # as slime's own losses: keep the graph connected on a rank with no tokens
        loss = loss + 0 * logits.sum()
    return loss, metrics
