"""A stage on a hostfile cluster that restarts itself after a node fault: MAX_RESTARTS=N.

Why: the cluster watch (watch.py, run by scripts/cluster_watch.sh's `watched_job`) stops a job whose node was lost
with one line, and the stage resumes from its last checkpoint when run again; without this, "run again" waits for a
person (a link flap at 1 a.m. costs the night). With MAX_RESTARTS=N the stage script re-execs itself under this
supervisor, which runs the stage and, when it stopped on a node fault (the exit status NODE_LOST that only the watch's
verdict gives; the stage's own errors end otherwise and are never retried), waits until every host answers ssh and
holds no Ray of the run before (so `ray start` can start there) and the head's Ray ports are free, then runs the same
command again: slime resumes at the checkpointed rollout + 1. The wait is bounded (--wait-timeout) and says one line
a minute; each restart is one line; past N restarts, or past the wait, it stops with one line and the stage's status.

    python -m tau2_rl_pipeline.cluster.restarts --prog train_grpo.sh --max-restarts 2 --wait-timeout 1800 \\
        --workers 10.0.0.2 --ssh 'ssh -o BatchMode=yes' --head 10.0.0.1:6379 --dashboard-port 8265 \\
        -- bash scripts/train_grpo.sh

`after_run`, `host_problem`, `waiting_line` and `due` are the pure decisions (tests/test_restarts.py); processes,
ssh and sockets are at the edges. Standard library only: it runs on the machine's python3, like the scripts' other
helpers.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from tau2_rl_pipeline.cluster.watch import knock

NODE_LOST = 75  # the stage's exit status when the cluster watch stopped it (scripts/cluster_watch.sh: NODE_LOST_STATUS)
RESTARTS_ENV = "STAGE_RESTARTS"  # set for the stage: how many restarts came before this run (its presence: supervised)
REPORT_EVERY_S = 60.0
PROBE = "command -v ray >/dev/null || { echo no-ray; exit 0; }; pgrep -x raylet >/dev/null && echo ray-running; exit 0"


@dataclass(frozen=True)
class Decision:
    """What to do once the stage has ended: "done", "restart" or "stop", and the line to print (None: the stage's
    own lines said it)."""

    action: str
    line: str | None = None


def after_run(status: int, restarts_done: int, max_restarts: int, fault: str | None) -> Decision:
    """The stage ended with `status` after `restarts_done` restarts. Only a node fault (NODE_LOST) is restarted: any
    other failure is the stage's own (a bad input, a crash in slime) and would fail the same way again."""
    if status == 0:
        return Decision("done")
    if status != NODE_LOST:
        return Decision("stop")
    why = fault or "a node was lost"
    if restarts_done >= max_restarts:
        return Decision("stop", f"{why}; not restarting: all MAX_RESTARTS={max_restarts} restart(s) used (run the "
                                "same command again to resume from its last checkpoint)")
    return Decision("restart", f"restart {restarts_done + 1} of {max_restarts}: {why}; waiting for every host "
                               "to answer ssh and hold no Ray, then rerunning from the last checkpoint")


def host_problem(ssh_status: int, out: str, err: str) -> str | None:
    """Why a worker cannot take `ray start` yet, from the probe's exit status and output over ssh, or None."""
    if ssh_status != 0:
        last = (err.strip().splitlines() or [f"exit {ssh_status}"])[-1]
        return f"no ssh ({last})"
    if "no-ray" in out:
        return "ray is not on its PATH over ssh"
    if "ray-running" in out:
        return "its Ray from the run before is still running (its leash stops it)"
    return None


def waiting_line(problems: dict[str, str], waited_s: float, limit_s: float) -> str:
    """The once-a-minute line while hosts are not ready."""
    which = "; ".join(f"{host}: {why}" for host, why in problems.items())
    return f"waiting for {which} ({waited_s / 60:.0f} of {limit_s / 60:.0f} min)"


def due(now_s: float, last_s: float | None) -> bool:
    """A waiting line is due at the first look and then once a minute."""
    return last_s is None or now_s - last_s >= REPORT_EVERY_S


