"""Storage that fills up, for the faults of a full disk (ENOSPC): a small tmpfs of one's own, and a file written
until not one byte is left, removed to free the space again. Needs root (mount)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's words: 1m, 64m) mounted at `path` (made), unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def fill(fs: Path) -> Path:
    """Write a file under `fs` until its filesystem has no byte left; the file, to remove to free the space."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    if os.statvfs(fs).f_bavail != 0:
        raise RuntimeError(f"{fs} still has room after {filler} was written to its end")
    return filler
