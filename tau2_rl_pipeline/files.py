"""Atomic file writes, the one way this package replaces a file.

Checkpoints' side files, prompt and data files, the evaluator's outputs. A reader sees the old file or the new one,
never a torn one; a write killed midway leaves at most one temp file (a fixed name per target, so one writer per
file), overwritten next time."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to `.<name>.tmp` beside `path`, fsync, rename over `path`, fsync the directory (parents made). A failed
    write (a full disk above all: `write` and `fsync` name no file) raises its OSError naming `path`, so the one line
    a failed job gets can say which storage is full."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
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


def unwritable_reason(path: str | os.PathLike) -> str | None:
    """Why a file could not be written at `path` (its missing parents made first), in words, or None when it could.
    Checked before work whose result goes there, so that a bad output path is one line before the work, not a
    traceback after it. Creates nothing lasting: a probe file in the nearest existing folder, removed at once."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a folder; give a file path inside it, such as {path / 'out.json'}"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, not a folder, so {path} cannot be made"
    probe = folder / f".{path.name}.{uuid.uuid4().hex[:12]}.probe"
    try:
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as e:
        return f"cannot write in {folder} ({e.strerror or e})"
    return None
