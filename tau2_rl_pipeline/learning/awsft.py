"""Advantage-weighted SFT's per-episode weights, as the recipe defines them (pure, no torch: the reward
post-process step computes them on both paths, and the loss only multiplies them in, learning/losses.awsft_loss).

    A      = r - V*(prompt)                r: the episode's shaped reward; V*: the reference model's pass rate
    A_norm = (A - mean(A)) / (std(A) + eps)     over the whole batch (every valid sample of the rollout)
    w      = clamp(clamp(A_norm, -3, 3) + 1, 0.1, 5)

V* is measured before the policy stage: the RFT stage samples every train task N times with the starting
(reference) policy, and the difficulty stage (selection/difficulty.py) writes each task's pass rate into its task
index row as metadata["reference_pass_rate"], which slime copies onto every sample of the task (the local
pipeline puts it there itself). A task without one (not sampled by the RFT stage, or a task index written without
the difficulty stage) gets the mean V* of the batch's measured samples; with none measured every baseline is the
same constant, which the batch normalisation removes (A_norm is then the batch z-score of the rewards).

Unlike GRPO's per-group z-score, a group whose episodes all failed is not centred to weight 1 by its own mean: it
is compared with the reference's pass rate and the rest of the batch, so it is imitated less than a success.

The curriculum weight c of the task (learning/curriculum.py) scales what is learnt from it without ever raising
the weight of an episode at or below the baseline: w * c when w > 1, w * min(c, 1) otherwise, capped at 5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BASELINE_KEY = "reference_pass_rate"  # sample.metadata / task-index row metadata: V* of the task
ADVANTAGE_CLIP = 3.0  # |A_norm| beyond 3 batch standard deviations says nothing more
MIN_WEIGHT = 0.1  # a bad episode is still imitated a little (its format, its tool use), never unlearned
MAX_WEIGHT = 5.0
EPS = 1e-6


def weight(a_norm: float) -> float:
    """w = clamp(clamp(A_norm, -3, 3) + 1, 0.1, 5): positive, 1 at A_norm = 0, linear in between."""
    return min(max(min(max(a_norm, -ADVANTAGE_CLIP), ADVANTAGE_CLIP) + 1.0, MIN_WEIGHT), MAX_WEIGHT)


def with_curriculum(w: float, c: float) -> float:
    """The curriculum weight c composed with w: it scales w above 1 (capped at 5) and only ever lowers w <= 1."""
    return min(w * c, MAX_WEIGHT) if w > 1.0 else w * min(c, 1.0)


def baselines(measured: Sequence[float | None], valid: Sequence[bool]) -> list[float]:
    """V* per sample: the measured pass rate, else the mean of the valid samples' measured ones (0.0 when none)."""
    known = [v for v, ok in zip(measured, valid) if ok and v is not None]
    fallback = sum(known) / len(known) if known else 0.0
    return [fallback if v is None else float(v) for v in measured]


def batch_weights(rewards: Sequence[float], measured: Sequence[float | None], valid: Sequence[bool],
                  curriculum: Sequence[float] | None = None) -> list[float]:
    """The AWSFT weight of each sample of a batch (0.0 for invalid ones: aborted or removed, never trained)."""
    if not len(rewards) == len(measured) == len(valid):
        raise ValueError(f"{len(rewards)} rewards, {len(measured)} baselines and {len(valid)} validity flags")
    v_star = baselines(measured, valid)
    advantages = [r - b for r, b in zip(rewards, v_star)]
    kept = [a for a, ok in zip(advantages, valid) if ok]
    mean = sum(kept) / len(kept) if kept else 0.0
    var = sum((a - mean) ** 2 for a in kept) / (len(kept) - 1) if len(kept) > 1 else 0.0
    scale = math.sqrt(var) + EPS
    out = []
    for i, (a, ok) in enumerate(zip(advantages, valid)):
        w = weight((a - mean) / scale) if ok else 0.0
        out.append(with_curriculum(w, curriculum[i]) if ok and curriculum is not None else w)
    return out
