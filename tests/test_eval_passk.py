"""The Pass@K evaluator end to end: real tau2 domains, a tiny random Qwen3 (in process or behind the loopback
SGLang look-alike), the offline scripted user; every output, tau2's own loader and metrics, SIGKILL + resume,
one-line setup errors, secrets.

Runs are small (mock: 9 tasks x 2 samples, 12 new tokens, 3 turns): with a random model most episodes end
truncated; the tau2-agreement test adds a scripted policy (the engine contract only) for real successes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from support.loopback_server import LoopbackServer
from task_sample import representative
from tau2.data_model.simulation import Results
from tau2.metrics.agent_metrics import compute_metrics

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import V1, needs_judge
from tau2_rl_pipeline.benchmark.users import make_user_factory, opening_request
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.eval.args import build_parser, default_output
from tau2_rl_pipeline.eval.episodes_file import (
    EpisodesFile,
    EpisodesFileError,
    episode_key,
    parse_lines,
    pick_records,
    read_episodes,
    redact,
    secret_values,
)
from tau2_rl_pipeline.eval.eval_passk import main
from tau2_rl_pipeline.eval.runner import episode_seed, run_episodes
from tau2_rl_pipeline.eval.tau2_results import results_info, tau2_results
from tau2_rl_pipeline.metrics import summarize
from tau2_rl_pipeline.rollout.engines import GenerateResult, SamplingParams
from tau2_rl_pipeline.rollout.episode_loop import turn_seed

REPO_ROOT = Path(__file__).resolve().parents[1]
MOCK_IDS = [t.id for t in load_tasks("mock", "base")]
N_MOCK = len(MOCK_IDS)  # 9 on tau2 26.3, 10 on 1.0.1
SMALL = ["--user", "scripted", "--domains", "mock", "--task-split", "base", "--num-samples", "2",
         "--max-new-tokens", "12", "--max-turns", "3", "--temperature", "1.0", "--top-p", "1.0", "--top-k", "-1"]
SECRET = "sk-planted-SECRET-0123456789"
BENCH = {"tau2_version": "26.3", "task_set_hash": "0123456789abcdef"}


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def outputs(summary: Path, domains: list[str]) -> dict[str, Path]:
    stem = summary.with_suffix("")
    return {"summary": summary, "episodes": summary.with_name(summary.name + ".episodes.jsonl"),
            "chart": stem.with_name(stem.name + ".png"),
            **{f"tau2_{d}": stem.with_name(f"{stem.name}.{d}.tau2.json") for d in domains}}


def episode_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def outcome(rec: dict) -> tuple:
    """What an episode produced, without wall-clock fields (timestamps, timings)."""
    return (rec["status"], rec["reward"], rec["partial"], rec["termination_reason"], rec["turns"], rec["seed"],
            rec["tokens"], rec["parse_errors"], [m.get("content") for m in rec["messages"]])


@pytest.fixture(scope="module")
def mock_run(tiny_small_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One complete local-backend run on the mock domain (all its tasks x 2 samples)."""
    summary = tmp_path_factory.mktemp("mock_run") / "run.json"
    rc, out, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--output", str(summary))
    assert rc == 0, err
    return {"paths": outputs(summary, ["mock"]), "stdout": out, "stderr": err}


# ---------------------------------------------------------------------------------------------------
# End to end, local backend

