"""Fault injection: a server or network failure ends an episode as aborted after retries, and is never scored.

The faults come from bench/faults.py's `FaultProxy` (a reverse proxy on 127.0.0.1 in front of the SGLang look-alike
loopback server): connection refused, reset mid-response, HTTP 500, slower than the client's timeout, a body that
is not JSON, a connection closed without an answer. bench/faults.py runs the same at full size for the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.loopback_server import LoopbackServer

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.metrics import summarize
from tau2_rl_pipeline.rollout.engines import SamplingParams, SGLangEngine
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, Trajectory

ROOT = Path(__file__).resolve().parents[1]


from bench_faults import faults  # noqa: E402  (bench/faults.py, shared by the hardening tests)

TASKS = load_tasks("mock", "base")
CLIENT_TIMEOUT_S = 3.0  # generous: on 2 busy cores a queued request can take a second
HANG_S = 600.0  # a "slow" answer comes this late: past the client's timeout however late a loaded machine fires it
# (it costs nothing: the client gives up at its timeout, and a client that gives up cancels the hung handler)
# The user simulator's retry and timeout settings (proposed Tau2Config fields; ignored until they exist).
USER_ENV = {"TAU2_USER_MAX_RETRIES": "2", "TAU2_USER_TIMEOUT_S": str(CLIENT_TIMEOUT_S)}
FAST_RETRIES = {"timeout_s": CLIENT_TIMEOUT_S, "backoff_base_s": 0.02, "backoff_max_s": 0.2}
ONE_REQUEST = {**FAST_RETRIES, "timeout_s": 1.5}  # a three-token request alone: far below this even when busy
# the policy's own server, where the user simulator's faults are tested: no fault there, so its timeout only ends a
# hang; a short one would abort episodes of a loaded machine as engine errors the test does not expect
UNFAULTED_POLICY = {**FAST_RETRIES, "timeout_s": 300.0}
USER_CLIENTS = ("litellm", "async")  # tau2's UserSimulator over litellm; the async client (user_client.py)
USER_EPISODES = 100  # each makes one or two litellm calls, the costly part (bench/faults.py runs 200 per row)


@pytest.fixture
def server(tiny_engine: Any) -> Iterator[LoopbackServer]:
    with LoopbackServer(tiny_engine, hang_s=HANG_S) as s:
        yield s


@pytest.fixture
def policy_server(tiny_engine: Any) -> Iterator[LoopbackServer]:
    with LoopbackServer(tiny_engine) as s:
        yield s


def _records(trajectories: list[Trajectory]) -> list[dict]:
    """Episode records as the Pass@K evaluator writes them."""
    from tau2_rl_pipeline.eval.runner import episode_record

    return [episode_record(t, sample=i, seed=0, started_at="", ended_at="", cfg=Tau2Config())
            for i, t in enumerate(trajectories)]


def _check_nothing_aborted_is_scored(trajectories: list[Trajectory], reason: str) -> Any:
    tally = faults.Tally.of(trajectories)
    assert tally.completed + tally.truncated + tally.aborted == tally.episodes == len(trajectories)
    assert tally.scored_aborted == 0
    for t in trajectories:
        assert (t.reward_info is None) == (t.status == ABORTED)
        if t.status == ABORTED:
            assert t.termination_reason == reason and t.error and t.reward == 0.0
    summary = summarize(_records(trajectories), k_values=[1], n_boot=10)
    assert summary["aborted_episodes"] == tally.aborted
    assert summary["overall"]["n_episodes"] == tally.completed + tally.truncated
    return tally


# ---------------------------------------------------------------------------------------------------------------
# The proxy does what it says


@pytest.mark.parametrize("kind,expected", [
    ("reset", httpx.RemoteProtocolError), ("drop", httpx.RemoteProtocolError),
    ("error_500", 500), ("malformed", 200), ("slow", httpx.ReadTimeout)])
def test_each_fault_reaches_the_client_as_that_failure(server: LoopbackServer, kind: str, expected: Any) -> None:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}, "return_logprob": True}
    with faults.FaultProxy(server, rate=0.0) as proxy, httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
        proxy.fail_next(1, kind)
        if isinstance(expected, int):
            answer = client.post(proxy.base_url + "/generate", json=body)
            assert answer.status_code == expected and "meta_info" not in answer.text
        else:
            with pytest.raises(expected):
                client.post(proxy.base_url + "/generate", json=body)
        # the next request goes through (1 or 2 tokens: the shared engine may sample its end-of-turn token first)
        assert client.post(proxy.base_url + "/generate", json=body).json()["meta_info"]["completion_tokens"] in (1, 2)
        assert proxy.injected == {kind: 1}


def test_refused_is_a_restart_whose_connections_the_kernel_refuses(server: LoopbackServer) -> None:
    # down for far longer than the two requests take on any machine (the proxy's end does not wait for it)
    with faults.FaultProxy(server, rate=0.0, restart_s=600.0) as proxy, \
            httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
        proxy.fail_next(1, "refused")
        with pytest.raises(httpx.RemoteProtocolError):  # the request in flight dies with the server
            client.get(proxy.base_url + "/health")
        with pytest.raises(httpx.ConnectError):  # then nothing listens for restart_s
            client.get(proxy.base_url + "/health")


@pytest.mark.parametrize("kind", faults.FAULT_KINDS)
def test_the_policy_engine_retries_through_each_fault(server: LoopbackServer, kind: str) -> None:
    """The timeout is scaled to the machine as it is: ten times what the same request took just before, without
    a fault (at least ONE_REQUEST's), so the answer after two faults always comes within it."""
    async def go(url: str, timeout_s: float) -> tuple[Any, float]:
        # backoff (0.1-0.2 s, then 0.2-0.4 s) well over the proxy's restart (1 ms): a retry that came while its
        # listener was still down would fail uncounted, and the third attempt would meet the second queued fault
        engine = SGLangEngine(url, max_retries=2, **{**ONE_REQUEST, "backoff_base_s": 0.2, "backoff_max_s": 0.4,
                                                     "timeout_s": timeout_s})
        started = time.monotonic()
        try:
            return await engine.generate([5, 6, 7], SamplingParams(max_new_tokens=3)), time.monotonic() - started
        finally:
            await engine.aclose()

    with faults.FaultProxy(server, rate=0.0, restart_s=0.001) as proxy:
        _, took = asyncio.run(go(proxy.base_url, HANG_S))  # the calibration: no fault queued yet
        proxy.fail_next(2, kind)
        result, _ = asyncio.run(go(proxy.base_url, max(ONE_REQUEST["timeout_s"], 10 * took)))
        assert 1 <= len(result.output_ids) <= 3
        assert proxy.injected == {kind: 2}


# ---------------------------------------------------------------------------------------------------------------
# 200 episodes at a 20% fault rate


def test_policy_server_faults_end_each_episode_completed_or_aborted_after_retries(server: LoopbackServer) -> None:
    cfg = Tau2Config.from_env({})
    with faults.FaultProxy(server, rate=0.2, seed=8) as proxy:
        trajectories = asyncio.run(faults.policy_fault_episodes(
            server, proxy.base_url, TASKS, 200, cfg, engine_kwargs={"max_retries": 1, **FAST_RETRIES}))
    assert set(proxy.injected) == set(faults.FAULT_KINDS)
    tally = _check_nothing_aborted_is_scored(trajectories, "engine_error")
    assert tally.completed > 0 and tally.truncated > 0
    for t in trajectories:
        if t.status == ABORTED:
            assert "failed after 2 attempts" in t.error and t.error.count("attempts") == 1, t.error  # retried, then given up


@pytest.mark.parametrize("client", USER_CLIENTS)
def test_user_simulator_faults_end_each_episode_completed_or_aborted_unscored(server: LoopbackServer,
                                                                             policy_server: LoopbackServer,
                                                                             client: str) -> None:
    cfg = Tau2Config.from_env(USER_ENV)
    with faults.FaultProxy(server, rate=0.2, seed=9) as proxy:
        trajectories = asyncio.run(faults.user_fault_episodes(
            policy_server, server, proxy.base_url, TASKS, USER_EPISODES, cfg, engine_kwargs=UNFAULTED_POLICY,
            client=client))
    assert set(proxy.injected) == set(faults.FAULT_KINDS)
    tally = _check_nothing_aborted_is_scored(trajectories, "user_simulator_error")
    assert tally.completed > 0
    assert all(t.error.startswith("user simulator failed:") for t in trajectories if t.status == ABORTED)


@pytest.mark.parametrize("client", USER_CLIENTS)
@pytest.mark.parametrize("kind", faults.FAULT_KINDS)
def test_the_user_simulator_retries_through_each_fault(server: LoopbackServer, policy_server: LoopbackServer,
                                                       kind: str, client: str) -> None:
    """Two failures in a row of the user simulator's first call are retried; the episode goes on."""
    cfg = Tau2Config.from_env(USER_ENV)
    with faults.FaultProxy(server, rate=0.0, restart_s=0.001) as proxy:
        proxy.fail_next(2, kind)
        (traj,) = asyncio.run(faults.user_fault_episodes(policy_server, server, proxy.base_url, TASKS[:1], 1, cfg,
                                                         engine_kwargs=UNFAULTED_POLICY, client=client))
        assert proxy.injected == {kind: 2}
        assert traj.status != ABORTED, traj.error
        assert proxy.requests >= 3  # two failed attempts, then one answered


@pytest.mark.parametrize("client", USER_CLIENTS)
def test_a_user_simulator_that_never_answers_aborts_the_episode_unscored(server: LoopbackServer,
                                                                        policy_server: LoopbackServer,
                                                                        client: str) -> None:
    cfg = Tau2Config.from_env(USER_ENV)
    with faults.FaultProxy(server, rate=0.0) as proxy:
        proxy.fail_next(50, "error_500")
        (traj,) = asyncio.run(faults.user_fault_episodes(policy_server, server, proxy.base_url, TASKS[:1], 1, cfg,
                                                         engine_kwargs=UNFAULTED_POLICY, client=client))
    assert traj.status == ABORTED and traj.reward_info is None
    assert traj.termination_reason == "user_simulator_error" and "injected fault" in traj.error
    assert proxy.injected["error_500"] >= 3  # retried before giving up


# ---------------------------------------------------------------------------------------------------------------
# SIGKILL at random moments, then resume
#
# The evaluator and the RFT sampler (which runs the evaluator in its own process) are killed 20 times, alternately,
# while they write one episode file; each run starts where the last one died. To keep 20 runs in seconds, each is
# forked from a launcher that has already imported the package (a fresh process running the CLI's real `main`, from
# argument parsing on). The curriculum's own kill-while-reading test is tests/test_curriculum.py; here its state
# is killed 20 times too and compared with an uninterrupted run.

KILLS = 20
_LAUNCHER = r"""
import json, os, sys
import tau2_rl_pipeline
from tau2_rl_pipeline.eval import eval_passk
from tau2_rl_pipeline.selection import rft
from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(sys.argv[1])  # imports what loading the checkpoint's tokenizer needs, once
MAINS = {"eval": eval_passk.main, "rft": rft.main}
for line in sys.stdin:
    name, argv, log = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:  # the run: output to its log, exit with main's code
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = 1
        try:
            code = MAINS[name](argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(pid, flush=True)
    print(os.waitpid(pid, 0)[1], flush=True)
"""


class Launcher:
    """Starts CLI runs as forks of one pre-imported process; `start` returns the run's pid, `wait` its status."""

    def __init__(self, log: Path, tokenizer_dir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TAU2_")}
        env.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(tokenizer_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def start(self, name: str, argv: list[str]) -> int:
        self.proc.stdin.write(json.dumps([name, argv, str(self.log)]) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def wait(self) -> int:
        """The run's exit code, or minus the signal that ended it."""
        status = int(self.proc.stdout.readline())
        return os.waitstatus_to_exitcode(status)

    def run(self, name: str, argv: list[str]) -> int:
        self.start(name, argv)
        return self.wait()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _finished_lines(path: Path) -> int:
    return path.read_bytes().count(b"}\n") if path.exists() else 0


def _outcome(rec: dict) -> tuple:
    """What an episode produced, without wall-clock fields."""
    return (rec["status"], rec["reward"], rec["partial"], rec["termination_reason"], rec["turns"], rec["seed"],
            rec["tokens"], [m.get("content") for m in rec["messages"]])


def test_evaluator_and_rft_sampler_killed_20_times_resume_to_an_uninterrupted_run(tiny_engine: Any,
                                                                                  tiny_small_dir: Path,
                                                                                  tmp_path: Path) -> None:
    from tau2_rl_pipeline.eval.episodes_file import episode_key, parse_lines, read_episodes

    with LoopbackServer(tiny_engine, latency_s=0.03) as server:
        shared = ["--backend", "sglang", "--hf-checkpoint", str(tiny_small_dir), "--user", "scripted",
                  "--top-p", "1.0", "--top-k", "-1", "--max-new-tokens", "8", "--max-turns", "2", "--seed", "11",
                  "--concurrency", "2"]
        sample = ["--domains", "mock", "--task-split", "base", "--num-samples", "3", "--temperature", "1.0"]

        def rft_argv(out: Path) -> list[str]:
            return [*sample, "--sglang-url", server.base_url, "--out", str(out), *shared]

        def eval_argv(out: Path) -> list[str]:
            return [*sample, "--sglang-url", server.base_url, "--output", str(out) + ".eval.json", *shared]

        launcher = Launcher(tmp_path / "runs.log", tiny_small_dir)
        try:
            reference = tmp_path / "reference" / "rows.jsonl"
            assert launcher.run("rft", rft_argv(reference)) == 0, (tmp_path / "runs.log").read_text()[-3000:]
            out = tmp_path / "killed" / "rows.jsonl"
            episodes = Path(str(out) + ".eval.json.episodes.jsonl")
            rng = random.Random(20)
            for i in range(KILLS):
                name, argv = ("rft", rft_argv(out)) if i % 2 == 0 else ("eval", eval_argv(out))
                before = _finished_lines(episodes)
                pid = launcher.start(name, argv)
                grow = rng.randint(0, 1)  # kill after 0-1 more episodes, then up to 40 ms later (mid-write too)
                while _finished_lines(episodes) < before + grow:
                    time.sleep(0.002)
                time.sleep(rng.uniform(0.0, 0.04))
                os.kill(pid, signal.SIGKILL)
                assert launcher.wait() == -signal.SIGKILL, f"run {i} ended before its kill"
                parse_lines(episodes.read_bytes() if episodes.exists() else b"")  # a torn tail at most
            assert not out.exists()
            assert launcher.run("rft", rft_argv(out)) == 0, (tmp_path / "runs.log").read_text()[-3000:]
        finally:
            launcher.close()
    lines = [json.loads(line) for line in episodes.read_text().splitlines()[1:]]  # every line whole JSON
    assert len(lines) == len({episode_key(r) for r in lines}) == 9 * 3  # nothing lost, nothing twice
    expected = read_episodes(Path(str(reference) + ".eval.json.episodes.jsonl"))
    got = read_episodes(episodes)
    assert {k: _outcome(r) for k, r in got.items()} == {k: _outcome(r) for k, r in expected.items()}
    assert out.read_text() == reference.read_text()  # the same RFT rows, in the same order
    summary = json.loads(Path(str(out) + ".eval.json").read_text())
    assert summary["metrics"] == json.loads(Path(str(reference) + ".eval.json").read_text())["metrics"]


_CURRICULUM_WRITER = r"""
import sys
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.curriculum import CurriculumTracker
path, total = sys.argv[1], int(sys.argv[2])
tracker = CurriculumTracker.restore(Tau2Config(), path)
for i in range(tracker.groups_seen, total):  # event i: a fixed task and outcome, then a save
    tracker.record(f"mock/task_{i % 7}", i % 3 == 0)
    tracker.count_groups(1, i % 2)
    tracker.save(path)
"""


CURRICULUM_EVENTS = 3000


def _curriculum_reference() -> Any:
    from tau2_rl_pipeline.learning.curriculum import CurriculumTracker

    reference = CurriculumTracker(Tau2Config())
    for i in range(CURRICULUM_EVENTS):
        reference.record(f"mock/task_{i % 7}", i % 3 == 0)
        reference.count_groups(1, i % 2)
    return reference


@pytest.fixture(scope="module")
def killed_curriculum(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    """The curriculum writer killed 20 times mid-run, each run restoring the last one's state, then run to the end;
    returns the state file and the events saved at each kill."""
    from tau2_rl_pipeline.learning.curriculum import CurriculumTracker

    path = tmp_path_factory.mktemp("curriculum") / "curriculum_state.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = [sys.executable, "-c", _CURRICULUM_WRITER, str(path), str(CURRICULUM_EVENTS)]
    rng = random.Random(21)
    seen = []
    for _ in range(KILLS):
        before = path.stat().st_mtime_ns if path.exists() else None
        proc = subprocess.Popen(writer, env=env)
        while (path.stat().st_mtime_ns if path.exists() else None) == before:  # until its first save
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.1))  # then somewhere in the saves, mid-write included
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        state = CurriculumTracker.load(path, Tau2Config())  # whole and consistent after every kill
        assert sum(state.attempts.values()) == state.groups_seen
        seen.append(state.groups_seen)
    subprocess.run(writer, env=env, check=True)
    return path, seen


def test_curriculum_state_killed_20_times_resumes_to_an_uninterrupted_run(killed_curriculum) -> None:
    from tau2_rl_pipeline.learning.curriculum import CurriculumTracker

    path, seen = killed_curriculum
    assert seen == sorted(seen) and 0 < seen[-1] < CURRICULUM_EVENTS  # progress across kills, not yet done
    assert CurriculumTracker.load(path, Tau2Config()).to_dict() == _curriculum_reference().to_dict()


def test_killed_curriculum_saves_leave_at_most_one_temp_file(killed_curriculum) -> None:
    path, _ = killed_curriculum
    assert len(list(path.parent.glob(f".{path.name}*.tmp"))) <= 1
