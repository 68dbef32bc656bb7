"""Episodes cut by slime's end-of-rollout abort, kept until slime hands their sample back (`--partial-rollout`).

slime's own single-turn generate resumes a returned sample from the tokens it holds. A tau2 episode is more than its
tokens (the environment's database, the user simulator's conversation), so the live episode itself is kept here,
keyed by what slime keeps on the Sample it puts back in its buffer (its index and session id), and the next
generate call for that sample goes on with it instead of starting the task again.

Nothing outlives its use: an entry is taken when its sample comes back, dropped when the sample object is gone
(trained, or dropped by slime), and the oldest entries go when more are kept than `capacity` (that sample then
starts again, as without resuming). The registry lives in the rollout process: the run's end ends it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from tau2_rl_pipeline.rollout.episode_loop import LiveEpisode

logger = logging.getLogger(__name__)


def sample_key(sample) -> tuple | None:
    """What identifies a slime Sample across its trips through slime's buffer (None when nothing does)."""
    if sample.index is None and sample.session_id is None:
        return None
    return sample.group_index, sample.index, sample.session_id


@dataclass
class _Entry:
    live: LiveEpisode
    task: tuple[str, str]  # (domain, task_id): a sample handed back must still be this task
    response_length: int  # the sample's response length when it was cut: a sample changed since is not resumed
    serial: int


class LiveEpisodes:
    """A bounded, thread-safe map from cut samples to their live episodes (slime's fully asynchronous rollout runs
    its episodes on a thread of its own)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        # re-entrant: a sample's finalizer (_drop) may run in this thread during a collection inside the lock
        self._lock = threading.RLock()
        self._serials = itertools.count()
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> set[tuple]:
        with self._lock:
            return set(self._entries)

    def keep(self, sample, live: LiveEpisode, task: tuple[str, str]) -> bool:
        """Keep `live` for when `sample` comes back; False when the sample has nothing to be known by."""
        key = sample_key(sample)
        if key is None:
            return False
        entry = _Entry(live, task, int(sample.response_length), next(self._serials))
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            dropped = 0
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
                dropped += 1
            self.evicted += dropped
        if dropped:
            logger.warning("partial rollout: %d cut episode(s) past the %d kept will start again when handed back",
                           dropped, self.capacity)
        weakref.finalize(sample, self._drop, key, entry.serial)
        return True

    def take(self, sample, task: tuple[str, str]) -> LiveEpisode | None:
        """The live episode kept for `sample` (removed from the registry), or None."""
        key = sample_key(sample)
        if key is None:
            return None
        with self._lock:
            entry = self._entries.pop(key, None)
        if entry is None:
            return None
        if entry.task != task or entry.response_length != int(sample.response_length):
            logger.warning("partial rollout: sample %s came back changed (task %s, %d response tokens; kept %s, %d): "
                           "its episode starts again", key, task, sample.response_length, entry.task,
                           entry.response_length)
            return None
        return entry.live

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _drop(self, key: tuple, serial: int) -> None:
        """The sample is gone (trained or dropped): its episode, if still kept from that cut, goes too."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.serial == serial:
                del self._entries[key]