def test_mock_run_writes_every_output(mock_run: dict) -> None:
    paths = mock_run["paths"]
    summary = json.loads(paths["summary"].read_text())
    mock = summary["metrics"]["domains"]["mock"]
    assert (mock["n_tasks"], mock["n_episodes"], mock["k_values"]) == (N_MOCK, 2 * N_MOCK, [1, 2])
    assert {"pass@1", "pass@2", "pass^1", "pass^2", "mean_partial"} <= set(mock["metrics"])
    assert summary["metrics"]["overall"]["micro"]["pass^2"]["n_episodes"] == 2 * N_MOCK
    assert set(mock["failures"]["categories"]) >= {"parse_errors", "premature_stop", "truncated", "aborted"}
    assert summary["settings"]["user"] == "scripted" and summary["episodes"]["planned"] == 2 * N_MOCK
    records = read_episodes(paths["episodes"])
    assert set(records) == {("mock", t, s) for t in MOCK_IDS for s in range(2)}
    rec = records[("mock", MOCK_IDS[0], 0)]
    assert rec["seed"] == episode_seed(300, "mock", MOCK_IDS[0], 0)
    assert rec["tokens"]["prompt"] > 0 and "prompt_ids" not in rec and rec["messages"]
    assert paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # behaviour monitors: per record, and their rates in the summary and on the terminal
    scored = [r for r in records.values() if r["status"] != "aborted"]
    history = {t.id: len(t.initial_state.message_history or []) if t.initial_state else 0
               for t in load_tasks("mock", "base")}
    assert any(history.values())  # mock's history tasks open with a create_task call
    for r in scored:  # tool calls counted again from the recorded messages the policy wrote (history left out)
        calls = [c for m in r["messages"][history[r["task_id"]]:] if m["role"] == "assistant"
                 for c in m.get("tool_calls") or [] if c["name"] != "invalid_tool_call"]
        assert r["monitors"]["tool_calls"] == len(calls)
        said = [m for m in r["messages"] if m["role"] == "user" and not m.get("tool_calls")]
        assert r["user_monitors"]["user_turns"] == len(said) >= 1  # the user simulator's side, per record
    users = summary["user_behaviour"]["mock"]  # and its rates per domain
    assert users["episodes"] == len(scored)
    assert users["user_turns_mean"] == pytest.approx(sum(r["user_monitors"]["user_turns"] for r in scored) / len(scored))
    behaviour = summary["behaviour"]["mock"]
    assert behaviour["episodes"] == len(scored)
    assert behaviour["tool_calls_mean"] == pytest.approx(sum(r["monitors"]["tool_calls"] for r in scored) / len(scored))
    assert behaviour["limit_ended_share"] == pytest.approx(
        sum(r["termination_reason"] not in ("agent_stop", "user_stop") for r in scored) / len(scored))
    assert "Behaviour monitors" in mock_run["stdout"]
    assert "pass^2" in mock_run["stdout"] and f"T={N_MOCK} tasks, E={2 * N_MOCK} eps" in mock_run["stdout"]
    assert "Failure taxonomy" in mock_run["stdout"]
    n = 2 * N_MOCK
    assert re.search(rf"{n}/{n} +pass \d+/{n} = \d\.\d{{3}}, aborted 0", mock_run["stderr"])  # the progress bar


def test_results_file_loads_with_tau2_and_its_metrics_agree(mock_run: dict) -> None:
    paths = mock_run["paths"]
    results = Results.load(paths["tau2_mock"])
    summary = json.loads(paths["summary"].read_text())
    assert len(results.simulations) == 2 * N_MOCK and {t.id for t in results.tasks} == set(MOCK_IDS)
    assert results.info.num_trials == 2 and results.info.environment_info.domain_name == "mock"
    theirs = compute_metrics(results)
    ours = summary["metrics"]["domains"]["mock"]["metrics"]
    assert set(theirs.pass_hat_ks) == {1, 2}
    for k, value in theirs.pass_hat_ks.items():
        assert ours[f"pass^{k}"]["value"] == pytest.approx(value, abs=1e-12)


def test_one_telecom_task(tiny_small_dir: Path, tmp_path: Path) -> None:
    task_id = load_tasks("telecom", "test")[0].id
    summary = tmp_path / "telecom.json"
    rc, _, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), "--user", "scripted",
                         "--domains", "telecom", "--task-split", "test", "--task-ids", task_id, "--num-samples", "1",
                         "--max-new-tokens", "4", "--max-turns", "1", "--output", str(summary))
    assert rc == 0, err
    paths = outputs(summary, ["telecom"])
    assert json.loads(summary.read_text())["metrics"]["domains"]["telecom"]["n_tasks"] == 1
    assert list(read_episodes(paths["episodes"])) == [("telecom", task_id, 0)]
    results = Results.load(paths["tau2_telecom"])
    assert [s.task_id for s in results.simulations] == [task_id] and paths["chart"].is_file()


def test_a_resumed_run_retries_aborted_episodes_and_keeps_one_line_each(mock_run: dict, tiny_small_dir: Path,
                                                                         tmp_path: Path) -> None:
    src = mock_run["paths"]
    summary = tmp_path / "run.json"
    paths = outputs(summary, ["mock"])
    lines = paths["episodes"]
    shutil.copy(src["episodes"], lines)
    header, *rest = lines.read_text().splitlines()
    victim = json.loads(rest[3])
    victim.update(status="aborted", termination_reason="engine_error", error="planted")
    # the victim's finished line replaced by an aborted one (an engine failure in an earlier run)
    kept = [r for r in rest if episode_key(json.loads(r)) != episode_key(victim)]
    lines.write_text("\n".join([header, *kept, json.dumps(victim)]) + "\n")
    rc, _, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--output", str(summary))
    assert rc == 0, err
    assert f"resuming {2 * N_MOCK - 1}/{2 * N_MOCK} episodes from {lines}" in err  # the aborted one runs again
    result = json.loads(summary.read_text())
    assert result["episodes"]["ran_this_invocation"] == 1 and result["episodes"]["aborted"] == []
    again = episode_lines(lines)
    assert len(again) == 2 * N_MOCK and len({episode_key(r) for r in again}) == 2 * N_MOCK
    original = read_episodes(src["episodes"])
    assert outcome(read_episodes(lines)[episode_key(victim)]) == outcome(original[episode_key(victim)])
    assert result["metrics"] == json.loads(src["summary"].read_text())["metrics"]


