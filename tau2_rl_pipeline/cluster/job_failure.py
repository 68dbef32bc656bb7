"""Why slime's job failed by itself, in one line: the stage script's word when the job (not a node) ends non-zero.

Why: a job that dies of its own fault ends in Ray's traceback, dozens of lines whose last names an exception class
deep in a stack, and the stage script would add nothing. Two causes a multi-node run meets and a user can mend are
named with what to do: the storage full (`OSError: [Errno 28] No space left on device`: the curriculum state
written every rollout, or a file of a checkpoint; Megatron's save of a checkpoint's common.pt through torch.save
says only `RuntimeError: basic_ios::clear: iostream error` there) and an abort storm whose first error is the
user simulator's (it was killed or stopped answering: `AbortStorm: ... user simulator failed ...`). Anything else
gets the job's last exception line and "see the job's log above"; the stage script (scripts/cluster_watch.sh,
`watched_job`) then still waits a few seconds for the cluster watch, in case a node's loss is why.

`why_failed` is pure (the tail of the job's output in, a `Failure` out). `main` runs the job as the script would,
passing its output through unchanged, keeping only its tail, and writes the verdict to a file for the script:

    python tau2_rl_pipeline/cluster/job_failure.py --why FILE -- ray job submit ... -- python train.py ...

Stdlib only, run by path: the job's environment (its PYTHONPATH above all) is the script's, untouched.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass

TAIL_BYTES = 256 * 1024  # of each stream: the job's last traceback and Ray's summary of it fit many times over
RESUME = "run the same command again: it resumes from the last checkpoint"

# `OSError: [Errno 28] No space left on device` (Python's words for ENOSPC), with the file when Python names one
_ENOSPC = re.compile(r"\[Errno 28\] No space left on device(?::\s*'(?P<path>[^']+)')?")
# torch.save's zip writer on a full disk (Megatron's checkpoint save, its common.pt): C++ iostream words, no errno
_TORCH_WRITE = re.compile(r"(?P<says>basic_ios::clear: iostream error|PytorchStreamWriter failed writing file.*)$",
                          re.MULTILINE)
# the project's abort-storm stop (rollout/abort_storm.py), under whatever module path Ray prints the class with
_STORM = re.compile(r"\bAbortStorm: (?P<message>stopping: .*?first error: (?P<first>.*))$", re.MULTILINE)
# the last `SomethingError: message` line of a traceback (Ray's RayTaskError(X) included)
_EXCEPTION = re.compile(r"^(?:[\w.]+\.)?(?P<line>\w*(?:Error|Exception|Storm)(?:\([\w.]+\))?: .+)$", re.MULTILINE)


@dataclass(frozen=True)
class Failure:
    line: str  # one line: the cause and what to do
    known: bool  # a cause named for certain (no need to wait for the cluster watch's word)


def why_failed(tail: str, rc: int, user_api_base: str | None = None) -> Failure:
    """The one line for a job that ended with exit `rc`, from the tail of its output (stdout and stderr)."""
    spaces = list(_ENOSPC.finditer(tail))
    if spaces:
        path = next((m["path"] for m in reversed(spaces) if m["path"]), None)
        what = f"could not write {path}" if path else "could not write a file"
        where = " there" if path else " where it writes (the shared storage: checkpoints, curriculum state)"
        return Failure(f"the job {what}: no space left on its device (ENOSPC); free space{where}, then {RESUME}",
                       known=True)
    torch_write = list(_TORCH_WRITE.finditer(tail))
    if torch_write:
        return Failure(f"a checkpoint save could not write its files (torch.save: {torch_write[-1]['says'].strip()}, "
                       "which is what a full disk gives it); free space on the storage the checkpoints go to "
                       f"(--save), then {RESUME}", known=True)
    storms = list(_STORM.finditer(tail))
    if storms:
        first = storms[-1]["first"].strip()
        if "user simulator failed" in first:
            at = f" at {user_api_base}" if user_api_base else ""
            return Failure(f"the user simulator{at} stopped answering: most episodes aborted ({first}); start it "
                           f"again (scripts/start_user_sim.sh) and check it answers, then {RESUME}", known=True)
        return Failure(f"most episodes aborted, the job stopped ({storms[-1]['message'].strip()}); mend what the "
                       f"first error names, then {RESUME}", known=True)
    exceptions = list(_EXCEPTION.finditer(tail))
    last = f": {exceptions[-1]['line'].strip()}" if exceptions else ""
    return Failure(f"the job failed (exit {rc}){last}; see the job's log above", known=False)


# ---- running the job ------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the job's process: SIGKILL when this wrapper dies (a SIGKILL from the script), as the job would have got."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pump(source, sink, tail: deque[bytes]) -> None:
    """Copy one stream of the job through as it comes, keeping its last TAIL_BYTES."""
    kept = 0
    while chunk := os.read(source.fileno(), 65536):
        sink.write(chunk)
        sink.flush()
        tail.append(chunk)
        kept += len(chunk)
        while kept - len(tail[0]) >= TAIL_BYTES:
            kept -= len(tail.popleft())


def run(argv: list[str], why_path: str) -> int:
    """Run the job, its output passed through; SIGTERM and SIGINT passed on. On a non-zero exit, `known\\tLINE` or
    `unknown\\tLINE` goes to `why_path`. The job's exit status is returned (128 + signal when a signal ended it)."""
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_die_with_parent,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})  # its lines as they come, through a pipe
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: job.send_signal(signum))
    tails: tuple[deque[bytes], deque[bytes]] = (deque(), deque())
    pumps = [threading.Thread(target=_pump, args=(stream, sink, tail), daemon=True)
             for stream, sink, tail in ((job.stdout, sys.stdout.buffer, tails[0]),
                                        (job.stderr, sys.stderr.buffer, tails[1]))]
    for pump in pumps:
        pump.start()
    rc = job.wait()
    for pump in pumps:
        pump.join()
    rc = 128 - rc if rc < 0 else rc
    if rc != 0:
        text = "\n".join(b"".join(tail).decode("utf-8", "replace") for tail in tails)
        failure = why_failed(text, rc, os.environ.get("TAU2_USER_API_BASE"))
        with open(why_path, "w") as f:
            f.write(f"{'known' if failure.known else 'unknown'}\t{failure.line}\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="job_failure.py", description=__doc__.split("\n")[0])
    parser.add_argument("--why", required=True, help="the file the verdict goes to when the job fails")
    parser.add_argument("job", nargs=argparse.REMAINDER, help="-- the job's command")
    args = parser.parse_args(argv)
    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not command:
        parser.error("no job command after --")
    return run(command, args.why)


if __name__ == "__main__":
    sys.exit(main())
