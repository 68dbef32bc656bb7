"""What a training run shows and keeps: a progress line per step, a JSON line per optimizer step.

What a training run shows and keeps: a progress line per step (a bar on a terminal), and one JSON line per
optimizer step to a file and, when asked, to wandb."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def clock(seconds: float) -> str:
    """A duration as a person reads it: 12s, 4m10s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def time_left(elapsed_s: float, done_here: int, left: int) -> str:
    """"about 4m10s left" at this run's pace (the steps done since it started or resumed), or "" before its first
    step and after its last."""
    if done_here <= 0 or left <= 0:
        return ""
    return f"about {clock(elapsed_s / done_here * left)} left"


def run_time(elapsed_s: float, done_here: int, left: int) -> str:
    """"4m10s, about 3m20s left": the time so far and the estimate, as a progress line shows them."""
    return ", ".join(x for x in (clock(elapsed_s), time_left(elapsed_s, done_here, left)) if x)


@contextmanager
def progress(description: str, total: int, done: int = 0) -> Iterator[Callable[..., None]]:
    """A rich progress bar on a terminal (elapsed and remaining time); yields advance(status). Nests under a
    caller's own bar (rich >= 14). When stderr is not a terminal (a log file, CI) a bar shows nothing until it
    ends: one line per step instead, with the elapsed time and the estimate beside it."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    if not Console(stderr=True).is_terminal:
        t0, start = time.perf_counter(), done

        def log_line(status: str = "") -> None:
            nonlocal done
            done += 1
            timing = run_time(time.perf_counter() - t0, done - start, total - done)
            print(f"{description} {done}/{total} {status} ({timing})".replace("  ", " "), file=sys.stderr, flush=True)

        yield log_line
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[status]}")) as bar:
        task = bar.add_task(description, total=total, completed=done, status="")
        yield lambda status="": bar.update(task, advance=1, status=status)


class MetricsSink:
    """Appends one JSON object per line to a local file (opened per record, so a crash keeps every finished
    step and nothing needs closing) and mirrors the numbers to wandb when a project is given. wandb is optional
    and never a dependency."""

    def __init__(self, path: str | Path, wandb_project: str | None = None, config: dict | None = None) -> None:
        self._run = start_wandb(wandb_project, config or {}) if wandb_project else None
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        if self._run is not None:
            numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
            self._run.log(numbers, step=record["step"])

    def close(self) -> None:
        """Finish the wandb run (the JSONL file needs nothing)."""
        if self._run is not None:
            self._run.finish()


def start_wandb(project: str, config: dict) -> Any:
    try:
        import wandb
    except ImportError:
        raise RuntimeError("wandb_project is set but wandb is not installed: pip install wandb, "
                           "or leave wandb_project unset") from None
    # Without a key (and no WANDB_MODE chosen) log offline: runs sync later with `wandb sync`, nothing prompts.
    offline = not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE")
    return wandb.init(project=project, config=config, mode="offline" if offline else None)