def test_no_resume_starts_over(mock_run: dict, tiny_small_dir: Path, tmp_path: Path) -> None:
    summary = tmp_path / "run.json"
    shutil.copy(mock_run["paths"]["episodes"], outputs(summary, ["mock"])["episodes"])
    rc, _, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--task-ids", MOCK_IDS[0],
                         "--num-samples", "1", "--no-resume", "--output", str(summary))
    assert rc == 0, err
    assert json.loads(summary.read_text())["episodes"]["ran_this_invocation"] == 1
    assert list(read_episodes(outputs(summary, ["mock"])["episodes"])) == [("mock", MOCK_IDS[0], 0)]


def test_repeated_runs_report_mean_and_sd_beside_the_pooled_estimate(mock_run: dict, tiny_small_dir: Path,
                                                                     tmp_path: Path) -> None:
    """--runs 3 --num-samples 1: run r is sample r, with its own seed. The mock run's samples 0 and 1 are runs 0
    and 1 (same settings, same seeds: resumed, not rerun); run 2 is new."""
    summary = tmp_path / "run.json"
    shutil.copy(mock_run["paths"]["episodes"], outputs(summary, ["mock"])["episodes"])
    ids = MOCK_IDS
    rc, out, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--num-samples", "1",
                           "--runs", "3", "--output", str(summary))
    assert rc == 0, err
    result = json.loads(summary.read_text())
    assert result["episodes"]["ran_this_invocation"] == len(ids) and result["settings"]["runs"] == 3
    records = read_episodes(outputs(summary, ["mock"])["episodes"])
    assert records[("mock", ids[0], 2)]["seed"] == episode_seed(300, "mock", ids[0], 2)
    assert result["metrics"]["domains"]["mock"]["k_values"] == [1]  # pooled over 3 episodes, k <= --num-samples
    spread = result["runs"]["domains"]["mock"]["pass@1"]
    by_run = [sum(records[("mock", t, r)]["reward"] == 1.0 for t in ids) / len(ids) for r in range(3)]
    assert spread["values"] == pytest.approx(by_run) and spread["mean"] == pytest.approx(sum(by_run) / 3)
    assert "Over 3 of 3 runs of 1 samples/task (mean +- sd over runs" in out


def test_compare_flag_pairs_this_run_with_a_baseline_or_refuses_before_running(mock_run: dict, tiny_small_dir: Path,
                                                                                  tmp_path: Path) -> None:
    baseline = mock_run["paths"]["summary"]
    summary = tmp_path / "again.json"
    shutil.copy(mock_run["paths"]["episodes"], outputs(summary, ["mock"])["episodes"])  # the same episodes again
    rc, out, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--compare", str(baseline),
                           "--output", str(summary))
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith(f"again vs {baseline.stem} (mock, {N_MOCK} paired tasks)"))
    assert "+0.000" in line and "p=1.000" in line and "NOT significant" in line
    other = tmp_path / "hot.json"
    rc, out, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--temperature", "0.5",
                           "--compare", str(baseline), "--output", str(other))
    assert rc == 2 and err.count("\n") == 1 and "differ in sampling.temperature (1.0 vs 0.5)" in err
    assert not list(tmp_path.glob("hot*"))  # refused before anything ran or was written


def test_resuming_with_other_settings_is_refused(mock_run: dict, tiny_small_dir: Path, tmp_path: Path) -> None:
    summary = tmp_path / "run.json"
    episodes = outputs(summary, ["mock"])["episodes"]
    shutil.copy(mock_run["paths"]["episodes"], episodes)
    before = episodes.read_bytes()
    rc, _, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--temperature", "0.5",
                         "--output", str(summary))
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "other settings (sampling)" in err and "--no-resume" in err
    assert episodes.read_bytes() == before and not summary.exists()


# ---------------------------------------------------------------------------------------------------
# SGLang backend against the loopback server: the request contract, concurrency, SIGKILL and resume

