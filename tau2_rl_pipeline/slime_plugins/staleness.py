"""Bounded staleness inside slime's fully asynchronous rollout.

Bounded staleness inside slime's fully asynchronous rollout (TAU2_MAX_STALENESS = eta, which scripts/train_grpo.sh
sets from GRPO_MAX_STALENESS): no trained token comes from weights more than eta versions behind the weights that
train it (rollout/staleness.py: the versions, the admission rule, the mask).

- Admission: slime 624b824's AsyncRolloutWorker takes a group from its data source whenever it has room
  (slime/rollout/fully_async_rollout.py, `data_buffer.get_samples(1)` each wake-up). The adapter hands it an
  `AdmissionGate` over slime's data source instead: a group slime handed back (cut by an update, under
  --partial-rollout) is always given out again, a new one only while the admission rule holds; otherwise the worker
  finds nothing and looks again at its next wake-up.
- At train time: when a rollout's groups are collected, every request more than eta versions behind the weights that
  train the rollout is masked (`bound_rollout`), counted, and the staleness of the tokens left to train goes into
  slime's rollout log as rollout/staleness/* (the rollout function's metrics, which slime's log_rollout_data logs in
  its row).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from tau2_rl_pipeline.rollout.staleness import admits, bound_staleness, trained_version

PREFIX = "rollout/staleness/"


class StalenessRefused(ValueError):
    """A staleness bound the run's schedule cannot meet."""


# The fully async rollout runs under train_async.py (in train.py slime offloads the engines while a step trains,
# with --colocate): after its first rollout, each rollout is collected while the previous step trains and before
# that step's weight update, one version behind the weights that will train it.
SCHEDULE_LAG = 1


def refusal(max_staleness: int) -> str | None:
    if max_staleness == 0:
        return ("TAU2_MAX_STALENESS=0 (GRPO_MAX_STALENESS) cannot hold in the fully async rollout: train_async.py "
                "collects each rollout while the previous step trains, before its weight update, so every token is "
                "at least 1 version behind; eta = 0 is the synchronous path's guarantee (GRPO_ASYNC=0), or set 1 "
                "or more")
    return None


class AdmissionGate:
    """slime's data source as slime's fully async worker sees it (module docstring); anything else is the source's."""

    def __init__(self, source: Any, batch_groups: int, max_staleness: int, lag: int, interval: int = 1):
        self.source, self.batch_groups, self.max_staleness, self.lag = source, batch_groups, max_staleness, lag
        self.interval = interval
        self.first: int | None = None
        self.newest: int | None = None
        self.started = 0  # new groups given out
        self.refused = 0  # wake-ups that found the bound reached
        self._lock = threading.Lock()

    def start_rollout(self, rollout_id: int) -> int:
        """Rollout `rollout_id` is requested; returns the weight version that will train it."""
        with self._lock:
            if self.first is None:
                self.first = rollout_id
            self.newest = rollout_id
            return trained_version(rollout_id, self.first, self.interval)

    def get_samples(self, num_samples: int) -> list:
        with self._lock:
            if getattr(self.source, "buffer", None):  # handed back: its episodes go on, whatever the bound
                return self.source.get_samples(num_samples)
            if self.newest is None or not admits(self.started, self.newest, self.first, self.batch_groups,
                                                 self.max_staleness, self.lag):
                self.refused += 1
                return []
            groups = self.source.get_samples(num_samples)
            self.started += len(groups)
            return groups

    def add_samples(self, samples: list) -> None:
        self.source.add_samples(samples)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


def bound_rollout(groups: list, trained: int, max_staleness: int) -> dict[str, float]:
    """Mask every request of the collected samples more than `max_staleness` versions behind `trained` (the
    turn spans and versions our generate keeps in the metadata), and the rollout/staleness/* metrics: the max and
    histogram of the staleness of the tokens left to train, and the tokens masked for lagging past the bound."""
    histogram: Counter = Counter()
    masked = 0
    for sample in (s for group in groups for s in (group if isinstance(group, list) else [group])):
        meta = sample.metadata or {}
        if meta.get("turn_spans") is None:
            continue
        mask, lost, tokens = bound_staleness(sample.loss_mask, meta["turn_spans"], meta["turn_versions"], trained,
                                             max_staleness)
        sample.loss_mask = mask
        meta["staleness"] = {"trained_version": trained, "masked_tokens": lost,
                             "tokens": {str(k): v for k, v in sorted(tokens.items())}}
        masked += lost
        histogram += tokens
    kept = sum(histogram.values())
    metrics = {PREFIX + "max": float(max(histogram, default=0)), PREFIX + "trained_tokens": float(kept),
               PREFIX + "masked_tokens": float(masked),
               PREFIX + "masked_share": masked / (kept + masked) if kept + masked else 0.0,
               PREFIX + "bound": float(max_staleness), PREFIX + "trained_version": float(trained)}
    metrics.update({f"{PREFIX}tokens_at_{k}": float(v) for k, v in sorted(histogram.items())})
    return metrics

