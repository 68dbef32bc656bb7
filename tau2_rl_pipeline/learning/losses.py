"""The local trainer's loss math as pure tensor functions, with the definitions slime uses.

Read from THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (no code copied):

- `gather_logprobs`: per-token log-prob and entropy of the full softmax after dividing the logits by the rollout
  temperature, as `get_log_probs_and_entropy` in slime/backends/megatron_utils/loss.py.
- `sft_loss`: masked token-level negative log-likelihood, `sft_loss_function` in the same file.
- `grpo_loss`: PPO-clip with asymmetric bounds (`compute_policy_loss` in slime/utils/ppo_utils.py):
  ratio = exp(logp - old_logp), pg = max(-A * ratio, -A * clip(ratio, 1 - eps_clip, 1 + eps_clip_high)),
  clipfrac = share of tokens where the clipped term is the larger one; then, as `policy_loss_function` in loss.py,
  loss = pg - entropy_coef * entropy + kl_coef * kl, with kl the low_var_kl estimator below.
- `low_var_kl`: `compute_approx_kl(kl_loss_type="low_var_kl")` in ppo_utils.py: Schulman's k3,
  exp(ref - logp) - 1 - (ref - logp), clamped to [-10, 10]; non-negative, unbiased, zero when policy == reference.

`awsft_loss` is not slime's: advantage-weighted SFT (the stable alternative to policy gradient on long multi-turn
episodes), teacher-forced NLL of the policy tokens, each episode weighted by its AWSFT weight (learning/awsft.py:
the recipe's batch-normalised advantage over the reference's pass rate, computed in the reward post-process), plus
kl_coef * KL to the reference. It takes the reduction as an argument, so the local trainer and the slime custom
loss (slime's own reducer, tau2_rl_pipeline/slime_plugins/awsft.py) run the same function.

Aggregation (`reducer`), one choice on both paths (TAU2_LOSS_REDUCTION), the same numbers as slime's reducers
(`get_sum_of_sample_mean` in slime/backends/megatron_utils/cp_utils.py, then the scaling in `loss_function`):
- `sample_mean` (slime's default): each sample's masked token mean (its mask-1 count, at least 1), summed and
  divided by the step's sample count (slime: times num_microbatches / the step's global batch size), so every
  episode weighs the same whatever its length;
- `token_mean` (slime's `--calculate-per-token-loss`): the masked sum divided by the step's mask-1 token count
  (slime: Megatron divides by the summed `num_tokens`), so a long episode counts for more than a short one.
Pass the step's totals (`num_tokens`, `num_samples`) to every micro-batch and the micro-batch losses (and
metrics) sum to the step's value. A wholly masked sample (removed: aborted, filtered; or every turn masked as
off-policy) counts as slime counts it: slime keeps it in its batch at mask 0 (its batch size is fixed by
--global-batch-size and split across data-parallel ranks, so the plug-ins cannot take it out), where it is one
sample of the per-sample mean and one token of the per-token count (`loss_function` sums each sample's mask count
clamped at 1: `step_tokens`). The local trainer keeps it too, so both give the same number under both reductions
(tests/contract/test_slime_awsft.py). SFT is `token_mean` on both paths (slime's SFT runs with the per-token flag).

Tensors are [batch, seq] and aligned to the input ids: position i holds the value for predicting token i, and
position 0 (nothing to predict it from) is always 0 with mask 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KL_CLAMP = 10.0  # slime clamps low_var_kl to [-10, 10] so a token the reference finds unlikely cannot explode


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor, *, temperature: float = 1.0,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target under softmax(logits / temperature), and that distribution's entropy.

    `logits[..., i, :]` must be the distribution `targets[..., i]` was drawn from (the caller does the shift).
    Computed in float32 whatever the logits' dtype (slime asserts float32 logits for the same reason: bf16
    log-probs are too coarse for importance ratios).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    if not with_entropy:
        return picked, None
    # H = -sum p log p = log Z - sum p * logit
    entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return picked, entropy


REDUCTIONS = ("sample_mean", "token_mean")


def step_tokens(targets_per_sample) -> int:
    """The per-token denominator of a step as slime's `loss_function` counts it: each sample's mask-1 tokens, at
    least 1 (a wholly masked sample counts as one token)."""
    return sum(max(int(n), 1) for n in targets_per_sample)


def reducer(loss_mask: torch.Tensor, reduction: str, *, num_tokens: int | None = None,
            num_samples: int | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [batch, seq] -> the masked mean of x as `reduction` defines it (module docstring); the denominators
    default to this batch's own (`step_tokens` of its rows, its row count)."""
    mask = loss_mask.float()
    if reduction == "token_mean":
        tokens = step_tokens(mask.sum(-1).tolist()) if num_tokens is None else num_tokens
        return lambda x: (x * mask).sum() / max(tokens, 1)
    if reduction == "sample_mean":
        per_sample = mask.sum(-1).clamp_min(1.0)
        samples = mask.shape[0] if num_samples is None else num_samples
        return lambda x: ((x * mask).sum(-1) / per_sample).sum() / max(samples, 1)
    raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")