def _poll_episodes(path: Path, proc: subprocess.Popen, least: int, timeout_s: float = 400.0) -> int:
    """Until the run has written `least` episodes; `timeout_s` only bounds a run that never does (a fresh
    interpreter's imports and three episodes, on a loaded machine well within it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            n = sum(1 for line in path.read_bytes().split(b"\n")[1:] if line.endswith(b"}"))
            if n >= least:
                return n
        time.sleep(0.01)
    raise AssertionError(f"the run wrote fewer than {least} episodes (exit code {proc.poll()})")


def test_sigkill_then_resume_equals_an_uninterrupted_run(tiny_engine, tiny_small_dir: Path, tmp_path: Path) -> None:
    with LoopbackServer(tiny_engine, latency_s=0.1) as server:
        base = ["--backend", "sglang", "--sglang-url", server.base_url, "--hf-checkpoint", str(tiny_small_dir),
                *SMALL, "--concurrency", "3", "--seed", "7"]
        full = tmp_path / "full" / "run.json"
        rc, _, err = run_cli(*base, "--output", str(full))
        assert rc == 0, err
        assert 2 <= server.max_concurrent <= 3  # --concurrency bounds the episodes (hence requests) in flight
        generate = [body for path, body in server.requests if path == "/generate"]
        params = [b["sampling_params"] for b in generate]
        assert {(p["temperature"], p["top_p"], p["top_k"]) for p in params} == {(1.0, 1.0, -1)}
        tok = tiny_engine.tokenizer
        stops = [tok.eos_token_id, tok.get_vocab()["<|endoftext|>"]]
        assert all(p["max_new_tokens"] <= 12 and p["stop_token_ids"] == stops for p in params)
        records = read_episodes(outputs(full, ["mock"])["episodes"])
        assert all(r["seed"] == episode_seed(7, *k) for k, r in records.items())
        # every request carries a seed derived from its episode's and its turn (episodes the user ends before the
        # agent speaks send none)
        assert {p["sampling_seed"] for p in params} == {
            turn_seed(r["seed"], t) for r in records.values() for t in range(r["turns"])}

        killed = tmp_path / "killed" / "run.json"
        episodes = outputs(killed, ["mock"])["episodes"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TAU2_")}
        with open(tmp_path / "killed.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "tau2_rl_pipeline.eval.eval_passk", *base, "--output", str(killed)],
                                    cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                _poll_episodes(episodes, proc, least=3)
                proc.send_signal(signal.SIGKILL)
            finally:
                proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        _, before, _ = parse_lines(episodes.read_bytes())
        assert 3 <= len(before) < 2 * N_MOCK and not killed.exists()  # killed mid-way, no summary

        rc, _, err = run_cli(*base, "--output", str(killed))
        assert rc == 0, err
    resumed = json.loads(killed.read_text())
    assert resumed["episodes"]["ran_this_invocation"] == 2 * N_MOCK - len(pick_records(before))
    lines = episode_lines(episodes)
    assert len(lines) == len({episode_key(r) for r in lines}) == 2 * N_MOCK  # nothing lost, nothing twice
    reference = read_episodes(outputs(full, ["mock"])["episodes"])
    assert set(read_episodes(episodes)) == set(reference)
    assert {k: outcome(r) for k, r in read_episodes(episodes).items()} == {k: outcome(r) for k, r in reference.items()}
    assert resumed["metrics"] == json.loads(full.read_text())["metrics"]


# Every mock task; two retail test tasks, on tau2 1.0.1 the first judged (tests/task_sample.py).
RETAIL_TWO = representative(load_tasks("retail", "test"), 2)
TWO_PROCS_CASES = {"mock": SMALL, "retail": [*SMALL[:2], "--domains", "retail", "--task-split", "test",
                                             "--task-ids", ",".join(t.id for t in RETAIL_TWO), *SMALL[6:]]}


def closes_judged_tasks(tokenizer):
    """A responder: on a judged task the policy answers and the scripted user stops, so tau2 evaluates the episode
    and its NL assertions go to the loopback judge (a tiny model's turns rarely end before max_new_tokens)."""
    openings = [opening_request(t) for t in RETAIL_TWO if needs_judge(t)]
    done = tokenizer.encode("Your order is updated." + tokenizer.eos_token, add_special_tokens=False)
    return lambda path, ids: done if any(o in tokenizer.decode(ids) for o in openings) else None


@pytest.mark.parametrize("domain", list(TWO_PROCS_CASES))
def test_two_rollout_processes_write_the_run_of_one(domain: str, tiny_engine, tiny_small_dir: Path,
                                                    tmp_path: Path) -> None:
    with LoopbackServer(tiny_engine) as server:
        server.responder = closes_judged_tasks(tiny_engine.tokenizer)
        base = ["--backend", "sglang", "--sglang-url", server.base_url, "--hf-checkpoint", str(tiny_small_dir),
                *TWO_PROCS_CASES[domain], "--concurrency", "4", "--seed", "7"]
        runs = {}
        for procs in ("1", "2"):
            runs[procs] = tmp_path / procs / "run.json"
            rc, _, err = run_cli(*base, "--procs", procs, "--output", str(runs[procs]))
            assert rc == 0, err
    one, two = (json.loads(runs[p].read_text()) for p in ("1", "2"))
    n = 2 * one["metrics"]["domains"][domain]["n_tasks"]
    assert n == 2 * (N_MOCK if domain == "mock" else 2) and two["episodes"]["ran_this_invocation"] == n
    assert two["settings"]["procs"] == 2 and two["benchmark"] == one["benchmark"]
    lines = episode_lines(outputs(runs["2"], [domain])["episodes"])
    assert len(lines) == len({episode_key(r) for r in lines}) == n  # one writer: every episode once
    assert ({k: outcome(r) for k, r in read_episodes(outputs(runs["2"], [domain])["episodes"]).items()}
            == {k: outcome(r) for k, r in read_episodes(outputs(runs["1"], [domain])["episodes"]).items()})
    assert two["metrics"] == one["metrics"]
    assert two["judge"] == one["judge"]  # NL-assertion judge calls and tokens, counted over both processes
    if V1 and domain == "retail":  # the judged task was judged in the child processes too, once per episode
        assert two["judge"]["usage_over_recorded_episodes"]["calls"] == 2


# ---------------------------------------------------------------------------------------------------
# tau2 agrees on real successes, and re-scores the results file from its messages

class ScriptedPolicy:
    """The engine contract, scripted: first turn a malformed tool call (a parse error the episode refuses), then
    a goodbye with ###STOP### when that turn's seed is even, or a reply cut at max_new_tokens when it is odd."""

    BAD_CALL = '<tool_call>{"name": "create_task", "arguments": </tool_call>'

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def generate(self, input_ids, sampling):
        if self.BAD_CALL not in self.tokenizer.decode(input_ids):
            text, finish = self.BAD_CALL, "stop"
        elif sampling.seed % 2 == 0:
            text, finish = "Thank you, goodbye. ###STOP###", "stop"
        else:
            text, finish = "Let me think about that for a while longer " * 8, "length"
        ids = self.tokenizer.encode(text + (self.tokenizer.eos_token if finish == "stop" else ""),
                                    add_special_tokens=False)
        ids = ids if finish == "stop" else ids[: sampling.max_new_tokens]
        return GenerateResult(ids, [-0.5] * len(ids), finish)


def test_tau2_metrics_and_rescoring_agree_with_ours(small_tokenizer) -> None:
    cfg = replace(Tau2Config.from_env({}), max_turns=3)
    seed = 3
    tasks = load_tasks("mock", "base")
    pending = [("mock", t, s) for t in tasks for s in range(4)]
    records: list[dict] = []
    asyncio.run(run_episodes(pending, engine=ScriptedPolicy(small_tokenizer), tokenizer=small_tokenizer,
                             user_factory=make_user_factory("scripted", cfg), sampling=SamplingParams(
                                 max_new_tokens=24), cfg=cfg, seed=seed, concurrency=4, on_done=records.append))
    metrics = summarize(records)
    mock = metrics["domains"]["mock"]
    wins = [r for r in records if r["reward"] == 1.0]
    assert wins and len(wins) < len(records) and mock["metrics"]["pass^1"]["value"] > 0
    # tau2's evaluator raises on this task when the agent stops without creating a task: scored 0, reason kept
    broken = [r for r in records
              if r["task_id"] == "create_task_1_with_env_assertions" and r["termination_reason"] == "agent_stop"]
    assert broken and all(r["status"] == "completed" and r["reward"] == 0.0
                          and "Task task_2 not found" in r["reward_info"]["info"]["evaluation_error"] for r in broken)
    assert mock["aborted_episodes"] == 0
    assert mock["failures"]["categories"]["parse_errors"]["episodes"] == sum(r["parse_errors"] > 0 for r in records) > 0

    settings = {"user": "scripted", "user_model": None, "user_llm_args": None, "model": "scripted-policy",
                "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 24},
                "max_steps": cfg.max_steps, "max_errors": cfg.max_errors, "seed": seed}
    results = tau2_results("mock", records, tasks, results_info("mock", settings, 4))
    reloaded = Results.model_validate_json(results.model_dump_json())
    assert len(reloaded.simulations) == len(records)
    theirs = compute_metrics(reloaded)
    assert theirs.avg_reward == pytest.approx(sum(r["reward"] for r in records) / len(records))
    assert set(theirs.pass_hat_ks) == set(mock["k_values"])
    for k, value in theirs.pass_hat_ks.items():
        assert mock["metrics"][f"pass^{k}"]["value"] == pytest.approx(value, abs=1e-12)

    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    def call_names(messages) -> list[str]:
        return [c["name"] if isinstance(c, dict) else c.name for m in messages
                for c in ((m.get("tool_calls") if isinstance(m, dict) else getattr(m, "tool_calls", None)) or [])]

    assert all("invalid_tool_call" in call_names(r["messages"]) for r in records if r["turns"])  # full trajectory
    by_id = {t.id: t for t in tasks}
    for sim in reloaded.simulations:  # what `tau2 evaluate-trajs` does: replay the messages, score again
        assert "invalid_tool_call" not in call_names(sim.messages)  # refused calls never ran: not replayed
        rescore = functools.partial(evaluate_simulation, sim, by_id[sim.task_id], EvaluationType.ALL,
                                    solo_mode=False, domain="mock")
        if (sim.reward_info.info or {}).get("evaluation_error"):
            with pytest.raises(ValueError, match="Task task_2 not found"):  # tau2's own mock quirk, as recorded
                rescore()
        else:
            assert rescore().reward == sim.reward_info.reward


def test_an_episode_that_raises_is_recorded_aborted_and_the_others_go_on(tiny_engine, small_tokenizer) -> None:
    cfg = replace(Tau2Config.from_env({}), max_turns=1)
    scripted = make_user_factory("scripted", cfg)

    def user_factory(task, environment):
        if task.id == MOCK_IDS[1]:
            raise ConnectionError("user simulator unreachable")
        return scripted(task, environment)

    records: list[dict] = []
    pending = [("mock", t, 0) for t in load_tasks("mock", "base")[:3]]
    asyncio.run(run_episodes(pending, engine=tiny_engine, tokenizer=small_tokenizer, user_factory=user_factory,
                             sampling=SamplingParams(max_new_tokens=4), cfg=cfg, seed=0, concurrency=3,
                             on_done=records.append))
    by_task = {r["task_id"]: r for r in records}
    assert len(records) == 3
    assert by_task[MOCK_IDS[1]]["status"] == "aborted"
    assert by_task[MOCK_IDS[1]]["error"] == "ConnectionError: user simulator unreachable"
    assert all(by_task[i]["status"] != "aborted" and by_task[i]["turns"] >= 1 for i in (MOCK_IDS[0], MOCK_IDS[2]))
    metrics = summarize(records)
    assert metrics["aborted_episodes"] == 1 and metrics["overall"]["n_episodes"] == 2


# ---------------------------------------------------------------------------------------------------
# Setup errors: one line, exit 2, nothing written

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["no_url", "unreachable_url", "no_api_key", "unknown_domain", "unknown_task",
                                  "unknown_split", "no_gpu", "bad_tokenizer", "not_a_hub_id", "procs_local",
                                  "procs_over_concurrency"])
