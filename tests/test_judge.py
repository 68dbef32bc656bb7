"""The NL-assertion judge client (tau2_rl_pipeline/benchmark/judge.py) against a real loopback HTTP server, and, on tau2
1.0.1, tau2's own NL evaluator calling it: retries with backoff, timeouts, token counts, and a judge outage that
aborts episodes instead of scoring them."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from judge_double import expected_outcomes, judge_answer
from support.loopback_server import Fault, LoopbackServer

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.judge import (
    Judge,
    JudgeConfigError,
    JudgeError,
    JudgeSettings,
    check_answer,
    episode_usage,
)
from tau2_rl_pipeline.benchmark.tau2_version import V1, judge_default_model, needs_judge
from tau2_rl_pipeline.config import ConfigError, Tau2Config

PROMPT = [{"role": "system", "content": "grade"},
          {"role": "user", "content": "conversation:\nuser: hi\n\nexpectedOutcomes:\n['Agent greets', 'Agent helps']"}]
needs_v1 = pytest.mark.skipif(not V1, reason="tau2 1.0.1 only: 26.3 has no judged task (tests/test_tau2_v1.py "
                                             "runs this file on 1.0.1)")


@pytest.fixture
def server(tiny_engine) -> Iterator[LoopbackServer]:
    with LoopbackServer(tiny_engine, model_name="judge", hang_s=5.0) as s:
        s.chat_answer = judge_answer()
        yield s


def settings(server: LoopbackServer, **kw: Any) -> JudgeSettings:
    return JudgeSettings(**{"model": "openai/judge", "api_base": f"{server.base_url}/v1", "max_retries": 2,
                            "backoff_s": 0.5, "timeout_s": 30.0, **kw})


def test_answer_through_http_with_tokens_counted(server) -> None:
    sleeps: list[float] = []
    client = Judge(settings(server), sleep=sleeps.append)
    with episode_usage() as mine:
        answer = json.loads(client.complete(PROMPT))
    assert [r["expectedOutcome"] for r in answer["results"]] == ["Agent greets", "Agent helps"]
    assert all(r["metExpectation"] is True for r in answer["results"])
    body = server.requests[-1][1]
    assert server.count("/v1/chat/completions") == 1 and body["model"] == "judge" and body["temperature"] == 0.0
    assert client.usage.calls == 1 and client.usage.failed_attempts == 0 and sleeps == []
    assert client.usage.prompt_tokens > 10 and client.usage.completion_tokens > 10
    assert mine == client.usage  # the episode's own count


def test_errors_and_malformed_answers_are_retried_with_doubling_backoff(server) -> None:
    sleeps: list[float] = []
    client = Judge(settings(server, max_retries=3), sleep=sleeps.append)
    server.faults.fail_next(1, Fault.ERROR_500)
    answers = iter(['{"results": [{"expectedOutcome": "x"}]}', "not json at all"])  # tau2's parsing raises on both
    server.chat_answer = lambda body: next(answers, None) or judge_answer()(body)
    assert json.loads(client.complete(PROMPT))["results"][0]["expectedOutcome"] == "Agent greets"
    assert sleeps == [0.5, 1.0, 2.0]  # backoff_s, doubled per retry
    assert (client.usage.calls, client.usage.failed_attempts) == (1, 3)


def test_an_outage_is_a_one_line_judge_error_after_every_attempt(server) -> None:
    client = Judge(settings(server, max_retries=2), sleep=lambda s: None)
    server.faults.fail_next(3, Fault.ERROR_500)
    with pytest.raises(JudgeError, match=r"^judge openai/judge failed after 3 attempts: ") as e:
        client.complete(PROMPT)
    assert "\n" not in str(e.value) and server.count("/v1/chat/completions") == 3
    assert (client.usage.calls, client.usage.failed_attempts) == (0, 3)


def test_the_timeout_setting_cuts_a_hung_call(server) -> None:
    """The hung call would answer after 10 minutes, so only the timeout ends it; the timeout leaves the retry's
    answer seconds, however loaded the machine (a client that gives up cancels the hung handler)."""
    server.faults.hang_s = 600.0
    server.faults.fail_next(1, Fault.HANG)
    client = Judge(settings(server, timeout_s=5.0, max_retries=1), sleep=lambda s: None)
    assert json.loads(client.complete(PROMPT))["results"]
    assert client.usage.failed_attempts == 1  # the hung attempt timed out; the retry answered


# Judge replies tau2 1.0.1 grades although they judge nothing: no assertion listed, no `results` at all, and a
# string for the verdict (pydantic coerces "true" to True when tau2 builds its NLAssertionCheck).
EMPTY, NO_RESULTS = '{"results": []}', '{"verdict": "all good"}'
STRING_TRUE = '{"results": [{"expectedOutcome": "x", "reasoning": "y", "metExpectation": "true"}]}'


def test_by_default_an_answer_is_accepted_exactly_when_tau2_can_parse_it() -> None:
    good = '{"results": [{"expectedOutcome": "x", "reasoning": "y", "metExpectation": false}]}'
    for accepted in (good, EMPTY, NO_RESULTS, STRING_TRUE):
        assert check_answer(accepted) == accepted
    for raises_in_tau2 in ("", "not json", "[]", '{"results": [{"expectedOutcome": "x", "reasoning": "y"}]}',
                           '{"results": [{"expectedOutcome": "x", "reasoning": "y", "metExpectation": "maybe"}]}',
                           '{"results": ["x"]}'):
        with pytest.raises(ValueError):
            check_answer(raises_in_tau2)


def test_the_strict_judge_demands_a_non_empty_list_of_real_verdicts() -> None:
    good = '{"results": [{"expectedOutcome": "x", "reasoning": "y", "metExpectation": false}]}'
    assert check_answer(good, "strict") == good
    for bad in ("", "[]", EMPTY, NO_RESULTS, STRING_TRUE):
        with pytest.raises(ValueError):
            check_answer(bad, "strict")
    assert JudgeSettings.from_config(Tau2Config.from_env({"TAU2_JUDGE_ANSWERS": "strict"})).answers == "strict"
    assert JudgeSettings.from_config(Tau2Config.from_env({})).answers == "tau2"
    with pytest.raises(ConfigError, match="^TAU2_JUDGE_ANSWERS='lenient' is not one of: tau2, strict"):
        Tau2Config.from_env({"TAU2_JUDGE_ANSWERS": "lenient"})


def test_settings_come_from_tau2config_and_are_validated(monkeypatch) -> None:
    cfg = Tau2Config.from_env({"TAU2_JUDGE_MODEL": "openai/j", "TAU2_JUDGE_API_BASE": "http://127.0.0.1:1/v1",
                               "TAU2_JUDGE_TIMEOUT_S": "7", "TAU2_JUDGE_MAX_RETRIES": "0",
                               "TAU2_JUDGE_BACKOFF_S": "0.25"})
    s = JudgeSettings.from_config(cfg)
    assert (s.model, s.api_base, s.timeout_s, s.max_retries, s.backoff_s) == (
        "openai/j", "http://127.0.0.1:1/v1", 7.0, 0, 0.25)
    assert s.litellm_args()["timeout"] == 7.0 and s.litellm_args()["num_retries"] == 0
    assert JudgeSettings.from_config(Tau2Config.from_env({})).model == (judge_default_model() or "gpt-4.1-2025-04-14")
    with pytest.raises(ConfigError, match="^TAU2_JUDGE_MAX_RETRIES="):
        Tau2Config.from_env({"TAU2_JUDGE_MAX_RETRIES": "-1"})
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(JudgeConfigError, match="needs OPENAI_API_KEY in the environment"):
        judge.check_judge(Tau2Config.from_env({"TAU2_JUDGE_MODEL": "gpt-4.1"}))
    judge.check_judge(cfg)  # a local server needs no key


def test_usage_is_counted_per_thread_for_each_episode(server) -> None:
    client = Judge(settings(server), sleep=lambda s: None)
    counts: dict[str, int] = {}

    def episode(name: str, calls: int) -> None:
        with episode_usage() as used:
            for _ in range(calls):
                client.complete(PROMPT)
        counts[name] = used.calls

    threads = [threading.Thread(target=episode, args=(n, c)) for n, c in (("a", 1), ("b", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == {"a": 1, "b": 2} and client.usage.calls == 3


# -- tau2 1.0.1: tau2's own evaluator, our judge -------------------------------------------------------------------

def _retail_judged_task():
    from tau2_rl_pipeline.benchmark.tasks import load_tasks

    return next(t for t in load_tasks("retail", "test") if needs_judge(t))


@needs_v1
def test_tau2_grades_nl_assertions_with_the_installed_judge(loopback_judge) -> None:
    from tau2_rl_pipeline.benchmark.oracle import replay_gold_actions

    task = _retail_judged_task()
    before = judge.active().usage.calls
    assert replay_gold_actions("retail", task).reward == 1.0
    body = loopback_judge.requests[-1][1]
    assert expected_outcomes(body) == list(task.evaluation_criteria.nl_assertions)  # tau2's prompt, its assertions
    assert judge.active().usage.calls == before + 1
    loopback_judge.chat_answer = judge_answer(lambda outcome: False)
    try:
        info = replay_gold_actions("retail", task)
    finally:
        loopback_judge.chat_answer = judge_answer()
    assert info.reward == 0.0 and info.db_check.db_match  # the DB is right; the judge said the assertions fail
    assert [c.met for c in info.nl_assertions] == [False] * len(task.evaluation_criteria.nl_assertions)


@needs_v1
@pytest.mark.parametrize("reply", ["empty", "no_results", "string_true"])
def test_by_default_a_reply_scores_what_tau2_1_0_1_alone_scores_for_it(loopback_judge, reply) -> None:
    """tau2 1.0.1's own NLAssertionsEvaluator given the reply directly, against the same evaluator calling our judge
    client over HTTP for it: the same reward and checks (1.0: tau2 finds no failed assertion). The strict judge
    refuses each reply (retried, then the episode is aborted)."""
    from tau2.data_model.message import AssistantMessage, UserMessage
    from tau2.evaluator import evaluator_nl_assertions as nl

    task = _retail_judged_task()
    text = {"empty": EMPTY, "no_results": NO_RESULTS, "string_true": json.dumps({"results": [
        {"expectedOutcome": a, "reasoning": "r", "metExpectation": "true"}
        for a in task.evaluation_criteria.nl_assertions]})}[reply]
    conversation = [UserMessage(role="user", content="Please cancel my order."),
                    AssistantMessage(role="assistant", content="It is cancelled.")]
    judge.configure(loopback_judge.cfg)
    ours_installed = nl.generate
    nl.generate = lambda *args, **kwargs: AssistantMessage(role="assistant", content=text)  # tau2 alone
    try:
        tau2_alone = nl.NLAssertionsEvaluator.calculate_reward(task, conversation)
    finally:
        nl.generate = ours_installed
    loopback_judge.chat_answer = lambda body: text if expected_outcomes(body) is not None else None
    try:
        ours = nl.NLAssertionsEvaluator.calculate_reward(task, conversation)
        strict = Judge(replace(JudgeSettings.from_config(loopback_judge.cfg), answers="strict"), sleep=lambda s: None)
        with pytest.raises(JudgeError, match="malformed answer"):
            strict.complete(PROMPT)
    finally:
        loopback_judge.chat_answer = judge_answer()
    assert ours.reward == tau2_alone.reward == 1.0
    assert [c.model_dump() for c in ours.nl_assertions] == [c.model_dump() for c in tau2_alone.nl_assertions]


def test_a_run_configures_the_judge_from_its_config_and_only_when_it_has_a_judged_task(loopback_judge) -> None:
    """Where a run reads its config (the evaluator's run_episodes, slime's generate, the local policy stage), it
    configures the judge, not each episode: from that run's config when any of its tasks is judged (NL
    assertions), and a run without one leaves the installed judge as it was."""
    from tau2_rl_pipeline.benchmark.tasks import get_task

    plain = get_task("mock", "create_task_1")
    judged = plain.model_copy(update={"evaluation_criteria": plain.evaluation_criteria.model_copy(
        update={"reward_basis": ["NL_ASSERTION"], "nl_assertions": ["The agent greets the user."]})})
    assert needs_judge(judged) and not needs_judge(plain)
    run = replace(loopback_judge.cfg, judge_max_retries=7)
    try:
        judge.configure_for(run, [plain])
        assert judge.active().settings == JudgeSettings.from_config(loopback_judge.cfg)
        judge.configure_for(run, [plain, judged])
        assert judge.active().settings == JudgeSettings.from_config(run)
        assert judge.active().settings != JudgeSettings.from_config(loopback_judge.cfg)
    finally:
        judge.configure(loopback_judge.cfg)


@needs_v1
def test_a_judge_outage_aborts_episodes_and_none_is_scored(loopback_judge, tiny_engine, small_tokenizer) -> None:
    from tau2_rl_pipeline.benchmark.users import make_user_factory
    from tau2_rl_pipeline.eval.runner import run_episodes
    from tau2_rl_pipeline.rollout.engines import SamplingParams

    task = _retail_judged_task()
    refusing = LoopbackServer(tiny_engine, model_name="judge")
    refusing.start()
    refusing.stop()  # nothing listens on its port any more: connections are refused
    cfg = replace(loopback_judge.cfg, judge_api_base=f"{refusing.base_url}/v1", max_turns=2, judge_max_retries=2)
    records: list[dict] = []
    try:
        asyncio.run(run_episodes([("retail", task, s) for s in range(2)], engine=Goodbye(small_tokenizer),
                                 tokenizer=small_tokenizer, user_factory=make_user_factory("scripted", cfg),
                                 sampling=SamplingParams(max_new_tokens=32), cfg=cfg, seed=0, concurrency=2,
                                 on_done=records.append))
    finally:
        judge.configure(loopback_judge.cfg)
    assert len(records) == 2
    for r in records:  # the agent stopped, so tau2 asked the judge, which never answered
        assert r["status"] == "aborted" and r["reward_info"] is None and r["reward"] == 0.0
        assert r["error"].startswith("judge openai/judge failed after 3 attempts") and r["judge"]["calls"] == 0
        assert r["judge"]["failed_attempts"] == 3
        assert r["termination_reason"] == "judge_error"
    from tau2_rl_pipeline.metrics import summarize

    with pytest.raises(ValueError):  # every episode aborted: nothing is scored
        summarize(records)


class Goodbye:
    """The engine contract, scripted: the agent ends the conversation at once (so tau2 evaluates it)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def generate(self, input_ids, sampling):
        from tau2_rl_pipeline.rollout.engines import GenerateResult

        ids = self.tokenizer.encode("Thank you, goodbye. ###STOP###" + self.tokenizer.eos_token,
                                    add_special_tokens=False)
        return GenerateResult(ids, [-0.5] * len(ids), "stop")


