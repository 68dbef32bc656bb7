"""Per-task curriculum: success counts, advantage weights, learning-value task sampling, saved state.

The original cookbook kept these counts in process memory, so every restart forgot which tasks were solved.
Here the tracker is saved next to the checkpoints with an atomic JSON write (a crash mid-write leaves the
previous file whole) and restored on resume. Thresholds and weights come from the current run's config; only
counts are saved, so a resumed run may change them.

The file is written after every rollout, the checkpoints only every --save-interval rollouts, and a resumed run
generates again the rollouts after its checkpoint. So the file also keeps what each of the newest rollouts added
(`rollouts_kept` of them, keyed by slime's rollout id), and a resumed run takes those away again
(`CurriculumTracker.begin_rollout`): its counts are those of the checkpointed rollout, as in a run never stopped.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

from tau2_rl_pipeline.benchmark.tau2_version import VERSION, BenchmarkMismatch
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.files import atomic_write_bytes

STATE_FILE = "curriculum_state.json"
_FORMAT_VERSION = 2  # 2: the newest rollouts' own counts; version 1 files (counts only) still load


def state_path(cfg: Tau2Config, checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """Where the counts are saved: TAU2_CURRICULUM_STATE_PATH, else curriculum_state.json in the checkpoint
    directory; None when persistence is off or there is no checkpoint directory."""
    if not cfg.curriculum_persist:
        return None
    if cfg.curriculum_state_path:
        return Path(cfg.curriculum_state_path)
    return Path(checkpoint_dir) / STATE_FILE if checkpoint_dir else None


def rollouts_kept(save_interval: int | None) -> int:
    """How many of the newest rollouts the file keeps apart: a resume goes back at most to the checkpoint before
    the last one (an asynchronous checkpoint may not be complete yet), plus the rollout the asynchronous
    train loop generates ahead of training: 2 * interval + 2."""
    return 2 * (save_interval or 1) + 2


class Counts:
    """Attempts and successes per task key, plus counts of GRPO groups with no signal."""

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.successes: dict[str, int] = {}
        self.groups_seen = 0
        self.zero_signal_groups = 0

    def record(self, task_key: str, success: bool) -> None:
        self.attempts[task_key] = self.attempts.get(task_key, 0) + 1
        self.successes[task_key] = self.successes.get(task_key, 0) + int(success)

    def count_groups(self, seen: int, zero_signal: int) -> None:
        self.groups_seen += seen
        self.zero_signal_groups += zero_signal

    def _take_away(self, other: Counts) -> None:
        """These counts less `other`'s (a part of them); a task left with no attempt is gone, as if never seen."""
        for key, n in other.attempts.items():
            self.attempts[key] -= n
            self.successes[key] -= other.successes.get(key, 0)
            if not self.attempts[key]:
                del self.attempts[key], self.successes[key]
        self.groups_seen -= other.groups_seen
        self.zero_signal_groups -= other.zero_signal_groups

    def _counts_dict(self) -> dict:
        return {"tasks": {key: {"attempts": n, "successes": self.successes.get(key, 0)}
                          for key, n in sorted(self.attempts.items())},
                "groups_seen": self.groups_seen, "zero_signal_groups": self.zero_signal_groups}

    def _read_counts(self, state: dict) -> None:
        for key, counts in state["tasks"].items():
            self.attempts[key] = int(counts["attempts"])
            self.successes[key] = int(counts["successes"])
        self.groups_seen = int(state["groups_seen"])
        self.zero_signal_groups = int(state["zero_signal_groups"])


class RolloutCounts(Counts):
    """What one rollout (slime's rollout id) added to the counts."""

    def __init__(self, rollout: int) -> None:
        super().__init__()
        self.rollout = rollout