def test_setup_errors_are_one_line_and_write_nothing(case: str, tiny_small_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "TAU2_USER_API_BASE", "TAU2_USER_MODEL"):
        monkeypatch.delenv(name, raising=False)
    model = str(tiny_small_dir)
    local = ["--backend", "local", "--model", model]
    argv, expect = {
        "no_url": (["--backend", "sglang", "--hf-checkpoint", model, *SMALL], "needs --sglang-url"),
        "unreachable_url": (["--backend", "sglang", "--sglang-url", f"http://127.0.0.1:{_free_port()}",
                             "--hf-checkpoint", model, *SMALL], "cannot reach the SGLang server"),
        "no_api_key": ([*local, *SMALL, "--user", "llm", "--user-model", "gpt-4.1"], "OPENAI_API_KEY"),
        "unknown_domain": ([*local, *SMALL, "--domains", "mock,bogus"], "unknown domain 'bogus'"),
        "unknown_task": ([*local, *SMALL, "--task-ids", "create_task_1,nope"], "unknown task id(s) 'nope'"),
        "unknown_split": ([*local, *SMALL, "--task-split", "test"], "unknown split 'test'"),
        "no_gpu": ([*local, *SMALL, "--device", "cuda"], "--device cuda"),
        "bad_tokenizer": ([*local, *SMALL, "--tokenizer", str(tmp_path)], "cannot load a tokenizer there"),
        "not_a_hub_id": (["--backend", "local", "--model", str(tmp_path / "nowhere"), *SMALL],
                         "no such directory, and not a hub repo id"),
        "procs_local": ([*local, *SMALL, "--procs", "2"], "--procs > 1 needs --backend sglang"),
        "procs_over_concurrency": ([*local, *SMALL, "--procs", "5", "--concurrency", "4"],
                                   "--procs must be between 1 and --concurrency (4), got 5"),
    }[case]
    if case == "no_gpu":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    out_dir = tmp_path / "out"
    rc, out, err = run_cli(*argv, "--output", str(out_dir / "run.json"))
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and expect in err, err
    assert out == "" and not out_dir.exists()