@needs_v1
def test_the_judge_never_runs_on_the_event_loop_even_with_episode_workers_zero(loopback_judge, small_tokenizer,
                                                                               monkeypatch) -> None:
    """TAU2_EPISODE_WORKERS=0 runs episode work on the loop; tau2's judge call (litellm, blocking for seconds)
    would stall every episode in flight there, so a judged evaluation goes to a thread all the same."""
    from tau2_rl_pipeline.benchmark.users import make_user_factory
    from tau2_rl_pipeline.eval.runner import run_episodes
    from tau2_rl_pipeline.rollout.engines import SamplingParams

    calls_from: list[int] = []
    complete = Judge.complete

    def recorded(self, messages):
        calls_from.append(threading.get_ident())
        return complete(self, messages)

    monkeypatch.setattr(Judge, "complete", recorded)
    cfg = replace(loopback_judge.cfg, max_turns=2, episode_workers=0)
    records: list[dict] = []
    asyncio.run(run_episodes([("retail", _retail_judged_task(), 0)], engine=Goodbye(small_tokenizer),
                             tokenizer=small_tokenizer, user_factory=make_user_factory("scripted", cfg),
                             sampling=SamplingParams(max_new_tokens=32), cfg=cfg, seed=0, concurrency=1,
                             on_done=records.append))
    assert records[0]["status"] == "completed" and records[0]["judge"]["calls"] >= 1
    assert calls_from and threading.get_ident() not in calls_from  # asyncio.run's loop runs on this thread
