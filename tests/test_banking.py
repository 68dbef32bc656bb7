"""tau2-bench 1.0.1's banking_knowledge through the project's episode path, evaluator, Pass@K evaluator and
leaderboard export, offline: its environment is built per task with a retrieval variant (TAU2_RETRIEVAL_VARIANT,
default bm25), as tau2's own runner builds it, and tau2's evaluator gets the same variant.

"tau2's native path" below is tau2's own runner code: `TextRunConfig(domain, retrieval_config=...)`, its
`_build_env_kwargs(config, task)` and `build_environment`, and `evaluate_simulation(..., env_kwargs=...)` as its
batch runner calls it. On 26.3 the domain does not exist: a one-line refusal (tests/test_tasks.py).
tests/test_tau2_v1.py runs this file on 1.0.1.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.tau2_version import V1

pytestmark = pytest.mark.skipif(not V1, reason="tau2 1.0.1 only (tests/test_tau2_v1.py runs this file on 1.0.1)")

DOMAIN = "banking_knowledge"
# DB basis with agent writes; DB basis with the user's own tool calls; ACTION basis (the agent's calls are checked);
# DB x NL_ASSERTION, the one judged task (the session's loopback judge, tests/conftest.py, answers both paths)
TASKS = ["task_005", "task_017", "task_004", "task_102"]


def _task(task_id: str):
    from tau2_rl_pipeline.benchmark.tasks import get_task

    return get_task(DOMAIN, task_id)


def _native(task, variant: str = "bm25"):
    """tau2 1.0.1's runner: the env kwargs it derives for this task from a run config, and its environment."""
    from tau2.data_model.simulation import TextRunConfig
    from tau2.runner.build import _build_env_kwargs, build_environment

    kwargs = _build_env_kwargs(TextRunConfig(domain=DOMAIN, retrieval_config=variant), task)
    return kwargs, build_environment(DOMAIN, env_kwargs=kwargs)


def _native_evaluation(episode, kwargs):
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

    return evaluate_simulation(episode.simulation_run(), episode.task, EvaluationType.ALL, solo_mode=False,
                               domain=DOMAIN, env_kwargs=kwargs)


def _replay(task, keep=None):
    """The oracle replay (fast_env asked for: banking must fall back to tau2's own environments), with one BM25
    knowledge-base search first so the retrieval tool runs and tau2's strict replay re-checks its answer."""
    from tau2.data_model.simulation import TerminationReason

    from tau2_rl_pipeline.benchmark.episode import Episode
    from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions

    episode = Episode(DOMAIN, task, user=None, fast=True)
    episode.start()
    found = episode.agent_tool_call("KB_search", {"query": "credit card annual fee"})
    assert not found.error and len(found.content) > 100, found.content
    for i, action in enumerate(gold_actions(task)):
        if keep is None or keep(i):
            (episode.user_tool_call if action.requestor == "user" else episode.agent_tool_call)(
                action.name, action.arguments)
    episode.agent_says(final_message(task))
    episode.stop(TerminationReason.AGENT_STOP)
    return episode


def test_tasks_load_as_one_set_of_97_and_the_variant_is_part_of_the_benchmark_id() -> None:
    from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, load_tasks
    from tau2_rl_pipeline.benchmark.tau2_version import BenchmarkMismatch, benchmark_id, check_same_benchmark

    tasks = load_tasks(DOMAIN, "base")
    assert len(tasks) == 97 and len({t.id for t in tasks}) == 97
    with pytest.raises(TaskLookupError, match="^unknown split 'test' for domain 'banking_knowledge'; valid splits: "
                                              "base$"):
        load_tasks(DOMAIN, "test")
    bm25, grep = benchmark_id({DOMAIN: tasks}), benchmark_id({DOMAIN: tasks}, "grep_only")
    assert bm25["retrieval_variant"] == "bm25" and "retrieval_variant" not in benchmark_id({"mock": []})
    with pytest.raises(BenchmarkMismatch, match="retrieval variant bm25, this run uses grep_only"):
        check_same_benchmark(bm25, grep, "x")


