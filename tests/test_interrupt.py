"""Ctrl-C is answered while a C++ call holds the main thread (local/interrupt.py), and only then does the watcher end
the process; real SIGINTs to real child processes.

A C call that never returns stands in for a long backward pass: relocking a glibc mutex the thread already holds
(through ctypes, which releases the GIL as torch's ops do). A signal does not end that wait, so without the watcher
these processes would not stop at all."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUCK = """
import ctypes
libc = ctypes.CDLL(None)
mutex = ctypes.create_string_buffer(64)  # zeros: PTHREAD_MUTEX_INITIALIZER, a normal (non-recursive) mutex
libc.pthread_mutex_lock(mutex)

def stuck():
    print("stuck", flush=True)
    libc.pthread_mutex_lock(mutex)  # waits for itself: only the process's end stops it
"""


def run_until(code: str, ready: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter, send SIGINT once it prints `ready`, and return how it ended."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip() == ready:
            break
    else:
        raise AssertionError(f"child ended before {ready!r}: {''.join(seen)} {proc.stderr.read()}")
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)  # the watcher waits 1 s; a stuck process without it never ends
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
    wakeup pipe is the caller's again, and the watcher is gone: the process lives on past the grace time."""
    done = run_until("""
import signal, sys, threading, time
from tau2_rl_pipeline.local.interrupt import answer_ctrl_c
try:
    with answer_ctrl_c("the watcher's line", grace_s=0.5):
        print("ready", flush=True)
        while True:
            time.sleep(0.01)
except KeyboardInterrupt:
    print("caught", flush=True)
time.sleep(1.5)  # three grace times: a watcher still about would have ended the process by now
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
