"""Reward shaping and GRPO advantages for tau2 episodes.

tau2's task reward is a product over the task's reward basis, so nearly every episode scores 0 or 1 and many
GRPO groups are all-0: no signal. The partial score credits the parts of tau2's RewardInfo that an episode got
right (gold actions taken, information communicated, environment assertions met) and is added to the task
reward with a small, domain-scaled alpha. Success (for metrics and the curriculum) stays tau2's rule on the
task reward, never the shaped value.

Pure functions, no I/O. `post_process` is the body of slime's `--custom-reward-post-process-path` hook
(the thin wrapper lives in the slime adapter) and of the local trainer's advantage step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

from tau2.data_model.simulation import RewardInfo

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning import awsft
from tau2_rl_pipeline.learning.curriculum import CurriculumTracker
from tau2_rl_pipeline.metrics import is_success

PARTIAL_COMPONENTS = ("action", "communicate", "env_assertion", "db")

# Shaped rewards closer than this count as equal: a group of them carries no GRPO signal.
EQUAL_REWARD_TOL = 1e-6


# ---------------------------------------------------------------------------------------------------
# partial score and shaped reward


def partial_weights(domain: str, cfg: Tau2Config) -> dict[str, float]:
    """The weight of each partial-score component for `domain` (telecom has its own, switchable)."""
    weights = cfg.telecom_partial_weights if domain == "telecom" and cfg.use_telecom_weights \
        else cfg.partial_weights
    return dict(zip(PARTIAL_COMPONENTS, weights))


def partial_score(reward_info: RewardInfo, domain: str, cfg: Tau2Config,
                  judge: float | None = None) -> tuple[float, dict[str, float]]:
    """Weighted mean of the RewardInfo components that are present, and those components.

    Components: action = fraction of `action_checks` matched, communicate = fraction of `communicate_checks`
    met, env_assertion = fraction of `env_assertions` met, db = 1 if `db_check.db_match` else 0. A component
    is present when its checks are a non-empty list (db: when `db_check` is set). `judge` (an LLM judge's
    rubric score in [0, 1], TAU2_USE_JUDGE) is one more component, weighted TAU2_JUDGE_WEIGHT.

        partial = sum_c w_c * x_c / sum_c w_c      over present components c

    0.0 when no present component has a positive weight (a run that ended early has none at all).
    """
    parts: dict[str, float] = {}
    if reward_info.action_checks:
        parts["action"] = _fraction([c.action_match for c in reward_info.action_checks])
    if reward_info.communicate_checks:
        parts["communicate"] = _fraction([c.met for c in reward_info.communicate_checks])
    if reward_info.env_assertions:
        parts["env_assertion"] = _fraction([c.met for c in reward_info.env_assertions])
    if reward_info.db_check is not None:
        parts["db"] = 1.0 if reward_info.db_check.db_match else 0.0
    weights = partial_weights(domain, cfg)
    if judge is not None:
        if not 0.0 <= judge <= 1.0:
            raise ValueError(f"a judge score must be in [0, 1], got {judge}")
        parts["judge"] = judge
        weights["judge"] = cfg.judge_weight
    total = sum(weights[name] for name in parts)
    if total <= 0:
        return 0.0, parts
    return sum(weights[name] * value for name, value in parts.items()) / total, parts


def _fraction(flags: Sequence[bool]) -> float:
    return sum(1 for flag in flags if flag) / len(flags)


def domain_alpha(domain: str, cfg: Tau2Config) -> float:
    """alpha = TAU2_REWARD_ALPHA times the domain's multiplier (1.0 for unlisted domains or when switched off)."""
    if not cfg.use_domain_alpha:
        return cfg.reward_alpha
    multipliers = {"retail": cfg.alpha_mult_retail, "airline": cfg.alpha_mult_airline,
                   "telecom": cfg.alpha_mult_telecom}
    return cfg.reward_alpha * multipliers.get(domain, 1.0)


