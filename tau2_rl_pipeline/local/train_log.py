"""What a training run shows and keeps: a progress line per step (a bar on a terminal), and one JSON line per
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


@contextmanager
def progress(description: str, total: int, done: int = 0) -> Iterator[Callable[..., None]]:
    """A rich progress bar on a terminal; yields advance(status). Nests under a caller's own bar (rich >= 14).
    When stderr is not a terminal (a log file, CI) a bar shows nothing until it ends: one line per step instead."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not Console(stderr=True).is_terminal:
        t0 = time.perf_counter()

        def log_line(status: str = "") -> None:
            nonlocal done
            done += 1
            print(f"{description} {done}/{total} {status} ({time.perf_counter() - t0:.1f}s)".replace("  ", " "),
                  file=sys.stderr, flush=True)

        yield log_line
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[status]}")) as bar:
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
