"""Ctrl-C is answered while a C++ call holds the main thread (local/interrupt.py), and only then does the watcher end
the process; real SIGINTs to real child processes.

A C call that never returns stands in for a long backward pass: relocking a glibc mutex the thread already holds
(through ctypes, which releases the GIL as torch's ops do). A signal does not end that wait, so without the watcher
these processes would not stop at all. Ctrl-C is sent once the child's main thread is seen waiting on that mutex
(/proc/PID/syscall), not when it says it is about to: on a loaded machine the signal could otherwise arrive in the
Python code just before the call, where it is an ordinary KeyboardInterrupt. No step here is timed: every wait is
for an event, bounded only so that a broken watcher fails the test instead of hanging it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 600  # only a child that will never end takes this long, however loaded the machine

STUCK = """
import ctypes
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # zeros: PTHREAD_MUTEX_INITIALIZER, a normal (non-recursive) mutex
libc.pthread_mutex_lock(mutex)

def stuck():
    print("stuck", ctypes.addressof(mutex), flush=True)  # the mutex's address: the futex the wait sleeps on
    libc.pthread_mutex_lock(mutex)  # waits for itself: only the process's end stops it
"""


def wait_inside_the_c_call(proc: subprocess.Popen, futex: int) -> None:
    """Until `proc`'s main thread sleeps in the futex wait on `futex` (the first argument of its current system
    call, /proc/PID/syscall): from then on it is inside the C call, whatever the machine's load."""
    deadline = time.monotonic() + HANG_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            fields = Path(f"/proc/{proc.pid}/syscall").read_text().split()
        except OSError as e:
            proc.kill()
            pytest.skip(f"needs /proc/PID/syscall to see the child wait: {e}")
        if len(fields) > 1 and fields[1].startswith("0x") and int(fields[1], 16) == futex:
            return
        time.sleep(0.01)
    raise AssertionError(f"the child never waited on its mutex (exit status {proc.poll()})")


def run_until(code: str, ready: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter, send SIGINT once it prints `ready`, and return how it ended."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.split()[:1] == [ready]:
            break
    else:
        raise AssertionError(f"child ended before {ready!r}: {''.join(seen)} {proc.stderr.read()}")
    if ready == "stuck":
        wait_inside_the_c_call(proc, int(line.split()[1]))
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=HANG_S)  # the watcher waits 1 s; a stuck process without it never ends
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(seen) + out, err)


def test_ctrl_c_while_a_c_call_holds_the_main_thread_prints_the_line_and_exits_130(tmp_path: Path) -> None:
    done = run_until(STUCK + """
from tau2_rl_pipeline.local.interrupt import answer_ctrl_c
with answer_ctrl_c("interrupted: kept in out/; rerun to resume"):
    stuck()
print("never here", flush=True)
""", "stuck", tmp_path)
    assert done.returncode == 130
    assert done.stderr.splitlines() == ["interrupted: kept in out/; rerun to resume"]
    assert "never here" not in done.stdout


def test_ctrl_c_reaching_python_code_is_a_keyboard_interrupt_and_the_watcher_stands_down(tmp_path: Path) -> None:
    """In Python code the run stops as it always has (its own handler says what it kept); after the block the
    wakeup pipe is the caller's again, and the watcher is gone: the process lives on with one thread. The grace
    time is far longer than a loaded machine keeps the main thread from KeyboardInterrupt, so only a watcher that
    fires in Python code fails this test."""
    done = run_until(f"""
import signal, sys, threading, time
from tau2_rl_pipeline.local.interrupt import answer_ctrl_c
try:
    with answer_ctrl_c("the watcher's line", grace_s={HANG_S}):
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
except KeyboardInterrupt:
    print("caught", flush=True)
print("wakeup fd", signal.set_wakeup_fd(-1), "threads", threading.active_count(), flush=True)
""", "ready", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == ["caught", "wakeup fd -1 threads 1"]
    assert "the watcher's line" not in done.stderr


def test_the_demo_sft_stage_answers_ctrl_c_inside_a_backward_pass(tiny_small_dir: Path, tmp_path: Path) -> None:
    """The demo's SFT stage (real trainer, tiny model, mock oracle demonstrations) with its backward pass made to hang
    as a long one does: Ctrl-C gives the demo's own line and 130, without a traceback."""
    out = tmp_path / "demo"
    done = run_until(STUCK + f"""
import argparse
from pathlib import Path
import torch
from tau2_rl_pipeline.learning.oracle_demos import oracle_demonstrations
from tau2_rl_pipeline.local import pipeline

torch.Tensor.backward = lambda self, *a, **k: stuck()
args = argparse.Namespace(device="cpu", seed=0, micro_batch_size=2, wandb_project=None)
out = Path({str(out)!r})
pipeline.sft_stage(args, Path({str(tiny_small_dir)!r}), oracle_demonstrations("mock", "base"), out / "sft", out,
                   lr=1e-3, epochs=1)
""", "stuck", tmp_path)
    assert done.returncode == 130, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith(("interrupted:", "Traceback"))]
    assert lines == [pipeline_line(out)]


def pipeline_line(out: Path) -> str:
    from tau2_rl_pipeline.local.pipeline import interrupted_line

    return interrupted_line(out)
