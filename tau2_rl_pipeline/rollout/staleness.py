"""Bounded staleness for asynchronous GRPO: how far a trained token's weights may lag.

Bounded staleness for asynchronous GRPO (GRPO_MAX_STALENESS = eta): how many weight versions a trained token lags
the weights being trained, which turns fall past eta, and whether the rollout may start another group. Pure
bookkeeping over weight versions and rollout ids; slime_plugins/staleness.py applies it inside slime.

Versions are slime's: its weight updaters count from 0 in each training process and push version 1 before the first
rollout (`update_weights()` in train.py and train_async.py), then one more after every `--update-weights-interval`
training steps. The weights that train rollout r of a process whose first rollout was s therefore went out as
version 1 + r // k - s // k (k the interval), in train.py and in train_async.py alike; a token's staleness is that
minus the version SGLang reported for the request that sampled it (meta_info.weight_version). A version that is not
a number (SGLang's "default" before the first update) counts as 0: older than any pushed one.

Admission follows AReaL's rule (max_head_offpolicyness): group g (0-based, in the order they start) is trained by
rollout s + g // B at the earliest (B groups a rollout, taken in the order they finish), so while rollout r is the
newest requested, groups start only while g < (r - s + 1 + eta - lag) * B; lag is 1 where the rollout for r runs
while step r - 1 still trains and before its update (train_async.py, after its first rollout: there eta = 0 could
never start rollout s + 1's groups), else 0. A group that finishes later than its turn and any turn an update
overtook are what the mask catches (`bound_staleness`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

UNBOUNDED = -1  # GRPO_MAX_STALENESS / TAU2_MAX_STALENESS for no bound


def trained_version(rollout_id: int, first_rollout_id: int, interval: int = 1) -> int:
    """The weight version that trains rollout `rollout_id` (module docstring)."""
    if interval < 1 or rollout_id < first_rollout_id:
        raise ValueError(f"rollout {rollout_id} before the first {first_rollout_id}, or interval {interval} < 1")
    return 1 + rollout_id // interval - first_rollout_id // interval


def version_number(version: str | None) -> int:
    """slime's version as a number: its trailing digits ("3", "v3"), else 0 (SGLang's "default", None)."""
    match = re.search(r"(\d+)$", str(version or ""))
    return int(match.group(1)) if match else 0


def admits(started_groups: int, rollout_id: int, first_rollout_id: int, batch_groups: int, max_staleness: int,
           lag: int) -> bool:
    """Whether another group may start while `rollout_id` is the newest rollout requested (module docstring)."""
    if max_staleness == UNBOUNDED:
        return True
    behind = lag if rollout_id > first_rollout_id else 0
    return started_groups < (rollout_id - first_rollout_id + 1 + max_staleness - behind) * batch_groups


def bound_staleness(loss_mask: Sequence[int], spans: Sequence[Sequence[int]], versions: Sequence[str | None],
                    trained: int, max_staleness: int) -> tuple[list[int], int, Counter]:
    """(the mask with every request more than `max_staleness` versions behind `trained` set to 0, the mask-1 tokens
    that took out, a Counter staleness -> mask-1 tokens left). Tokens outside every request's span (none in a
    tau2 response: observations are mask 0) count as staleness 0."""
    if len(spans) != len(versions):
        raise ValueError(f"{len(spans)} request spans but {len(versions)} weight versions")
    mask = list(loss_mask)
    masked, trained_tokens = 0, Counter()
    for (start, end), version in zip(spans, versions):
        lag = trained - version_number(version)
        kept = sum(mask[start:end])
        if max_staleness != UNBOUNDED and lag > max_staleness:
            masked += kept
            mask[start:end] = [0] * (end - start)
        elif kept:
            trained_tokens[lag] += kept
    covered = sum(trained_tokens.values())
    if sum(mask) > covered:
        trained_tokens[0] += sum(mask) - covered
    return mask, masked, trained_tokens