def format_penalty(format_errors: int, cfg: Tau2Config) -> float:
    """min(TAU2_FORMAT_PENALTY * errors, TAU2_FORMAT_PENALTY_MAX), errors = the episode's unparsable completions
    plus its refused tool calls (unknown tools, bad arguments): bounded, so format never outweighs the task."""
    if format_errors < 0:
        raise ValueError(f"format_errors must be >= 0, got {format_errors}")
    return min(cfg.format_penalty * format_errors, cfg.format_penalty_max)


def shaped_reward(task_reward: float, partial: float, domain: str, cfg: Tau2Config, penalty: float = 0.0) -> float:
    """task reward + alpha(domain) * partial - penalty (the format penalty); no partial term when partial
    credit is off."""
    bonus = domain_alpha(domain, cfg) * partial if cfg.use_partial_credit else 0.0
    return task_reward + bonus - penalty


# ---------------------------------------------------------------------------------------------------
# GRPO group normalization


def group_normalize(rewards: Sequence[float], valid: Sequence[bool], group_size: int, std_normalize: bool,
                    eps: float = 1e-6) -> list[float]:
    """GRPO advantages: per consecutive group of `group_size`, (r - mean) / (std + eps) over valid samples.

    Matches slime's default `_post_process_rewards` (slime/ray/rollout.py, 624b824): group mean subtracted,
    then divided by `torch.std` (unbiased, n - 1 denominator) + 1e-6 when std normalization is on. Unlike
    slime, invalid (removed / aborted) samples get 0 and are left out of their group's mean and std, so a
    dead sample cannot pull its siblings' advantages. A group with one valid sample has std 0 (slime turns
    std normalization off for n = 1 for the same reason). Computed in float64 (slime: float32).
    """
    out: list[float] = []
    for group, ok in _groups(rewards, valid, group_size):
        kept = [r for r, v in zip(group, ok) if v]
        mean = sum(kept) / len(kept) if kept else 0.0
        scale = 1.0
        if std_normalize:
            var = sum((r - mean) ** 2 for r in kept) / (len(kept) - 1) if len(kept) > 1 else 0.0
            scale = math.sqrt(var) + eps
        out.extend((r - mean) / scale if v else 0.0 for r, v in zip(group, ok))
    return out


def filter_equal_reward_groups(rewards: Sequence[float], valid: Sequence[bool],
                               group_size: int) -> tuple[list[bool], int]:
    """Validity flags with every group whose valid rewards are all equal dropped, and how many were dropped.

    Such a group's advantages are all 0 (no GRPO signal); keeping it only dilutes the per-token loss.
    Groups with no valid sample are already dropped and are not counted.
    """
    keep: list[bool] = []
    dropped = 0
    for group, ok in _groups(rewards, valid, group_size):
        kept = [r for r, v in zip(group, ok) if v]
        equal = bool(kept) and max(kept) - min(kept) <= EQUAL_REWARD_TOL
        dropped += equal
        keep.extend([False] * len(ok) if equal else ok)
    return keep, dropped


def _groups(rewards: Sequence[float], valid: Sequence[bool], group_size: int):
    """Consecutive (rewards, valid) groups of `group_size`, as slime lays groups out."""
    if len(valid) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(valid)} validity flags")
    _check_groups(len(rewards), group_size)
    for start in range(0, len(rewards), group_size):
        yield list(rewards[start:start + group_size]), list(valid[start:start + group_size])


def _check_groups(n: int, group_size: int) -> None:
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} samples do not split into groups of n_samples_per_prompt={group_size}")


# ---------------------------------------------------------------------------------------------------
# the reward post-process step


class _Status(Protocol):
    name: str


class SampleLike(Protocol):
    """What `post_process` reads from a sample (slime's `Sample` has all of it)."""

    reward: Any  # float shaped reward; None allowed on aborted / removed samples
    metadata: dict  # "raw_reward" (tau2 task reward), "domain", "task_id"
    status: _Status  # Enum member named COMPLETED / TRUNCATED / ABORTED / FAILED / PENDING
    remove_sample: bool


