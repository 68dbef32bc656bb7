"""The optional judge reward: a real HTTP judge (the loopback server, canned replies), its client discipline
(timeouts, retries, aborted on failure, never scored, calls counted) and its place in the partial score."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from support.loopback_server import Fault, LoopbackServer
from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage
from tau2.data_model.simulation import RewardInfo

from tau2_rl_pipeline.benchmark.tasks import get_task
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning import judge_reward as judge_module
from tau2_rl_pipeline.learning.judge_reward import (
    JudgeClient,
    JudgeError,
    judge_trajectory,
    parse_score,
    render_conversation,
)
from tau2_rl_pipeline.local.grpo import LocalSample as Sample
from tau2_rl_pipeline.local.grpo import _rollouts as _grpo_rollouts
from tau2_rl_pipeline.rollout.engines import SamplingParams
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, COMPLETED, Trajectory
from tau2_rl_pipeline.slime_plugins.adapter import fill_sample

MESSAGES = [
    AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
    UserMessage(role="user", content="Create a task called Important Meeting for user_1."),
    AssistantMessage(role="assistant", content=None, tool_calls=[
        ToolCall(id="c1", name="create_task", arguments={"user_id": "user_1", "title": "Important Meeting"})]),
    ToolMessage(id="c1", role="tool", content='{"task_id": "task_2"}' + "x" * 5000),
    AssistantMessage(role="assistant", content="Done: task_2 is created."),
]


@pytest.fixture
def server(tiny_engine):
    with LoopbackServer(tiny_engine, default_max_tokens=64, hang_s=5.0) as srv:
        yield srv


def _cfg(server, **env: str) -> Tau2Config:
    return Tau2Config.from_env({"TAU2_USE_JUDGE": "1", "TAU2_JUDGE_MODEL": "openai/tiny", "TAU2_JUDGE_BACKOFF_S": "0",
                                "TAU2_JUDGE_API_BASE": server.base_url + "/v1", **env})


def _say(server, tokenizer, *replies: str) -> None:
    server.script(*[tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in replies])


def _traj(status=COMPLETED) -> Trajectory:
    return Trajectory(domain="mock", task_id="create_task_1", prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 1],
                      rollout_logprobs=[-0.1, -0.2], chat=[], tools=[], messages=list(MESSAGES),
                      reward_info=RewardInfo(reward=1.0), termination_reason="agent_stop", status=status, turns=2)


def _judge(cfg: Tau2Config, traj: Trajectory) -> Trajectory:
    async def go():
        async with JudgeClient(cfg) as client:
            return await judge_trajectory(traj, "Create a task called Important Meeting.", client)
    return asyncio.run(go())


def test_parse_score():
    assert parse_score("Fine work.\nSCORE: 7") == 0.7
    assert parse_score("SCORE: 3\n...\nscore: 10/10") == 1.0
    assert parse_score("SCORE: 11") is None and parse_score("no score") is None and parse_score(None) is None


def test_the_judge_reads_the_whole_conversation_and_its_score_lands_in_the_trajectory(server, small_tokenizer):
    _say(server, small_tokenizer, "The agent did it.\nSCORE: 8")
    traj = _judge(_cfg(server), _traj())
    assert traj.judge_score == pytest.approx(0.8) and traj.judge_calls == 1 and traj.status == COMPLETED
    ((_, body),) = server.requests
    system, user = body["messages"]
    assert body["model"] == "tiny"  # TAU2_JUDGE_MODEL=openai/tiny (litellm's name) is sent as the served name
    assert "Important Meeting." in system["content"] and "SCORE" in system["content"]
    assert 'agent calls create_task({"title": "Important Meeting", "user_id": "user_1"})' in user["content"]
    assert "customer: Create a task" in user["content"] and "...[cut]" in user["content"]


def test_failed_calls_are_retried_and_counted(server, small_tokenizer):
    server.faults.fail_next(1, Fault.ERROR_500)
    server.faults.fail_next(1, Fault.MALFORMED)
    server.faults.fail_next(1, Fault.DROP)
    _say(server, small_tokenizer, "I liked it.", "SCORE: 6")  # a reply without a score is retried too
    traj = _judge(_cfg(server, TAU2_JUDGE_MAX_RETRIES="4"), _traj())
    assert traj.judge_score == pytest.approx(0.6) and traj.judge_calls == 5 and len(server.requests) == 5


def test_retries_wait_judge_backoff_s_doubled(server, small_tokenizer, monkeypatch):
    """TAU2_JUDGE_BACKOFF_S (shared with tau2 1.0.1's NL-assertion judge) sets the first wait, doubled per retry."""
    waits: list[float] = []
    sleep = asyncio.sleep

    async def recorded(delay, *args, **kwargs):
        waits.append(delay)
        return await sleep(0, *args, **kwargs)

    monkeypatch.setattr(judge_module.asyncio, "sleep", recorded)
    server.faults.fail_next(2, Fault.ERROR_500)
    _say(server, small_tokenizer, "SCORE: 9")
    traj = _judge(_cfg(server, TAU2_JUDGE_BACKOFF_S="0.25"), _traj())
    assert traj.judge_score == pytest.approx(0.9) and traj.judge_calls == 3
    assert [w for w in waits if w > 0] == [0.25, 0.5]


def test_a_hung_judge_times_out_and_is_retried(server, small_tokenizer):
    """The hung call would answer after 10 minutes, so only the timeout ends it; the retry has seconds to answer,
    however loaded the machine."""
    server.faults.hang_s = 600.0
    server.faults.fail_next(1, Fault.HANG)
    _say(server, small_tokenizer, "SCORE: 5")
    traj = _judge(_cfg(server, TAU2_JUDGE_TIMEOUT_S="5"), _traj())
    assert traj.judge_score == pytest.approx(0.5) and traj.judge_calls == 2, traj.error


def test_a_judge_that_keeps_failing_aborts_the_episode_which_is_never_scored(server, small_tokenizer):
    server.faults.fail_next(3)
    cfg = _cfg(server, TAU2_JUDGE_MAX_RETRIES="2")
    traj = _judge(cfg, _traj())
    assert traj.status == ABORTED and traj.judge_score is None and traj.judge_calls == 3
    assert "judge" in traj.error and "HTTP 500" in traj.error
    sample = fill_sample(Sample(), traj, cfg, small_tokenizer)
    assert sample.remove_sample and sample.reward == 0.0 and sample.status == Sample.Status.ABORTED
    assert sample.metadata["judge_calls"] == 3


def test_a_refused_request_is_not_retried(tiny_engine, small_tokenizer):
    with LoopbackServer(tiny_engine) as server:
        cfg = dataclasses.replace(_cfg(server), judge_api_base=server.base_url + "/nope")
        traj = _judge(cfg, _traj())
    assert traj.status == ABORTED and traj.judge_calls == 1 and "HTTP 404" in traj.error


def test_an_aborted_episode_is_not_judged(server):
    traj = _judge(_cfg(server), _traj(ABORTED))
    assert traj.judge_calls == 0 and not server.requests


def test_the_judge_score_is_a_weighted_partial_component(server, small_tokenizer):
    cfg = _cfg(server)
    traj = dataclasses.replace(_traj(), reward_info=RewardInfo(reward=0.0), judge_score=0.5)
    sample = fill_sample(Sample(), traj, cfg, small_tokenizer)
    assert sample.metadata["partial_parts"] == {"judge": 0.5} and sample.metadata["partial_score"] == 0.5
    assert sample.reward == pytest.approx(cfg.reward_alpha * 0.5)
    off = fill_sample(Sample(), dataclasses.replace(traj, judge_score=None), Tau2Config(), small_tokenizer)
    assert off.reward == 0.0 and "judge" not in off.metadata["partial_parts"]


def test_the_local_policy_stage_judges_every_episode(server, small_tokenizer, tiny_engine):
    """With TAU2_USE_JUDGE on, the local rollouts (in-process policy, scripted user) ask the judge once each."""
    _say(server, small_tokenizer, "SCORE: 7", "SCORE: 3")
    cfg = _cfg(server, TAU2_MAX_TURNS="1", TAU2_EPISODE_WORKERS="0")
    task = get_task("mock", "create_task_1")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=(small_tokenizer.eos_token_id,))
    trajs = asyncio.run(_grpo_rollouts("mock", tiny_engine, small_tokenizer, [task], 2, sampling, cfg, 0))
    assert sorted(t.judge_score for t in trajs) == pytest.approx([0.3, 0.7])
    assert [t.judge_calls for t in trajs] == [1, 1] and len(server.requests) == 2


def test_a_judge_without_an_endpoint_is_refused():
    with pytest.raises(JudgeError, match="TAU2_JUDGE_API_BASE"):
        JudgeClient(Tau2Config())
    assert render_conversation([]) == ""
