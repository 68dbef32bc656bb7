"""Every rollout's behaviour monitors, logged in the same row as slime's own rollout metrics.

slime's --custom-rollout-log-function-path: every rollout's behaviour monitors (benchmark/monitors.py), logged in
the same row as slime's own rollout metrics.

    --custom-rollout-log-function-path   tau2_rl_pipeline.slime_plugins.rollout_log.log_rollout_data

slime 624b824's RolloutManager.generate calls its log_rollout_data(rollout_id, args, samples, metrics, time)
(slime/observability/rollout_metrics.py), which calls this function first and, as it returns False, goes on with
its default logging: one dict of the rollout function's extra metrics plus compute_metrics_from_samples' rollout/*
keys, logged to wandb / tensorboard at rollout/step. The monitors go into that extra-metrics dict, so they land
in that same row as rollout/monitor/*. A rollout function that returns a bare list (slime's fully asynchronous
rollout) leaves slime no such dict: then they are logged with slime's own logging_utils.log at the same
rollout/step. Each sample's monitors come from our generate (adapter.py, sample.metadata["monitors"], and the user
simulator's side as rollout/user_monitor/*, from sample.metadata["user_monitors"]); beside
them, the rollout's aborted samples, counted apart (batch.py: rollout/aborted_samples, rollout/aborted_fraction).
"""

from __future__ import annotations

from typing import Any

from tau2_rl_pipeline.benchmark.monitors import batch_monitors
from tau2_rl_pipeline.benchmark.user_monitors import batch_user_monitors
from tau2_rl_pipeline.metrics import is_success
from tau2_rl_pipeline.slime_plugins.batch import aborted_metrics

PREFIX = "rollout/monitor/"
USER_PREFIX = "rollout/user_monitor/"  # the user simulator's side (benchmark/user_monitors.py)


def rollout_metrics(samples: list) -> dict[str, float]:
    """rollout/monitor/<rate> over the rollout's scored samples (aborted ones are infrastructure, as everywhere);
    a rate with nothing to take a share of (no success yet) is left out rather than logged as 0."""
    scored = [s for s in samples if s.status.name != "ABORTED" and not s.remove_sample
              and (s.metadata or {}).get("monitors")]
    rates = batch_monitors([s.metadata["monitors"] for s in scored],
                           [is_success(s.metadata["raw_reward"]) for s in scored])
    users = batch_user_monitors([s.metadata["user_monitors"] for s in scored if s.metadata.get("user_monitors")])
    return {**{PREFIX + name: float(value) for name, value in rates.items() if value is not None},
            **{USER_PREFIX + name: float(value) for name, value in users.items()}}


def log_rollout_data(rollout_id: int, args: Any, samples: list, rollout_extra_metrics: dict | None,
                     rollout_time: float) -> bool:
    """slime's custom rollout log function: add the monitors to slime's own log row; False = slime logs on."""
    metrics = {**rollout_metrics(samples), **aborted_metrics(samples)}
    if rollout_extra_metrics is not None:
        rollout_extra_metrics.update(metrics)
    elif metrics:
        from slime.observability import logging_utils
        from slime.observability.metric_utils import compute_rollout_step

        step = compute_rollout_step(args, rollout_id)
        logging_utils.log(args, {**metrics, "rollout/step": step}, step_key="rollout/step")
    return False