def sft_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, *,
             num_tokens: int | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked token-level NLL: -sum(logp * mask) / num_tokens (default: this batch's mask-1 count).

    Only mask-1 positions are targets: whatever sits at a mask-0 position never enters the sum.
    """
    mask = loss_mask.to(logprobs.dtype)
    loss = -reducer(mask, "token_mean", num_tokens=num_tokens)(logprobs)
    return loss, {"loss": float(loss.detach())}


def low_var_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) from sampled-token log-probs, clamped to [-10, 10]."""
    log_ratio = ref_logprobs.float() - logprobs.float()
    return torch.clamp(log_ratio.exp() - 1.0 - log_ratio, min=-KL_CLAMP, max=KL_CLAMP)


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              loss_mask: torch.Tensor, *, eps_clip: float, eps_clip_high: float, reduction: str = "sample_mean",
              num_tokens: int | None = None, num_samples: int | None = None,
              entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
              ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip policy loss with optional entropy bonus and low_var_kl penalty, reduced as `reduction` says
    (`reducer`; slime's default per-sample mean unless told otherwise).

    `advantages` broadcasts against `logprobs` (a per-sequence advantage as [batch, 1]). Metrics go through the
    same reduction (so micro-batch metrics add up, see `merge_metrics`), except ratio_min / ratio_max.
    """
    if entropy_coef and entropy is None:
        raise ValueError("entropy_coef is set but no entropy was given")
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef is set but no reference log-probs were given")
    mask = loss_mask.to(logprobs.dtype)
    mean = reducer(mask, reduction, num_tokens=num_tokens, num_samples=num_samples)
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    pg = torch.maximum(unclipped, clipped)

    pg_loss = mean(pg)
    loss = pg_loss
    metrics = {
        "pg_loss": float(pg_loss.detach()),
        "clipfrac": float(mean((clipped > unclipped).to(mask.dtype))),
        "ppo_kl": float(mean(-log_ratio.detach())),  # slime's ppo_kl: old - new, the drift since the rollout
        "ratio_mean": float(mean(ratio.detach())),
    }
    valid = mask.bool()
    if valid.any():  # a batch with no targets has no ratio extremes (and must not fake some for merge_metrics)
        metrics["ratio_min"] = float(ratio.detach()[valid].min())
        metrics["ratio_max"] = float(ratio.detach()[valid].max())
    if entropy is not None:
        entropy_mean = mean(entropy)
        loss = loss - entropy_coef * entropy_mean
        metrics["entropy"] = float(entropy_mean.detach())
    if ref_logprobs is not None:
        kl = mean(low_var_kl(logprobs, ref_logprobs))
        loss = loss + kl_coef * kl
        metrics["kl"] = float(kl.detach())
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def awsft_loss(logprobs: torch.Tensor, weights: torch.Tensor, reduce: Callable[[torch.Tensor], torch.Tensor], *,
               kl: torch.Tensor | None = None, kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """reduce(-w * logp) + kl_coef * reduce(kl), w each sample's AWSFT weight (learning/awsft.py) broadcast to its
    tokens.

    `reduce` is the masked aggregation (`reducer` locally, slime's sum_of_sample_mean on slime); `kl` the per-token
    KL estimate to the reference, or None for no KL term. Metrics are detached tensors through the same reduce.
    """
    if kl_coef and kl is None:
        raise ValueError("kl_coef is set but no per-token KL was given")
    weights = weights.float().expand_as(logprobs)
    nll = reduce(-weights * logprobs)
    loss = nll
    metrics = {"awsft_nll": nll.detach(), "awsft_weight": reduce(weights).detach()}
    if kl is not None:
        kl_mean = reduce(kl)
        loss = loss + kl_coef * kl_mean
        metrics["kl"] = kl_mean.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics


def local_awsft_loss(logprobs: torch.Tensor, weights: torch.Tensor, loss_mask: torch.Tensor, *,
                     reduction: str = "sample_mean", num_tokens: int | None = None, num_samples: int | None = None,
                     ref_logprobs: torch.Tensor | None = None,
                     kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """`awsft_loss` over [batch, seq] tensors as the local trainer reduces them (`reducer`), with low_var_kl to
    `ref_logprobs` when given; `weights` [batch, 1]."""
    kl = None if ref_logprobs is None else low_var_kl(logprobs, ref_logprobs)
    reduce = reducer(loss_mask.to(logprobs.dtype), reduction, num_tokens=num_tokens, num_samples=num_samples)
    loss, metrics = awsft_loss(logprobs, weights, reduce, kl=kl, kl_coef=kl_coef)
    return loss, {k: float(v) for k, v in metrics.items()}


def merge_metrics(total: dict[str, float], part: dict[str, float]) -> dict[str, float]:
    """Combine one micro-batch's metrics into the step's: *_min by min, *_max by max, everything else summed
    (the parts are token means over the whole step's count, so their sum is the step's mean)."""
    merged = dict(total)
    for key, value in part.items():
        if key not in merged:
            merged[key] = value
        elif key.endswith("_min"):
            merged[key] = min(merged[key], value)
        elif key.endswith("_max"):
            merged[key] = max(merged[key], value)
        else:
            merged[key] = merged[key] + value
    return merged