@pytest.mark.parametrize("task_id", TASKS)
def test_oracle_replay_scores_1_and_equals_tau2s_native_path(task_id: str) -> None:
    from tau2_rl_pipeline.benchmark.prompting import tool_schemas

    task = _task(task_id)
    episode = _replay(task)
    kwargs, native_env = _native(task)
    assert not episode.fast and episode.env_kwargs.keys() == kwargs.keys() == {
        "retrieval_variant", "task", "read_log_allowlist"}
    assert episode.policy == native_env.get_policy()  # bm25's prompt, not tau2's default alltools
    assert episode.tools == tool_schemas(native_env.tools.get_tools().values())
    ours = episode.evaluate()
    assert ours.reward == 1.0, ours.info
    assert ours.model_dump() == _native_evaluation(episode, kwargs).model_dump()
    assert (ours.nl_assertions is not None) == (task_id == "task_102")  # the judge was asked where tau2 asks it


@pytest.mark.parametrize("task_id", ["task_005", "task_017"])
def test_a_replay_without_its_last_write_scores_the_same_lower_reward_on_both_paths(task_id: str) -> None:
    from tau2_rl_pipeline.benchmark.oracle import last_write_index

    task = _task(task_id)
    last = last_write_index(DOMAIN, task)
    episode = _replay(task, keep=lambda i: i != last)
    ours = episode.evaluate()
    assert ours.reward == 0.0 and ours.db_check is not None and not ours.db_check.db_match
    assert ours.model_dump() == _native_evaluation(episode, _native(task)[0]).model_dump()


def test_fast_env_is_not_used_for_banking_and_other_domains_keep_it() -> None:
    from tau2_rl_pipeline.benchmark.episode import Episode, build_environment
    from tau2_rl_pipeline.benchmark.fast_env import fast_environment, has_fast_path
    from tau2_rl_pipeline.benchmark.tasks import load_tasks

    assert not has_fast_path(DOMAIN) and has_fast_path("airline")
    with pytest.raises(ValueError, match="^fast_env has no path for banking_knowledge: "):
        fast_environment(DOMAIN)
    episode = Episode(DOMAIN, _task("task_004"), None, fast=True)
    assert not episode.fast and type(episode.env.tools).__module__.startswith("tau2.")
    assert type(build_environment(DOMAIN, True, task=_task("task_004")).tools).__module__.startswith("tau2.")
    mock = Episode("mock", load_tasks("mock", "base")[0], None, fast=True)
    assert mock.fast and type(mock.env.tools).__module__ == "tau2_rl_pipeline.benchmark.fast_env"


def test_the_retrieval_variant_setting_reaches_the_environment_and_the_evaluator() -> None:
    from tau2_rl_pipeline.benchmark.episode import Episode
    from tau2_rl_pipeline.config import Tau2Config

    task = _task("task_004")
    cfg = Tau2Config.from_env({"TAU2_RETRIEVAL_VARIANT": "grep_only"})
    grep = Episode(DOMAIN, task, None, retrieval_variant=cfg.retrieval_variant)
    bm25 = Episode(DOMAIN, task, None)
    assert "grep" in grep.agent_tool_names and "KB_search" not in grep.agent_tool_names
    assert "KB_search" in bm25.agent_tool_names and grep.policy != bm25.policy
    assert grep.env_kwargs["retrieval_variant"] == "grep_only"
    assert grep.policy == _native(task, "grep_only")[1].get_policy()


def test_the_gym_env_builds_banking_with_its_variant_and_scores_with_tau2s_evaluator() -> None:
    from tau2_rl_pipeline.benchmark.gym_env import Tau2GymEnv
    from tau2_rl_pipeline.benchmark.users import ScriptedUser
    from tau2_rl_pipeline.learning.oracle_demos import demo_turns

    task = _task("task_004")
    env = Tau2GymEnv(DOMAIN, [task], lambda t, environment: ScriptedUser(t), retrieval_variant="grep_only")
    _, info = env.reset(seed=0, options={"task_id": task.id})
    names = {t["function"]["name"] for t in info["tools"]}
    assert "grep" in names and "KB_search" not in names and env.episode.env_kwargs["retrieval_variant"] == "grep_only"
    for text in demo_turns(task):
        _, reward, terminated, _, step = env.step(text)
    assert terminated and reward == 1.0, step


