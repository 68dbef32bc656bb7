"""Advantage-weighted SFT's per-episode weights, as the recipe defines them (pure, no torch).

Advantage-weighted SFT's per-episode weights, as the recipe defines them (pure, no torch: the reward
post-process step computes them on both paths, and the loss only multiplies them in, learning/losses.awsft_loss).

    A      = r - V*(prompt)                r: the episode's binary task reward; V*: the reference model's pass rate
    A_norm = (A - mean(A)) / (std(A) + eps)     over the whole batch (every valid sample of the rollout)
    w      = clamp(clamp(A_norm, -3, 3) + 1, 0.1, 5)

V* is measured before the policy stage: the RFT stage samples every train task N times with the starting
(reference) policy, and the difficulty stage (selection/difficulty.py) writes each task's pass rate into its task
index row as metadata["reference_pass_rate"], which slime copies onto every sample of the task (the local
pipeline puts it there itself). A task without one (not sampled by the RFT stage, or a task index written without
the difficulty stage) gets the mean V* of the batch's measured samples; with none measured every baseline is the
same constant, which the batch normalisation removes (A_norm is then the batch z-score of the rewards).

r is tau2's task reward as the recipe (seed 002) has it, 1 on success and 0 otherwise, on the scale of V*, which is
the same success rule over the reference's samples; TAU2_AWSFT_REWARD=shaped reads the shaped reward instead
(partial credit, format penalty: learning/reward.py) against the same V*. The caller picks (reward.post_process).

Unlike GRPO's per-group z-score, a group whose episodes all failed is not centred to weight 1 by its own mean: it
is compared with the reference's pass rate and the rest of the batch, so it is imitated less than a success.

The curriculum weight c of the task (learning/curriculum.py) scales what is learnt from it without ever raising
the weight of a failure, nor of any episode at or below the batch's level: w * c for a success with w > 1 (capped
at 5), w * min(c, 1) otherwise. A failure can weigh more than 1 (a task whose reference never solves it, beside
tasks whose failures fall further below their V*), and a hard task's c > 1 must not make it imitated more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tau2_rl_pipeline.config import CURRICULUM_MAX_WEIGHT

BASELINE_KEY = "reference_pass_rate"  # sample.metadata / task-index row metadata: V* of the task
ADVANTAGE_CLIP = 3.0  # |A_norm| beyond 3 batch standard deviations says nothing more
MIN_WEIGHT = 0.1  # a bad episode is still imitated a little (its format, its tool use), never unlearned
MAX_WEIGHT = CURRICULUM_MAX_WEIGHT  # the config refuses a curriculum weight above it (it would only saturate)
EPS = 1e-6


def weight(a_norm: float) -> float:
    """w = clamp(clamp(A_norm, -3, 3) + 1, 0.1, 5): positive, 1 at A_norm = 0, linear in between."""
    return min(max(min(max(a_norm, -ADVANTAGE_CLIP), ADVANTAGE_CLIP) + 1.0, MIN_WEIGHT), MAX_WEIGHT)


def with_curriculum(w: float, c: float, success: bool) -> float:
    """The curriculum weight c composed with w: it scales a success's w above 1 (capped at 5) and only ever lowers
    any other weight (a failure's whatever its w, a success's at or below 1)."""
    return min(w * c, MAX_WEIGHT) if success and w > 1.0 else w * min(c, 1.0)


def baselines(measured: Sequence[float | None], valid: Sequence[bool]) -> list[float]:
    """V* per sample: the measured pass rate, else the mean of the valid samples' measured ones (0.0 when none)."""
    known = [v for v, ok in zip(measured, valid) if ok and v is not None]
    fallback = sum(known) / len(known) if known else 0.0
    return [fallback if v is None else float(v) for v in measured]


def batch_weights(rewards: Sequence[float], measured: Sequence[float | None], valid: Sequence[bool],
                  curriculum: Sequence[float] | None = None,
                  successes: Sequence[bool] | None = None) -> list[float]:
    """The AWSFT weight of each sample of a batch (0.0 for invalid ones: aborted or removed, never trained);
    `successes` (tau2's rule on each task reward) says which curriculum weights may raise (with_curriculum)."""
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
        if ok and curriculum is not None:
            w = with_curriculum(w, curriculum[i], bool(successes[i]) if successes is not None else False)
        out.append(w)
    return out
