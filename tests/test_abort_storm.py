"""The abort-storm guard: windows of one rollout's worth of episodes (what its message counts), a streak of mostly-aborted windows, the first error."""

import pytest

from tau2_rl_pipeline.rollout.abort_storm import AbortStorm, AbortStormGuard


def feed(guard, outcomes):
    return [guard.record(aborted, error) for aborted, error in outcomes]


def test_stops_after_more_than_patience_storm_windows_naming_the_first_error():
    guard = AbortStormGuard(window=2, fraction=0.5, patience=1)
    first = feed(guard, [(True, "HTTP 500 at http://h:1/generate"), (True, "later error")])
    assert first == [None, None] and guard.tripped is None  # one storm rollout is tolerated
    *_, stop = feed(guard, [(True, "x"), (True, "y")])
    assert isinstance(stop, AbortStorm) and guard.tripped is stop
    assert str(stop).startswith("stopping: 2 windows in a row of 2 finished episodes (one rollout's worth each) had "
                                "more than 50% of their episodes aborted (2/2 in the last); first error: HTTP 500 at "
                                "http://h:1/generate")
    assert guard.record(False) is stop  # stays stopped


def test_a_healthy_window_resets_the_streak_and_the_first_error():
    guard = AbortStormGuard(window=2, fraction=0.5, patience=1)
    feed(guard, [(True, "old"), (True, "old")])
    feed(guard, [(False, None), (True, "half is not most")])  # 1/2 is not more than half: healthy
    assert feed(guard, [(True, "new"), (True, "new")])[-1] is None
    stop = feed(guard, [(True, "z"), (True, "z")])[-1]
    assert "first error: new" in str(stop)


def test_multi_line_errors_become_one_line_and_bad_settings_are_refused():
    guard = AbortStormGuard(window=1, fraction=0.0, patience=0)
    stop = guard.record(True, "line one\n  line two")
    assert "\n" not in str(stop) and "line one line two" in str(stop)
    with pytest.raises(ValueError):
        AbortStormGuard(window=0, fraction=0.5, patience=1)
