"""The stage graph and the GRPO, AWSFT and SFT defaults, written once for both backends.

The slime stage scripts (launch/stages.py) and the local backend (local/trainer.py, local/pipeline.py) read the same objects.

What the two backends share is the loss and the optimizer (PPO clip, KL to the starting checkpoint, entropy bonus,
Adam's betas, the reduction); what differs is the scale (a tiny model on a CPU takes a larger learning rate, fewer
samples), which each backend keeps beside its own settings. The slime values are the original cookbook's; the
learning rates, batch and layout that depend on the model's size are scale/presets.py's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecipeStage:
    """A training stage of the recipe: the checkpoint it starts from (for GRPO and AWSFT also the KL reference) and
    what it trains on. slime's pipeline (launch/graph.py, launch/stages.py, launch/grpo.py) and the local one
    (local/pipeline.py, its paired comparisons) read this one chain."""

    name: str
    starts_from: str  # "base" or an earlier stage's name
    trains_on: str


# Each stage starts from the one before; RFT's data is sampled by the policy it starts from (the SFT one). Both policy
# stages (GRPO and AWSFT, the local pipeline's --algorithm) start from RFT. RFT_INIT_DIR=<the base torch_dist dir>
# gives slime's RFT the original cookbook's start (its "SFT1": the base model again).
STAGE_GRAPH = (
    RecipeStage("sft", "base", "the seed demonstrations"),
    RecipeStage("rft", "sft", "the SFT policy's successful episodes (rejection sampling) with the seed demonstrations"),
    RecipeStage("grpo", "rft", "the train tasks in the RFT sampling's pass-rate band (PPO-clip loss)"),
    RecipeStage("awsft", "rft", "the train tasks in the RFT sampling's pass-rate band (advantage-weighted SFT loss)"),
)


def starts_from(stage: str) -> str:
    """The stage whose checkpoint `stage` loads ("base": the model the run begins with)."""
    found = [s.starts_from for s in STAGE_GRAPH if s.name == stage]
    if not found:
        raise KeyError(f"no training stage {stage!r} in the recipe (one of {', '.join(s.name for s in STAGE_GRAPH)})")
    return found[0]


@dataclass(frozen=True)
class PolicyLoss:
    """GRPO's (and AWSFT's) loss and optimizer, on either backend."""

    eps_clip: float = 0.2  # PPO lower clip: ratio >= 1 - eps_clip
    eps_clip_high: float = 0.28  # upper clip: ratio <= 1 + eps_clip_high (slime's clip-higher)
    kl_loss_type: str = "low_var_kl"
    kl_coef: float = 0.01  # KL to the starting checkpoint (the reference)
    entropy_coef: float = 0.001
    betas: tuple[float, float] = (0.9, 0.98)  # Adam
    weight_decay: float = 0.1
    loss_reduction: str = "sample_mean"  # slime's default; token_mean: --calculate-per-token-loss


@dataclass(frozen=True)
class SlimeGrpo:
    """GRPO at scale (the original cookbook's): 200 rollouts of 16 tasks x 4 samples, one optimizer step each."""

    num_rollout: int = 200
    rollout_batch_size: int = 16
    n_samples: int = 4
    temperature: float = 0.7
    max_response_len: int = 4096  # SGLang max_new_tokens per policy turn
    save_interval: int = 20
    max_staleness: int = 1  # eta of asynchronous GRPO: bench/README.md P12 (as fast as 2 over three runs, nothing wasted)


@dataclass(frozen=True)
class SlimeSft:
    """SFT at scale (the original cookbook's): 2 epochs, cosine lr after 5% warmup."""

    epochs: int = 2
    warmup_fraction: float = 0.05
    weight_decay: float = 0.01
    save_interval: int = 50


POLICY_LOSS = PolicyLoss()
SLIME_GRPO = SlimeGrpo()
SLIME_SFT = SlimeSft()


def spelled(value: float) -> str:
    """A default as the scripts' variables spell it (0.2, 0.001: the flags slime gets)."""
    return f"{value:g}"