def task_key(metadata: dict) -> str:
    """Curriculum key of a sample: task ids repeat across domains ("0" is in airline and retail)."""
    return f"{metadata['domain']}/{metadata['task_id']}"


def post_process(samples: Sequence[SampleLike], group_size: int, cfg: Tau2Config,
                 tracker: CurriculumTracker, algorithm: str = "grpo") -> tuple[list[float], list[float]]:
    """(raw task rewards, advantages) for a flat batch of groups of `group_size` samples, in order; with
    algorithm="awsft" the second list holds each sample's AWSFT weight instead (learning/awsft.py: the binary task
    reward, or the shaped one under TAU2_AWSFT_REWARD=shaped, over the reference's pass rate
    metadata["reference_pass_rate"], normalised over the whole batch, the curriculum weight composed so it never
    raises a failure's weight).

    Aborted and removed samples get advantage (and weight) 0 and stay out of group (and batch) statistics. Every
    non-aborted sample (it must carry metadata["raw_reward"]) is recorded in the tracker by tau2's success rule; the
    whole batch is recorded before weights are read, so all samples of a task get the same weight. With
    TAU2_FILTER_ZERO_STD, samples of all-equal groups are marked `remove_sample` (slime then zeroes their loss mask);
    the tracker counts such groups either way.
    """
    _check_groups(len(samples), group_size)
    aborted = [s.status.name == "ABORTED" for s in samples]
    valid = [not a and not s.remove_sample for s, a in zip(samples, aborted)]
    for sample, is_aborted in zip(samples, aborted):  # check all before the tracker changes
        if not is_aborted and "raw_reward" not in sample.metadata:
            raise ValueError(f"sample of task {sample.metadata.get('task_id')!r} ({sample.status.name}) has no "
                             "metadata['raw_reward'] (the tau2 task reward)")
    raw_rewards = [0.0 if a else float(s.metadata["raw_reward"]) for s, a in zip(samples, aborted)]
    for sample, is_aborted, raw in zip(samples, aborted, raw_rewards):
        if not is_aborted:
            tracker.record(task_key(sample.metadata), is_success(raw))

    rewards = [float(s.reward) if ok else 0.0 for s, ok in zip(samples, valid)]
    keep, zero_signal = filter_equal_reward_groups(rewards, valid, group_size)
    tracker.count_groups(len(samples) // group_size, zero_signal)
    if cfg.filter_zero_std:
        for sample, ok, kept in zip(samples, valid, keep):
            if ok and not kept:
                sample.remove_sample = True
        valid = keep

    curriculum = [tracker.weight(task_key(s.metadata)) if ok and cfg.apply_curriculum_weights else 1.0
                  for s, ok in zip(samples, valid)]
    if algorithm == "awsft":
        baselines = [reference_pass_rate(s.metadata) for s in samples]
        successes = [is_success(raw) for raw in raw_rewards]
        scored = rewards if cfg.awsft_reward == "shaped" else [float(ok) for ok in successes]
        return raw_rewards, awsft.batch_weights(scored, baselines, valid, curriculum, successes)
    if algorithm != "grpo":
        raise ValueError(f"algorithm must be grpo or awsft, got {algorithm!r}")
    advantages = group_normalize(rewards, valid, group_size, cfg.grpo_std_normalization)
    return raw_rewards, [a * c if ok else 0.0 for a, c, ok in zip(advantages, curriculum, valid)]


def reference_pass_rate(metadata: dict) -> float | None:
    """V* of a sample's task as the difficulty stage recorded it (None: not measured); a bad value is an error."""
    value = metadata.get(awsft.BASELINE_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"task {metadata.get('task_id')!r}: metadata[{awsft.BASELINE_KEY!r}]={value!r} must be a "
                         "pass rate in [0, 1] (written by python -m tau2_rl_pipeline.selection.difficulty)")
    return float(value)
