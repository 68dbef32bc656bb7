"""sglang.srt.utils: the one name slime imports at module level (slime/backends/sglang_utils/sglang_engine.py)."""

from __future__ import annotations

import os
import signal


def kill_process_tree(parent_pid, include_parent: bool = True, skip_pid: int | None = None):
    """SGLang's (sglang/srt/utils/common.py): kill a process's children, then the process; None means this one."""
    import psutil

    parent_pid = os.getpid() if parent_pid is None else parent_pid
    try:
        parent = psutil.Process(parent_pid)
    except psutil.NoSuchProcess:
        return
    for child in parent.children(recursive=True):
        if child.pid != skip_pid:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    if include_parent and parent_pid != os.getpid():
        try:
            parent.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