@pytest.mark.parametrize("where", ["a_folder", "under_a_file", "proc"])
def test_an_output_that_cannot_be_written_is_one_line(where: str, tiny_small_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    output, expect = {"a_folder": (tmp_path, "is a directory"),
                      "under_a_file": (tmp_path / "file" / "run.json", f"{tmp_path / 'file'} is a file, not a folder"),
                      "proc": (Path("/proc/tau2-eval-test/run.json"), "cannot write")}[where]
    rc, out, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), *SMALL, "--task-ids", MOCK_IDS[0],
                           "--num-samples", "1", "--output", str(output))
    assert rc == 2 and err.startswith(f"error: --output {output}") and err.count("\n") == 1 and expect in err, err


def test_the_default_output_is_one_per_checkpoint_domains_and_split() -> None:
    """Two evaluations with the defaults never share (and so never refuse) each other's files."""
    assert default_output("outputs/demo/sft", ["mock"], "base") == Path("outputs/eval/demo-sft.mock.base.json")
    assert default_output("Qwen/Qwen3-4B", ["airline", "retail"], "test") == Path(
        "outputs/eval/Qwen-Qwen3-4B.airline+retail.test.json")
    assert default_output("outputs/demo-airline/rft", ["airline"], "test") != default_output(
        "outputs/demo/rft", ["airline"], "test")
    assert build_parser().parse_args([]).output is None


