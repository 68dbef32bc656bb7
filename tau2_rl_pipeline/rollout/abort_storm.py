"""When a run must stop because it cannot learn: most episodes aborted, rollout after rollout.

An aborted episode (the policy server or the user simulator failing after retries) is recorded and never scored;
slime then trains on it with an all-zero mask. One bad rollout is noise; a server that is down makes every rollout
empty, and the run would go on "training" for hours with only warnings in the log. The guard counts finished
episodes in windows of one rollout's worth (rollout batch x samples per prompt) and stops the run, with the first
error it saw, once more than `patience` consecutive windows were mostly aborted. A fault no episode can get past
(`stop`: the prompt data was written with another tau2) stops the run at once. Pure bookkeeping: the slime adapter
feeds it and raises what it returns.

Windows, not rollouts, and the message says so: slime's dynamic sampling drops an aborted group and starts another
in its place, so with a server down a rollout never fills and never ends; a count of rollouts would never reach its
limit. Several windows then pass inside one rollout (with the user simulator killed and no retries, three windows in
0.7 s), which is the point: the run stops in seconds, not never.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


class AbortStorm(RuntimeError):
    """The run stops: too many consecutive windows (a rollout's worth of episodes each) were mostly aborted. The
    message is one line."""


@dataclass
class AbortStormGuard:
    window: int  # episodes per rollout (rollout_batch_size x n_samples_per_prompt)
    fraction: float  # a window is a storm when more than this fraction of it aborted
    patience: int  # storm windows in a row tolerated
    _seen: int = 0
    _aborted: int = 0
    _streak: int = 0
    _first_error: str | None = None
    _tripped: Exception | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.window < 1 or not 0.0 <= self.fraction <= 1.0 or self.patience < 0:
            raise ValueError(f"need window >= 1, 0 <= fraction <= 1, patience >= 0; got {self.window}, "
                             f"{self.fraction}, {self.patience}")

    @property
    def tripped(self) -> Exception | None:
        return self._tripped

    def stop(self, error: Exception) -> None:
        """Stop the run with `error` (kept when the run already stopped): the rollout raises it from now on."""
        with self._lock:
            self._tripped = self._tripped or error

    def record(self, aborted: bool, error: str | None = None) -> Exception | None:
        """Count one finished episode; returns the AbortStorm to raise once the run must stop (and ever after)."""
        with self._lock:
            if self._tripped is not None:
                return self._tripped
            self._seen += 1
            if aborted:
                self._aborted += 1
                if self._first_error is None and error:
                    self._first_error = error
            if self._seen < self.window:
                return None
            storm = self._aborted > self.fraction * self._seen
            self._streak = self._streak + 1 if storm else 0
            if not storm:
                self._first_error = None
            if self._streak > self.patience:
                first = " ".join((self._first_error or "no error recorded").split())
                self._tripped = AbortStorm(
                    f"stopping: {self._streak} windows in a row of {self.window} finished episodes (one rollout's "
                    f"worth each) had more than {self.fraction:.0%} of their episodes aborted ({self._aborted}/"
                    f"{self._seen} in the last); first error: {first}")
            self._seen = self._aborted = 0
            return self._tripped