class CurriculumTracker(Counts):
    """The counts of a run, and where they stand: `rollout`, the last rollout they hold (None: not known, as for
    the local backend, which saves a file per step, or a file written before rollouts were kept), and `recent`,
    what each of the newest rollouts added, oldest first, the last being `rollout`."""

    def __init__(self, cfg: Tau2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.rollout: int | None = None
        self.recent: list[RolloutCounts] = []

    # -- counting --------------------------------------------------------------------------------
    def record(self, task_key: str, success: bool) -> None:
        super().record(task_key, success)
        if self.recent:
            self.recent[-1].record(task_key, success)

    def count_groups(self, seen: int, zero_signal: int) -> None:
        super().count_groups(seen, zero_signal)
        if self.recent:
            self.recent[-1].count_groups(seen, zero_signal)

    def success_rate(self, task_key: str) -> float | None:
        attempts = self.attempts.get(task_key, 0)
        return self.successes.get(task_key, 0) / attempts if attempts else None

    # -- rollouts --------------------------------------------------------------------------------
    def begin_rollout(self, rollout: int | None, keep: int) -> str | None:
        """Count what follows as rollout `rollout`'s, on the counts as they stood after rollout `rollout` - 1: a
        run resumed at rollout r (its checkpoint r - 1) takes away what rollouts r.. had added before the run
        stopped, since it generates them again. Keeps the newest `keep` rollouts apart.

        Returns one line where the counts cannot be exactly those (None where they are): a file kept without
        rollouts (used as saved), one that ends before r - 1 (the rollouts between are missing), or one that no
        longer keeps the rollouts to take away (the counts start again from nothing rather than count those rollouts
        twice); and where a fresh start (r = 0), which starts from nothing, leaves counts unused. `rollout` None
        (slime gave no rollout id) counts on without rollouts kept, as the caller says."""
        if rollout is None:
            self.rollout, self.recent = None, []
            return None
        note = self._rewind(rollout - 1)
        self.rollout = rollout
        self.recent = [*self.recent, RolloutCounts(rollout)][-keep:]
        return note

    def _rewind(self, to: int) -> str | None:
        """The counts as they stood after rollout `to` (-1: before the first), and what is not exact about them."""
        held = sum(self.attempts.values())
        if self.rollout == to:
            note = None
        elif to < 0:
            note = f"a fresh start (rollout 0): the {held} attempts counted before are not used" if held else None
            self._forget()
        elif self.rollout is None:
            note = ("its counts are of no known rollout (a file written before rollouts were kept): they are used "
                    "as saved, so the rollouts after the checkpoint that it already counted count twice") if held \
                else f"no counts were saved: rollouts 0..{to} are not in them"
            self.recent = []
        elif to > self.rollout:
            note = (f"its counts end at rollout {self.rollout} and this run goes on after rollout {to}: rollouts "
                    f"{self.rollout + 1}..{to} are not in them")
            self.recent = []
        elif self.recent and self.recent[0].rollout <= to + 1:
            while self.recent and self.recent[-1].rollout > to:
                self._take_away(self.recent.pop())
            note = None
        else:
            kept = f"rollouts {self.recent[0].rollout}..{self.rollout}" if self.recent else "no rollout"
            note = (f"it keeps {kept} apart, not all of {to + 1}..{self.rollout}, which this run generates again "
                    f"after its checkpoint at rollout {to}: the counts start again from nothing rather than count "
                    "those rollouts twice")
            self._forget()
        self.rollout = to
        return note

    def _forget(self) -> None:
        self.attempts, self.successes, self.groups_seen, self.zero_signal_groups = {}, {}, 0, 0
        self.recent = []

    # -- advantage weights -----------------------------------------------------------------------
    def weight(self, task_key: str) -> float:
        """1.0 until min_attempts; then the solved weight above the solved threshold, the hard weight below
        the hard threshold (both strict), else 1.0. Always 1.0 with the curriculum off (TAU2_USE_CURRICULUM=0)."""
        cfg = self.cfg
        if not cfg.use_curriculum or self.attempts.get(task_key, 0) < cfg.curriculum_min_attempts:
            return 1.0
        rate = self.success_rate(task_key)
        if rate > cfg.curriculum_solved_threshold:
            return cfg.curriculum_solved_weight
        if rate < cfg.curriculum_hard_threshold:
            return cfg.curriculum_hard_weight
        return 1.0

    # -- task sampling ---------------------------------------------------------------------------
    def sampling_weights(self, task_keys: Sequence[str]) -> list[float]:
        """Draw weights: all 1.0 for the uniform sampler; for learning_value max(p(1-p), floor) with
        p = (successes + 1) / (attempts + 2), so an unseen task gets the neutral prior p = 0.5 (weight 0.25,
        the most a task can have) and a solved or hopeless task keeps being drawn at the floor. Uniform with the
        curriculum off."""
        if self.cfg.task_sampler == "uniform" or not self.cfg.use_curriculum:
            return [1.0] * len(task_keys)
        weights = []
        for key in task_keys:
            p = (self.successes.get(key, 0) + 1) / (self.attempts.get(key, 0) + 2)
            weights.append(max(p * (1.0 - p), self.cfg.sampler_floor))
        return weights

    def draw(self, task_keys: Sequence[str], k: int, rng: random.Random) -> list[str]:
        """k distinct task keys drawn by `sampling_weights` (weighted sampling without replacement,
        Efraimidis & Spirakis 2006: keep the k largest u ** (1 / w))."""
        if not 0 <= k <= len(task_keys):
            raise ValueError(f"cannot draw {k} distinct tasks from {len(task_keys)}")
        weights = self.sampling_weights(task_keys)
        keyed = sorted(((rng.random() ** (1.0 / w), key) for key, w in zip(task_keys, weights)), reverse=True)
        return [key for _, key in keyed[:k]]

    # -- persistence -----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "version": _FORMAT_VERSION,
            "tau2_version": VERSION,  # the counts are of this tau2's tasks: a resume on another is refused
            **self._counts_dict(),
            "rollout": self.rollout,
            "recent": [{"rollout": r.rollout, **r._counts_dict()} for r in self.recent],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the counts atomically (files.atomic_write_bytes): readers see the old file or the new one."""
        atomic_write_bytes(path, json.dumps(self.to_dict(), indent=1).encode("utf-8"))

    @classmethod
    def load(cls, path: str | os.PathLike, cfg: Tau2Config) -> CurriculumTracker:
        """The tracker saved at `path`; a file that is not a saved tracker is an error, never a silent reset."""
        try:
            state = json.loads(Path(path).read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"curriculum state {path} is unreadable: {exc}") from None
        made_with = state.get("tau2_version", VERSION) if isinstance(state, dict) else VERSION  # older files: none
        if made_with != VERSION:
            raise BenchmarkMismatch(
                f"curriculum state {path} was produced with tau2 {made_with}, this run uses tau2 {VERSION}: a run "
                "resumed across tau2 versions would mix two benchmarks; start a new run (another checkpoint "
                "directory or TAU2_CURRICULUM_STATE_PATH)")
        try:
            if state.get("version") not in (1, _FORMAT_VERSION):
                raise ValueError(f"version {state.get('version')!r}, expected {_FORMAT_VERSION}")
            tracker = cls(cfg)
            tracker._read_counts(state)
            tracker.rollout = None if state.get("rollout") is None else int(state["rollout"])
            for entry in state.get("recent", []):
                tracker.recent.append(RolloutCounts(int(entry["rollout"])))
                tracker.recent[-1]._read_counts(entry)
            ids = [r.rollout for r in tracker.recent]
            if ids and ids != list(range(tracker.rollout - len(ids) + 1, tracker.rollout + 1)):
                raise ValueError(f"its rollouts {ids} are not the ones up to its rollout {tracker.rollout}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"curriculum state {path} is unreadable: {exc}") from None
        return tracker

    @classmethod
    def restore(cls, cfg: Tau2Config, path: str | os.PathLike | None) -> CurriculumTracker:
        """The saved tracker when `path` (from `state_path`) exists, else a fresh one (first run, or
        persistence off)."""
        if path is not None and Path(path).exists():
            return cls.load(path, cfg)
        return cls(cfg)