def test_a_path_whose_folder_exists_is_no_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--model outputs/nope (a typo in a local path) says the folder has no such directory, not `hf download`."""
    from tau2_rl_pipeline.eval.backends import SetupError, resolve_checkpoint

    (tmp_path / "outputs" / "demo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SetupError, match=r"^--model outputs/nope: no such directory \(in outputs/: demo\)$"):
        resolve_checkpoint("outputs/nope", tokenizer_only=False, flag="--model")


def test_hub_ids_resolve_from_the_offline_cache_or_fail_in_one_line(tiny_small_dir: Path, tmp_path: Path) -> None:
    """A published name goes through huggingface-hub: offline, a cached snapshot is used, a missing one named."""
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    for f in tiny_small_dir.iterdir():
        shutil.copy(f, snapshot / f.name)
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("a" * 40)
    script = ("from tau2_rl_pipeline.eval.backends import SetupError, resolve_checkpoint\n"
              "print(resolve_checkpoint('acme/tiny', tokenizer_only=True, flag='--hf-checkpoint'))\n"
              "try:\n    resolve_checkpoint('acme/missing', tokenizer_only=True, flag='--hf-checkpoint')\n"
              "except SetupError as e:\n    print(e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    found, missing = proc.stdout.splitlines()
    assert Path(found) == snapshot
    assert missing.startswith("--hf-checkpoint acme/missing: not in the local Hugging Face cache")


# ---------------------------------------------------------------------------------------------------
# Secrets

def test_no_secret_reaches_any_output(tiny_small_dir: Path, tiny_engine, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLM user path (tau2's UserSimulator over litellm, served by the loopback server) with a planted key."""
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("HF_TOKEN", SECRET + "-hf")
    summary = tmp_path / "secret" / "run.json"
    with LoopbackServer(tiny_engine, default_max_tokens=8) as server:
        rc, out, err = run_cli("--backend", "local", "--model", str(tiny_small_dir), "--user", "llm",
                               "--user-model", "openai/tiny", "--user-api-base", server.base_url + "/v1",
                               "--domains", "mock", "--task-split", "base", "--task-ids", "create_task_1",
                               "--num-samples", "1", "--max-new-tokens", "8", "--max-turns", "2",
                               "--output", str(summary))
        chats = server.count("/v1/chat/completions")
    assert rc == 0, err
    assert chats >= 1  # the user really was the LLM simulator
    files = list(summary.parent.iterdir())
    assert len(files) == 4
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in out + err
    settings = json.loads(summary.read_text())["settings"]
    assert settings["user_model"] == "openai/tiny" and "api_key" not in settings["user_llm_args"]


def test_redaction_and_secret_names() -> None:
    env = {"OPENAI_API_KEY": "sk-a\"b\\c", "HF_TOKEN": "hf_xyz", "MAX_TOKENS_PER_GPU": "8192", "TAU2_SEED": "1"}
    assert secret_values(env) == ["sk-a\"b\\c", "hf_xyz"]
    line = json.dumps({"error": "bad key sk-a\"b\\c", "tok": "hf_xyz", "n": 8192})
    cleaned = redact(line, secret_values(env))
    assert json.loads(cleaned) == {"error": "bad key ***", "tok": "***", "n": 8192}