def test_a_variant_that_cannot_run_here_is_refused_in_one_line(monkeypatch, tmp_path: Path) -> None:
    from tau2_rl_pipeline.benchmark.tau2_version import RetrievalVariantError, check_retrieval_variant, retrieval_needs
    from tau2_rl_pipeline.eval.eval_passk import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert retrieval_needs("alltools") == ["rank_bm25", "OPENAI_API_KEY", "srt"]
    assert retrieval_needs("bm25") == ["rank_bm25"] and retrieval_needs("grep_only") == []
    check_retrieval_variant(["airline"], "alltools")  # no banking: nothing to check
    with pytest.raises(RetrievalVariantError, match="^banking_knowledge's retrieval variant 'openai_embeddings' "
                                                     "needs OPENAI_API_KEY .*TAU2_RETRIEVAL_VARIANT=bm25"):
        check_retrieval_variant([DOMAIN], "openai_embeddings")
    with pytest.raises(RetrievalVariantError, match=r"^unknown retrieval variant 'bm52'; .*\(offline: .*bm25"):
        check_retrieval_variant([DOMAIN], "bm52")
    monkeypatch.setenv("TAU2_RETRIEVAL_VARIANT", "alltools")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["--backend", "local", "--model", str(tmp_path), "--user", "scripted", "--domains", DOMAIN,
                   "--task-split", "base", "--output", str(tmp_path / "r.json")])
    assert rc == 2 and not (tmp_path / "r.json").exists()
    (line,) = err.getvalue().strip().splitlines()
    assert line.startswith("error: banking_knowledge's retrieval variant 'alltools' needs OPENAI_API_KEY"), line
    from tau2_rl_pipeline.local.pipeline import main as demo  # the demo refuses it the same way

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = demo(["--domain", DOMAIN, "--split", "base", "--eval-split", "base", "--out", str(tmp_path / "demo")])
    assert rc == 2 and err.getvalue().startswith("error: banking_knowledge's retrieval variant 'alltools' needs")


def test_an_evaluation_on_banking_is_read_by_tau2_and_its_submission_passes_tau2s_validation(
        tiny_engine, tiny_small_dir: Path, tmp_path: Path) -> None:
    """eval_passk with the scripted user and a policy server answering the oracle's turns: reward 1 per task,
    results files tau2 1.0.1's loader and metrics read (retrieval_config recorded), a submission it validates."""
    from rich.console import Console
    from support.loopback_server import LoopbackServer
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics
    from tau2.scripts.leaderboard.prepare_submission import check_and_load_submission_data, validate_submission_metrics
    from tau2.scripts.leaderboard.submission import Submission

    from tau2_rl_pipeline.eval.eval_passk import main
    from tau2_rl_pipeline.learning.oracle_demos import demo_turns

    ids = ["task_001", "task_004"]  # a user-side write (the scripted user performs it), an ACTION-basis task
    tok = tiny_engine.tokenizer
    out = tmp_path / "run.json"
    with LoopbackServer(tiny_engine) as policy:
        policy.script(*[tok.encode(text + tok.eos_token, add_special_tokens=False)
                        for i in ids for text in demo_turns(_task(i))])
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["--backend", "sglang", "--sglang-url", policy.base_url, "--hf-checkpoint", str(tiny_small_dir),
                       "--user", "scripted", "--domains", DOMAIN, "--task-split", "base", "--task-ids", ",".join(ids),
                       "--num-samples", "1", "--concurrency", "1", "--max-new-tokens", "256", "--output", str(out),
                       "--submission", str(tmp_path / "submission")])
    assert rc == 0, err.getvalue()
    summary = json.loads(out.read_text())
    assert summary["benchmark"]["retrieval_variant"] == "bm25"
    ours = summary["metrics"]["domains"][DOMAIN]["metrics"]
    assert ours["pass^1"]["value"] == 1.0, summary["metrics"]

    results = Results.load(out.with_name(f"run.{DOMAIN}.tau2.json"))  # tau2 1.0.1's own loader and metrics
    assert results.info.retrieval_config == "bm25" and [s.task_id for s in results.simulations] == ids
    assert results.info.environment_info.policy == _native(_task(ids[0]))[1].get_policy()  # bm25's, not alltools'
    assert compute_metrics(results).pass_hat_ks[1] == ours["pass^1"]["value"]

    directory = tmp_path / "submission"
    submission = Submission.load(directory / "submission.json")  # tau2's schema: banking needs retrieval_config
    assert submission.results.banking_knowledge.retrieval_config == "bm25"
    assert submission.results.banking_knowledge.pass_1 == 100.0
    ok, error, data = check_and_load_submission_data(str(directory))
    assert ok, error
    console = Console(record=True, width=200)
    validate_submission_metrics(data.submission, data.results, console)
    assert "Submission metrics validation successful" in console.export_text(), console.export_text()
