"""Atomic file writes, the one way this package replaces a file: checkpoints' side files, prompt and data files,
the evaluator's outputs. A reader sees the old file or the new one, never a torn one; a write killed midway leaves
at most one temp file (a fixed name per target, so one writer per file), overwritten next time."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to `.<name>.tmp` beside `path`, fsync, rename over `path`, fsync the directory (parents made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


def staging_dir(out: str | os.PathLike) -> Path:
    """A new empty folder beside `out` to write a directory into before renaming it to `out` (parents made). A
    plain mkdir, so it gets the permissions the umask gives (mkdtemp's 0700 left checkpoints unreadable to other
    users and to containers running as another uid); the random name keeps concurrent writers apart."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    return staging
