"""Bounded staleness's bookkeeping (rollout/staleness.py): slime's version numbering, AReaL's admission rule with
train_async.py's one-version lag, and the mask over requests that lag past the bound, with every token counted. The
same through slime's real fully async worker is tests/contract/test_slime_staleness.py."""

from __future__ import annotations

from collections import Counter

import pytest

from tau2_rl_pipeline.rollout.staleness import UNBOUNDED, admits, bound_staleness, trained_version, version_number


def test_the_version_training_a_rollout_follows_slimes_updates():
    assert [trained_version(r, 0) for r in range(4)] == [1, 2, 3, 4]  # version 1 before rollout 0, +1 a step
    assert [trained_version(r, 7) for r in (7, 8)] == [1, 2]  # a resumed process counts from 1 again
    assert [trained_version(r, 0, interval=2) for r in range(5)] == [1, 1, 2, 2, 3]  # --update-weights-interval 2
    assert [version_number(v) for v in ("3", "v12", "default", None)] == [3, 12, 0, 0]
    with pytest.raises(ValueError):
        trained_version(2, 3)


def test_admission_is_areals_rule_shifted_by_the_schedules_lag():
    # train.py schedule (lag 0), 2 groups a rollout, eta 1: rollout 0 may start 4 groups, rollout 1 six
    assert [admits(g, 0, 0, 2, 1, 0) for g in range(5)] == [True] * 4 + [False]
    assert admits(5, 1, 0, 2, 1, 0) and not admits(6, 1, 0, 2, 1, 0)
    # train_async.py (lag 1 after its first rollout): one rollout fewer ahead; eta 0 could never start rollout 1's
    assert admits(3, 0, 0, 2, 1, 1) and not admits(4, 1, 0, 2, 1, 1)
    assert not admits(2, 1, 0, 2, 0, 1)
    assert admits(10 ** 6, 0, 0, 2, UNBOUNDED, 1)


def test_requests_past_the_bound_are_masked_and_counted():
    mask = [1, 1, 0, 1, 1, 1, 0, 1]
    spans = [(0, 2), (3, 6), (7, 8)]
    versions = ["1", "2", "3"]
    got, masked, tokens = bound_staleness(mask, spans, versions, trained=3, max_staleness=1)
    assert got == [0, 0, 0, 1, 1, 1, 0, 1] and masked == 2 and tokens == Counter({1: 3, 0: 1})
    same, none, all_tokens = bound_staleness(mask, spans, versions, trained=3, max_staleness=UNBOUNDED)
    assert same == mask and none == 0 and all_tokens == Counter({2: 2, 1: 3, 0: 1})
    assert bound_staleness(mask, spans, versions, trained=3, max_staleness=0)[1] == 5
    with pytest.raises(ValueError):
        bound_staleness(mask, spans, versions[:2], trained=3, max_staleness=1)
