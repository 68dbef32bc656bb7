"""The cyclic garbage collector's policy in a rollout process the project owns.

It holds in its own CLIs (eval_passk's `main` runs its rollout inside `settled()`, undone on leaving) and each of
eval_passk's `--procs` shards (`settle()`, a process of its own). Inside slime's rollout actor, a process slime
owns, it is opt-in (TAU2_SLIME_GC_POLICY, off by default: the slime adapter then leaves slime's collector as it is).

A full (generation-2) GC pass holds the GIL and walks every tracked object not frozen, so it stalls the event
loop for as long as it takes. Measured (bench/README.md, P2 and P5; 1024 mock episodes, 256 in flight, 1 s per
model call, one process):

- The imports (torch, transformers, tau2, aiohttp; ~530k objects) live as long as the process and cost a full
  pass 0.3-0.45 s: `gc.freeze()` takes them out of every pass.
- What is left is the heap of the episodes in flight: ~200 tracked objects per episode (asyncio tasks and
  coroutines, aiohttp's request objects, tau2's messages and tool schemas, the environment), 60-80k objects at
  256 in flight, 34-77 ms per pass: the event loop's longest stalls. CPython's default (threshold 10) ran 2-3
  such passes per 1024 episodes, and they found 0-148 objects of garbage: an episode's cyclic garbage dies young
  (12.7k objects collected by the young passes of the same run, 387 of generation 0 and 35 of generation 1).

So full passes are made rarer, not skipped: `FULL_PASS_EVERY` generation-1 passes between two of them instead of
10 (CPython then also waits until a quarter of the old generation is new, as always). Young passes, which collect
nearly all of the garbage, keep CPython's thresholds; what cyclic garbage reaches the old generation waits for the
next full pass (at this rate about one per 29k mock episodes), so memory stays bounded: a mock episode makes 23
objects of cyclic garbage in all (1.7 KB; closures, a closed socket), and after 4096 episodes the policy had left
4408 of them for a collection against 3784 with CPython's thresholds, at the same peak RSS. Where it matters, the
pass that still comes is halved by two rollout processes (`eval_passk --procs 2`). tests/test_gc_policy.py checks
that young and old cyclic garbage are both still collected.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

FULL_PASS_EVERY = 1000  # generation-1 passes between two full passes (CPython's default: 10)


def settle() -> None:
    """For the rest of the process: what is loaded now lives as long as it (collected once, then frozen), and
    full passes come every `FULL_PASS_EVERY` generation-1 passes. Never undone: a cycle alive now and dropped later
    is never collected, so only a process that owns its heap calls it, once set up (an eval shard; slime's rollout
    actor only with TAU2_SLIME_GC_POLICY=1)."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_PASS_EVERY)


@contextlib.contextmanager
def settled() -> Iterator[None]:
    """The policy for the length of a rollout inside a process that goes on afterwards (eval_passk's `main`, called
    in-process by tests, scripts and notebooks), undone completely on leaving: the thresholds are put back and what
    the block froze is unfrozen, so a cyclic object alive at its start and dropped after it is collected as before.
    `gc.unfreeze()` cannot tell one freeze from another, so the block freezes only when nothing is frozen yet (a
    caller's own freeze is left as it was, and the block then only changes the thresholds)."""
    before = gc.get_threshold()
    froze = gc.get_freeze_count() == 0
    if froze:
        gc.collect()
        gc.freeze()
    gc.set_threshold(before[0], before[1], FULL_PASS_EVERY)
    try:
        yield
    finally:
        if froze:
            gc.unfreeze()
        gc.set_threshold(*before)
