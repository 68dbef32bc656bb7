"""What of a rollout reaches slime's batch and its logs: aborted episodes take no slot and pull no reward down.

    --dynamic-sampling-filter-path      tau2_rl_pipeline.slime_plugins.batch.filter_groups     (always, synchronous GRPO)

An episode aborts for reasons that are not the model's (a server failing after its retries). slime 624b824 would
still fill a batch slot with a group whose samples all aborted (it finishes fast: with over-sampling and no filter it
wins the race against a healthy group, which slime then drops) and would log its samples' raw reward 0.0 in
`rollout/raw_reward`, as if the model had failed. Here:

- `filter_groups` drops a group with no scored sample, whatever the filter settings, with the reason
  `all_aborted` (never kept by keep_when_insufficient): slime counts it (rollout/dynamic_filter/drop_all_aborted)
  and samples another prompt in its place. With TAU2_FILTER_ZERO_STD=1 it also drops groups whose scored rewards
  are all equal (`zero_std`). slime's fully asynchronous rollout has no filter: it sends every group holding an
  aborted sample back to its buffer instead of training it.
- `scored_raw_rewards` gives an aborted sample the mean raw reward of the batch's scored samples as the value slime
  logs: slime averages `metadata["raw_reward"]` over every sample of the batch
  (RolloutManager._convert_samples_to_train_data, then train_metric_utils.log_rollout_data: rollout/raw_reward),
  and a value equal to the others' mean leaves their mean as it is, i.e. the logged mean is over scored episodes
  only. The sample's own books still say aborted (status, `episode_status`, an all-0 mask, reward 0.0, advantage 0).
- `aborted_metrics` counts the aborted apart: rollout/aborted_samples and rollout/aborted_fraction, which the
  project's rollout log function (rollout_log.py) adds to slime's own rollout log row.
"""

from __future__ import annotations

from statistics import fmean

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.reward import filter_equal_reward_groups


def _scored(sample) -> bool:
    return sample.status.name != "ABORTED"


def filter_groups(args, samples, **kwargs):
    """slime's dynamic-sampling filter: drop a group with no scored sample (`all_aborted`), and with
    TAU2_FILTER_ZERO_STD=1 one whose scored rewards are all equal (`zero_std`: no GRPO signal;
    TAU2_FILTER_KEEP_WHEN_INSUFFICIENT may keep it when slime would otherwise run short)."""
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput

    cfg = Tau2Config.from_env()
    valid = [_scored(s) and not s.remove_sample for s in samples]
    if not any(valid):
        return DynamicFilterOutput(keep=False, reason="all_aborted")
    if not cfg.filter_zero_std:
        return DynamicFilterOutput(keep=True)
    rewards = [float(s.reward or 0.0) for s in samples]
    if any(filter_equal_reward_groups(rewards, valid, len(samples))[0]):
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason="zero_std", keep_when_insufficient=cfg.filter_keep_when_insufficient)


def scored_raw_rewards(samples) -> None:
    """Set each aborted sample's logged raw reward (metadata["raw_reward"], which slime logs) to the mean of the
    scored samples' task rewards, so that slime's batch mean is theirs alone; 0.0 where nothing was scored."""
    scored = [float(s.metadata["raw_reward"]) for s in samples if _scored(s)]
    stand_in = fmean(scored) if scored else 0.0
    for sample in samples:
        if not _scored(sample):
            sample.metadata["raw_reward"] = stand_in


def aborted_metrics(samples) -> dict[str, float]:
    """How many of a rollout's samples aborted, apart from the scored ones."""
    aborted = sum(not _scored(s) for s in samples)
    return {"rollout/aborted_samples": aborted, "rollout/aborted_fraction": aborted / len(samples) if samples else 0.0}
