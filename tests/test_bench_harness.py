"""bench/harness.py runs end to end (a smoke run, nothing timed): its canned engine answers by SGLang's contract and
every episode of the evaluator's runner completes against it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("workers,procs,gc", [("0", "1", "policy"), ("4", "1", "freeze"), ("0", "2", "policy")])
def test_harness_bench_runs_every_episode_to_completion(workers, procs, gc):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "harness.py"), "--episodes", "12", "--concurrency", "4",
                          "--latency", "0.01", "--workers", workers, "--procs", procs, "--gc", gc],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = dict(tuple(cell.strip() for cell in line.strip("| ").split(" | ", 1)) for line in out.splitlines()[2:])
    assert rows["statuses"] == "completed 12"
    assert rows["generate calls"] == "36 (episode turns 36)"  # 2 tool turns + the closing reply each
    assert rows["domain (environments) / episode_workers / GC / processes"] == f"mock (fast_env) / {workers} / {gc} / {procs}"


@pytest.mark.parametrize("client,workers,procs", [("async", "0", "1"), ("litellm", "4", "1"), ("async", "0", "2")])
def test_user_path_bench_runs_every_episode_through_the_llm_user(client, workers, procs):
    """bench/user_path.py (P5): tau2's LLM user against the canned user server, through either client; with
    --procs 2, two rollout processes share the episodes and both servers' calls are counted across them."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "user_path.py"), "--client", client, "--workers",
                          workers, "--episodes", "8", "--concurrency", "4", "--latency", "0.01", "--turns", "8",
                          "--procs", procs], capture_output=True, text=True, timeout=300, check=True).stdout
    rows = dict(tuple(cell.strip() for cell in line.strip("| ").split(" | ", 1))
                for line in out.splitlines() if line.startswith("| ") and " | " in line.strip("| "))
    assert rows["client (user class)"] == f"{client} ({'AsyncUserSimulator' if client == 'async' else 'UserSimulator'})"
    assert rows["client / episode_workers / GC / processes"] == f"{client} / {workers} / policy / {procs}"
    assert rows["statuses"] == "completed 8"
    # per episode: 2 tool turns, a reply, a reply after the follow-up; the user's request, follow-up and stop
    assert rows["generate calls / user calls"] == "32 / 24"
