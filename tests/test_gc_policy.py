"""The rollout processes' GC policy (tau2_rl_pipeline/rollout/gc_policy.py): rarer full passes, and cyclic garbage still
collected, young and old, without anyone calling gc.collect()."""

import gc
import weakref

import pytest

from tau2_rl_pipeline.rollout import gc_policy


class Node:
    """A cycle's member: only the cyclic GC can free it."""

    def __init__(self):
        self.me = self


@pytest.fixture
def restored_gc():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()  # the test's settle() froze this process's heap


def _cycles_until(condition, limit: int) -> int:
    """Make cyclic garbage (one Node at a time, dropped at once) until `condition()`; how many it took."""
    for made in range(1, limit + 1):
        Node()
        if condition():
            return made
    raise AssertionError(f"not after {limit} cycles")


def test_settle_freezes_and_makes_full_passes_rarer_keeping_young_thresholds(restored_gc):
    young, middle, _ = gc.get_threshold()
    kept = object.__new__(Node)  # alive across settle(): frozen
    gc_policy.settle()
    assert gc.get_threshold() == (young, middle, gc_policy.FULL_PASS_EVERY)
    assert gc_policy.FULL_PASS_EVERY > 10  # CPython's default: the policy must change it
    assert gc.get_freeze_count() > 0 and not any(o is kept for o in gc.get_objects())


def test_settled_puts_the_thresholds_back_even_on_error(restored_gc):
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), gc_policy.settled():
        assert gc.get_threshold()[2] == gc_policy.FULL_PASS_EVERY
        raise RuntimeError("the rollout failed")
    assert gc.get_threshold() == before


def test_leaving_settled_undoes_the_freeze_so_a_cycle_dropped_after_it_is_collected(restored_gc):
    gc.unfreeze()  # nothing frozen before the block, as in a fresh process (an earlier test may have frozen)
    before = gc.get_threshold()
    held = Node()  # a cycle alive when the block starts: frozen inside it
    dead = weakref.ref(held)
    with gc_policy.settled():
        assert gc.get_freeze_count() > 0 and not any(o is held for o in gc.get_objects())
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    del held  # dropped after the block: the caller's collector frees it as if the block never ran
    gc.collect()
    assert dead() is None


def test_settled_leaves_a_callers_own_freeze_as_it_was(restored_gc):
    gc.freeze()
    frozen = gc.get_freeze_count()
    with gc_policy.settled():
        assert gc.get_threshold()[2] == gc_policy.FULL_PASS_EVERY
    assert gc.get_freeze_count() == frozen  # gc.unfreeze() cannot tell whose freeze it undoes: none is undone


def test_young_cyclic_garbage_is_collected_under_the_policy(restored_gc):
    gc_policy.settle()
    first = Node()
    dead = weakref.ref(first)
    del first
    # CPython's own young passes, at the thresholds the policy keeps: no gc.collect() anywhere
    made = _cycles_until(lambda: dead() is None, 10 * gc.get_threshold()[0])
    assert made <= 2 * gc.get_threshold()[0]


def test_old_cyclic_garbage_is_still_collected_by_a_full_pass(restored_gc):
    """A cycle that lived long enough to reach the old generation, then died, is freed by the next automatic full
    pass: they come FULL_PASS_EVERY generation-1 passes apart. The young threshold is lowered so that many passes
    come quickly (the rule for the full pass is the policy's own)."""
    gc_policy.settle()
    gc.collect()  # CPython sizes the old generation at the last full pass: size it as settled (all frozen)
    old = Node()
    dead = weakref.ref(old)
    gc.collect(1)  # survives two young passes: now in the oldest generation, as an episode's long-lived state
    assert any(o is old for o in gc.get_objects(generation=2))
    del old
    full_passes = []

    def count(phase, info):
        if phase == "stop" and info["generation"] == 2:
            full_passes.append(info["collected"])

    gc.set_threshold(10, gc.get_threshold()[1], gc_policy.FULL_PASS_EVERY)
    gc.callbacks.append(count)
    try:
        made = _cycles_until(lambda: dead() is None, 40 * 10 * 10 * gc_policy.FULL_PASS_EVERY)
    finally:
        gc.callbacks.remove(count)
    assert len(full_passes) == 1 and full_passes[0] >= 1  # freed by the one full pass, not before it
    # not before FULL_PASS_EVERY generation-1 passes (each after 10 young ones of 10 net allocations)
    assert made >= 10 * 10 * gc_policy.FULL_PASS_EVERY // 2
