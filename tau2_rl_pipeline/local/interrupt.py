"""Ctrl-C answered within a second while the local trainer runs.

Python raises KeyboardInterrupt between bytecodes of the main thread, so a long C++ call holds it back until the call
returns: one backward pass of the demo's SFT on airline-length sequences takes about 6 s on 2 CPU cores, and Ctrl-C
there took up to 13 s to answer. While `answer_ctrl_c` is active, Python's C-level SIGINT handler (which runs at
once, whatever the main thread is doing) also writes a byte to a pipe that a watcher thread reads (torch releases
the GIL inside its ops, so the watcher runs). If the main thread has not left the block `grace_s` later, the
watcher prints the caller's line and ends the process with 130, Ctrl-C's status. Nothing the run committed is lost
by that: the SFT state saved every SFT_SAVE_EVERY_S seconds and GRPO's finished steps are written whole (a file
replaced, a folder renamed), and the step in progress is what KeyboardInterrupt would have lost too.

Use it around work in this process only: a child process (the evaluator) answers Ctrl-C itself and says what it
kept, and its parent should wait for that line.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def answer_ctrl_c(line: str, grace_s: float = 1.0) -> Iterator[None]:
    """Within this block, Ctrl-C ends the process within about `grace_s` seconds: by KeyboardInterrupt as usual
    when the main thread gets to it in time, else by the watcher, which prints `line` to stderr and exits 130.
    Outside the main thread (where no signal arrives) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # set_wakeup_fd's requirement: the signal handler must never block
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    left = threading.Event()
    exiting = threading.Lock()  # the watcher's exit and the block's end exclude each other: one line, never two

    def watch() -> None:
        while data := os.read(read_end, 64):  # b"" once the block has ended and closed the write end
            if signal.SIGINT not in data or left.wait(grace_s):
                continue
            with exiting:
                if left.is_set():
                    continue
                print(line, file=sys.stderr, flush=True)
                os._exit(130)

    watcher = threading.Thread(target=watch, name="answer-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with exiting:
            left.set()
        signal.set_wakeup_fd(previous)
        os.close(write_end)
        watcher.join()
        os.close(read_end)