# ---- the edges: the stage's process, ssh, sockets ------------------------------------------------------------
def problems(args: argparse.Namespace) -> dict[str, str]:
    """Each host that is not ready yet, with why: the head's Ray ports taken, a worker's probe over ssh."""
    found: dict[str, str] = {}
    head, gcs_port = args.head.rsplit(":", 1)
    taken = [port for host, port in ((head, int(gcs_port)), ("127.0.0.1", args.dashboard_port)) if knock(host, port, 2)]
    if taken:
        found[head] = f"the head's Ray port(s) {', '.join(map(str, taken))} still taken"
    ssh = shlex.split(args.ssh)
    for worker in args.workers:
        try:
            proc = subprocess.run([*ssh, worker, PROBE], capture_output=True, text=True, timeout=60, check=False)
            why = host_problem(proc.returncode, proc.stdout, proc.stderr)
        except subprocess.TimeoutExpired:
            why = "no ssh (no answer in 60 s)"
        if why:
            found[worker] = why
    return found


def wait_for_hosts(args: argparse.Namespace, say) -> str | None:
    """Until every host is ready: None, or (past the wait) the line to stop on."""
    start = time.monotonic()
    last: float | None = None
    while True:
        found = problems(args)
        waited = time.monotonic() - start
        if not found:
            return None
        if waited >= args.wait_timeout:
            return (f"not restarting: {'; '.join(f'{h}: {w}' for h, w in found.items())} after "
                    f"RESTART_WAIT_TIMEOUT={args.wait_timeout:g} s (run the same command again once they are back)")
        if due(waited, last):
            say(waiting_line(found, waited, args.wait_timeout))
            last = waited
        time.sleep(args.poll)


class Stage:
    """One run of the stage command: its stderr passed through line by line, its last `error:` line kept."""

    def __init__(self, command: list[str], restarts_done: int) -> None:
        env = {**os.environ, RESTARTS_ENV: str(restarts_done)}
        self.proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
        self.error: str | None = None

    def wait(self) -> int:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if ": error: " in line:
                self.error = line.split(": error: ", 1)[1].strip()
        return self.proc.wait()

    def fault(self) -> str | None:
        """The watch's verdict as the stage said it, without its advice to rerun by hand."""
        return self.error.split("; the job ", 1)[0] if self.error else None


def supervise(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(f"{args.prog}: {line}", file=sys.stderr, flush=True)

    stopping = threading.Event()
    current: list[Stage] = []

    def stop(signum, _frame) -> None:
        """A stop asked of the supervisor is the stage's stop, and no restart follows. SIGTERM is passed on to the
        stage; Ctrl-C's SIGINT already reached it (the terminal sends it to the whole foreground group). The stage's
        EXIT trap then stops the cluster, its lines still passed through; while waiting for hosts, it ends here."""
        stopping.set()
        if not current:
            raise KeyboardInterrupt
        if signum == signal.SIGTERM:
            current[-1].proc.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    restarts = 0
    try:
        while True:
            stage = Stage(args.command, restarts)
            current[:] = [stage]
            status = stage.wait()
            status = 128 - status if status < 0 else status  # killed by a signal: as a shell reports it
            current.clear()
            if stopping.is_set():
                return status
            decision = after_run(status, restarts, args.max_restarts, stage.fault())
            if decision.action != "restart":
                if decision.line:
                    say(f"error: {decision.line}")
                return status
            say(decision.line)
            if (why := wait_for_hosts(args, say)) is not None:
                say(f"error: {why}")
                return status
            restarts += 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tau2_rl_pipeline.cluster.restarts",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--prog", required=True, help="the stage script's name, for its lines")
    parser.add_argument("--max-restarts", type=int, required=True, help="restarts after node faults, at most")
    parser.add_argument("--wait-timeout", type=float, required=True,
                        help="seconds to wait for the hosts before a restart, at most")
    parser.add_argument("--workers", type=lambda s: [w for w in s.split(",") if w], required=True,
                        help="the workers' addresses, comma-separated")
    parser.add_argument("--ssh", required=True, help="the ssh command the scripts use (RAY_SSH)")
    parser.add_argument("--head", required=True, help="the head's GCS, HOST:PORT")
    parser.add_argument("--dashboard-port", type=int, required=True, help="the head's Ray dashboard port")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between two looks at the hosts (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the stage command")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        build_parser().error("no stage command after --")
    if args.max_restarts < 0 or args.wait_timeout <= 0:
        build_parser().error("--max-restarts must be 0 or more and --wait-timeout above 0")
    return supervise(args)


if __name__ == "__main__":
    sys.exit(main())
