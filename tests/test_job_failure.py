"""A job that fails by itself, in one line (tau2_rl_pipeline/cluster/job_failure.py): the verdicts over the tail of
the job's output as Ray prints it, the wrapper the stage script runs the job in (output passed through, signals
passed on, the verdict written), and `watched_job` (scripts/cluster_watch.sh) ending at once with that line. The same
faults on separate hosts, through train_grpo.sh: tests/contract/test_hosts_faults.py (the hosts tier)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tau2_rl_pipeline.cluster import job_failure
from tau2_rl_pipeline.cluster.job_failure import why_failed

ROOT = Path(__file__).resolve().parents[1]
WRAPPER = ROOT / "tau2_rl_pipeline" / "cluster" / "job_failure.py"
USER = "http://198.18.0.1:30001/v1"

# The tails of the two jobs of the hosts tier's faults, as `ray job submit` (here hosts_job.py) printed them: the
# driver's traceback around slime's RolloutManager.generate, Ray's RayTaskError naming the remote one.
ENOSPC_TAIL = """\
Traceback (most recent call last):
  File "/work/main/tests/contract/hosts_job.py", line 176, in engines_and_rollouts
    boxes = ray.get(manager.generate.remote(rollout_id), timeout=WAIT_S)  # one per data-parallel rank
ray.exceptions.RayTaskError(OSError): ray::RolloutManager.generate() (pid=4242, ip=198.18.0.1, actor_id=ab12)
  File "/work/main/tau2_rl_pipeline/slime_plugins/adapter.py", line 403, in reward_post_process
    tracker.save(path)
  File "/work/main/tau2_rl_pipeline/files.py", line 22, in atomic_write_bytes
    f.write(data)
OSError: [Errno 28] No space left on device: '/shared/out/checkpoints/grpo/curriculum_state.json'
"""
STORM_TAIL = """\
ray.exceptions.RayTaskError(AbortStorm): ray::RolloutManager.generate() (pid=4242, ip=198.18.0.1, actor_id=ab12)
  File "/work/main/tau2_rl_pipeline/slime_plugins/adapter.py", line 313, in generate
    raise storm