# ---------------------------------------------------------------------------------------------------
# The episode file: torn lines, corruption, supersession

def _rec(task_id: str, sample: int, status: str = "completed") -> dict:
    return {"domain": "mock", "task_id": task_id, "sample": sample, "status": status}


def test_parse_lines_cuts_a_torn_last_line_and_refuses_corruption() -> None:
    header = json.dumps({"header": {"format": 1, "settings": {}}}).encode() + b"\n"
    a, b = (json.dumps(_rec("t", s)).encode() + b"\n" for s in (0, 1))
    for torn in (b[:-1], b[:7], b[:7] + b"\n"):
        got_header, records, good = parse_lines(header + a + torn)
        assert got_header == {"format": 1, "settings": {}} and records == [_rec("t", 0)]
        assert good == len(header + a)
    with pytest.raises(EpisodesFileError, match="line 2 .* corrupt"):
        parse_lines(header + b[:7] + b"\n" + a)


def test_pick_records_prefers_the_last_finished_episode() -> None:
    recs = [_rec("t", 0, "aborted"), _rec("t", 0), _rec("t", 0, "aborted"), _rec("u", 0, "aborted"),
            {**_rec("u", 0, "aborted"), "error": "later"}]
    picked = pick_records(recs)
    assert picked[("mock", "t", 0)]["status"] == "completed" and picked[("mock", "u", 0)]["error"] == "later"


def _one_episode_file(path: Path) -> None:
    """An episodes file of settings {"seed": 1} on BENCH holding one finished episode."""
    log = EpisodesFile(path, {"seed": 1}, benchmark=BENCH)
    log.open_for_append()
    log.append(_rec("t", 0))
    log.close()


def test_append_after_a_torn_tail_truncates_it_first(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    _one_episode_file(path)
    with open(path, "ab") as f:
        f.write(b'{"domain": "mock", "task_')  # a write cut by SIGKILL
    again = EpisodesFile(path, {"seed": 1}, benchmark=BENCH)
    assert list(again.load()) == [("mock", "t", 0)]
    again.open_for_append()
    again.append(_rec("t", 1))
    again.close()
    assert list(read_episodes(path)) == [("mock", "t", 0), ("mock", "t", 1)]
    with pytest.raises(EpisodesFileError, match=r"other settings \(seed\)"):
        EpisodesFile(path, {"seed": 2}, benchmark=BENCH).load()


def test_an_episode_file_of_another_tau2_version_or_task_set_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    _one_episode_file(path)
    other_version = {**BENCH, "tau2_version": "1.0.1"}
    with pytest.raises(EpisodesFileError, match=r"produced with tau2 26\.3, this run uses tau2 1\.0\.1") as e:
        EpisodesFile(path, {"seed": 1}, benchmark=other_version).load()
    assert "\n" not in str(e.value)
    with pytest.raises(EpisodesFileError, match="another task set"):
        EpisodesFile(path, {"seed": 1}, benchmark={**BENCH, "task_set_hash": "0" * 16}).load()
    assert list(EpisodesFile(path, {"seed": 1}, benchmark=dict(BENCH)).load()) == [("mock", "t", 0)]


def test_episode_seed_depends_on_every_part_of_the_key() -> None:
    seeds = {episode_seed(s, d, t, k) for s in (0, 1) for d in ("mock", "airline") for t in ("1", "2")
             for k in (0, 1)}
    assert len(seeds) == 16 and all(0 <= x < 2**31 for x in seeds)
    assert episode_seed(0, "mock", "1", 0) == episode_seed(0, "mock", "1", 0)


# ---------------------------------------------------------------------------------------------------
# public/: a reference run's chart (tau2-rl-pictures --reference)

def test_reference_chart_renders_from_a_summary(mock_run: dict, tmp_path: Path, capsys) -> None:
    from tau2_rl_pipeline.pictures.__main__ import main, reference_chart

    written = reference_chart(mock_run["paths"]["summary"], tmp_path / "public")
    assert [p.name for p in written] == ["passk_reference.png", "passk_reference.json"]
    assert (tmp_path / "public" / "passk_reference.png").read_bytes()[:4] == b"\x89PNG"
    copied = json.loads((tmp_path / "public" / "passk_reference.json").read_text())
    assert copied == json.loads(mock_run["paths"]["summary"].read_text())
    assert main(["--reference", str(tmp_path / "nope.json"), "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.json" in err and not (tmp_path / "other").exists()
