"""Per-task curriculum: success counts, advantage weights, learning-value task sampling, saved state.

The original cookbook kept these counts in process memory, so every restart forgot which tasks were solved.
Here the tracker is saved next to the checkpoints with an atomic JSON write (a crash mid-write leaves the
previous file whole) and restored on resume. Thresholds and weights come from the current run's config; only
counts are saved, so a resumed run may change them.
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
_FORMAT_VERSION = 1


def state_path(cfg: Tau2Config, checkpoint_dir: str | os.PathLike | None) -> Path | None:
    """Where the counts are saved: TAU2_CURRICULUM_STATE_PATH, else curriculum_state.json in the checkpoint
    directory; None when persistence is off or there is no checkpoint directory."""
    if not cfg.curriculum_persist:
        return None
    if cfg.curriculum_state_path:
        return Path(cfg.curriculum_state_path)
    return Path(checkpoint_dir) / STATE_FILE if checkpoint_dir else None


class CurriculumTracker:
    """Attempts and successes per task key, plus counts of GRPO groups with no signal."""

    def __init__(self, cfg: Tau2Config) -> None:
        self.cfg = cfg
        self.attempts: dict[str, int] = {}
        self.successes: dict[str, int] = {}
        self.groups_seen = 0
        self.zero_signal_groups = 0

    # -- counting --------------------------------------------------------------------------------
    def record(self, task_key: str, success: bool) -> None:
        self.attempts[task_key] = self.attempts.get(task_key, 0) + 1
        self.successes[task_key] = self.successes.get(task_key, 0) + int(success)

    def count_groups(self, seen: int, zero_signal: int) -> None:
        self.groups_seen += seen
        self.zero_signal_groups += zero_signal

    def success_rate(self, task_key: str) -> float | None:
        attempts = self.attempts.get(task_key, 0)
        return self.successes.get(task_key, 0) / attempts if attempts else None

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
            "tasks": {key: {"attempts": n, "successes": self.successes.get(key, 0)}
                      for key, n in sorted(self.attempts.items())},
            "groups_seen": self.groups_seen,
            "zero_signal_groups": self.zero_signal_groups,
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
            if state.get("version") != _FORMAT_VERSION:
                raise ValueError(f"version {state.get('version')!r}, expected {_FORMAT_VERSION}")
            tracker = cls(cfg)
            for key, counts in state["tasks"].items():
                tracker.attempts[key] = int(counts["attempts"])
                tracker.successes[key] = int(counts["successes"])
            tracker.groups_seen = int(state["groups_seen"])
            tracker.zero_signal_groups = int(state["zero_signal_groups"])
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