tau2_rl_pipeline.rollout.abort_storm.AbortStorm: stopping: 3 windows in a row of 4 episodes (each one rollout's \
worth) had more than 50% of their episodes aborted (4/4 in the last); first error: user simulator failed: \
InternalServerError: litellm.InternalServerError: OpenAIException - Server disconnected \
(ServerDisconnectedError)
"""


def test_full_storage_is_named_with_the_file_and_what_to_do() -> None:
    failure = why_failed(ENOSPC_TAIL, 1, USER)
    assert failure.known and "\n" not in failure.line
    assert failure.line == (
        "the job could not write /shared/out/checkpoints/grpo/curriculum_state.json: no space left on its device "
        "(ENOSPC); free space there, then run the same command again: it resumes from the last checkpoint")


def test_full_storage_without_a_file_name_still_says_so() -> None:
    failure = why_failed("  f.flush()\nOSError: [Errno 28] No space left on device\n", 1)
    assert failure.known and failure.line.startswith("the job could not write a file: no space left on its device")


def test_a_checkpoint_save_that_torch_could_not_write_is_named_as_storage_too() -> None:
    tail = ("  File \"megatron/core/dist_checkpointing/strategies/common.py\", line 48, in save_common\n"
            "    torch.save(common_state_dict, path)\n[rank0]: RuntimeError: basic_ios::clear: iostream error\n")
    failure = why_failed(tail, 1)
    assert failure.known and failure.line.startswith("a checkpoint save could not write its files (torch.save: "
                                                     "basic_ios::clear: iostream error, which is what a full disk")


def test_a_user_simulator_gone_is_named_with_its_address_and_the_first_error() -> None:
    failure = why_failed(STORM_TAIL, 1, USER)
    assert failure.known and "\n" not in failure.line
    assert failure.line.startswith(f"the user simulator at {USER} stopped answering: most episodes aborted (user "
                                   "simulator failed: InternalServerError")
    assert "ServerDisconnectedError" in failure.line and "start it again (scripts/start_user_sim.sh)" in failure.line


def test_a_storm_of_the_policy_engines_is_named_by_its_first_error() -> None:
    tail = ("tau2_rl_pipeline.rollout.abort_storm.AbortStorm: stopping: 2 windows in a row of 2 episodes (each one "
            "rollout's worth) had more than 50% of their episodes aborted (2/2 in the last); first error: HTTP 500 at "
            "http://h:1/generate\n")
    failure = why_failed(tail, 1)
    assert failure.known and failure.line.startswith("most episodes aborted, the job stopped (stopping: 2 windows")
    assert "HTTP 500 at http://h:1/generate" in failure.line


def test_any_other_failure_gets_its_last_exception_line_and_no_certainty() -> None:
    tail = ("Traceback (most recent call last):\nValueError: first\n  File x\n"
            "ray.exceptions.RayTaskError(KeyError): ray::Actor.f() (pid=1)\n")
    failure = why_failed(tail, 1)
    assert not failure.known
    assert failure.line == ("the job failed (exit 1): RayTaskError(KeyError): ray::Actor.f() (pid=1); see the job's "
                            "log above")
    assert why_failed("Killed\n", 137).line == "the job failed (exit 137); see the job's log above"


def wrapped(tmp_path: Path, script: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WRAPPER), "--why", str(tmp_path / "why"), "--", sys.executable,
                             "-c", textwrap.dedent(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def test_the_wrapper_passes_the_output_through_and_writes_the_verdict(tmp_path: Path) -> None:
    proc = wrapped(tmp_path, """
        import sys
        print("rollout 0")
        sys.stderr.write("OSError: [Errno 28] No space left on device: '/s/x'\\n")
        sys.exit(3)
    """)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (3, "rollout 0\n", "OSError: [Errno 28] No space left on device: '/s/x'\n")
    kind, line = (tmp_path / "why").read_text().rstrip("\n").split("\t")
    assert kind == "known" and line.startswith("the job could not write /s/x: no space left")


def test_the_wrapper_writes_nothing_for_a_job_that_succeeds(tmp_path: Path) -> None:
    proc = wrapped(tmp_path, "print('done')")
    assert proc.communicate(timeout=60) == ("done\n", "") and proc.returncode == 0
    assert not (tmp_path / "why").exists()


def test_the_wrapper_passes_sigterm_on_and_its_death_kills_the_job(tmp_path: Path) -> None:
    job = """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (print("job: SIGTERM", flush=True), sys.exit(7)))
        print(os.getpid(), flush=True)
        time.sleep(120)
    """
    proc = wrapped(tmp_path, job)
    pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "job: SIGTERM\n" and proc.wait(timeout=60) == 7
    # a SIGKILL of the wrapper (the script's last resort) takes the job with it
    proc = wrapped(tmp_path, job)
    pid = int(proc.stdout.readline())
    proc.kill()
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "Z" not in _state(pid):
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "Z"


def test_the_tail_kept_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import deque

    monkeypatch.setattr(job_failure, "TAIL_BYTES", 1000)
    output = b"x" * 300_000 + b"\nOSError: [Errno 28] No space left on device\n"  # read in 5 chunks
    (tmp_path / "output").write_bytes(output)
    tail: deque[bytes] = deque()
    with open(tmp_path / "output", "rb") as source, open(tmp_path / "sink", "wb") as sink:
        job_failure._pump(source, sink, tail)
    assert (tmp_path / "sink").read_bytes() == output
    assert 1000 <= sum(map(len, tail)) < 1000 + 65536 and b"".join(tail).endswith(b"No space left on device\n")


def test_watched_job_ends_at_once_with_the_line_and_no_wait_for_the_watch(tmp_path: Path) -> None:
    """scripts/cluster_watch.sh's watched_job on a 2-node cluster whose Ray is not there (the watch cannot answer):
    a job that fails of a full disk ends the script with the one line, well before the 20 s a node's loss gets."""
    job = "import sys; sys.stderr.write(\"OSError: [Errno 28] No space left on device: '/s/ckpt'\\n\"); sys.exit(1)"
    script = f"""
        source scripts/common.sh
        NUM_NODES=2 MASTER_ADDR=127.0.0.1 RAY_GCS_PORT=9 WORKERS=(127.0.0.2) LOG_DIR={tmp_path}/logs
        PYTHON={sys.executable}
        WATCH_CMD=({sys.executable} -m tau2_rl_pipeline.cluster.watch --address 127.0.0.1:9 --expect 127.0.0.1,127.0.0.2)
        watched_job {sys.executable} -c {shlex.quote(job)}
    """
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", textwrap.dedent(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TAU2_OUT_DIR": str(tmp_path / "out")})
    took = time.monotonic() - started
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1, proc.stderr
    assert lines[-1] == ("bash: error: the job could not write /s/ckpt: no space left on its device (ENOSPC); free "
                         "space there, then run the same command again: it resumes from the last checkpoint"), \
        proc.stderr
    assert [line for line in lines if "error:" in line] == lines[-1:]
    assert took < 20, took
