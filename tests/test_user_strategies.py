"""User strategies (TAU2_USER_STRATEGY) on tau2's real UserSimulator, through litellm to the loopback server, whose
chat replies are canned (scripted token sequences): each strategy's calls, and what reaches the conversation."""

from __future__ import annotations

import pytest
from tau2.data_model.message import AssistantMessage

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.env import build_environment
from tau2_rl_pipeline.loopback_server import LoopbackServer
from tau2_rl_pipeline.tasks import get_task
from tau2_rl_pipeline.user_strategies import (
    StrategyUser,
    parse_check,
    parse_reflection,
    strip_thought,
)
from tau2_rl_pipeline.users import make_user_factory, user_client_kind

GREETING = AssistantMessage(role="assistant", content="Hi! How can I help you today?")
GOOD = "Please create a task called Buy groceries for me."
OFF = "I would like to order a pizza with extra cheese."


@pytest.fixture
def server(tiny_engine):
    with LoopbackServer(tiny_engine, default_max_tokens=256) as srv:
        yield srv


def _user(server, strategy: str, **env: str):
    cfg = Tau2Config.from_env({"TAU2_USER_MODEL": "openai/tiny", "TAU2_USER_API_BASE": server.base_url + "/v1",
                               "TAU2_USER_STRATEGY": strategy, **env})
    task = get_task("mock", "create_task_1")
    return make_user_factory("llm", cfg)(task, build_environment("mock", True))


def _say(server, small_tokenizer, *replies: str) -> None:
    server.script(*[small_tokenizer.encode(r, add_special_tokens=False) + [small_tokenizer.eos_token_id]
                    for r in replies])


def _first_message(user):
    state = user.get_init_state()
    reply, state = user.generate_next_message(GREETING, state)
    return reply, state


def _chat_bodies(server) -> list[dict]:
    return [body for path, body in server.requests if path == "/v1/chat/completions"]


def test_llm_is_tau2s_user_simulator_with_one_call(server, small_tokenizer):
    user = _user(server, "llm")
    assert not isinstance(user, StrategyUser)  # the default path is tau2's simulator, whichever client it uses
    _say(server, small_tokenizer, GOOD)
    reply, _ = _first_message(user)
    assert reply.content == GOOD and len(_chat_bodies(server)) == 1


def test_react_strips_the_thought(server, small_tokenizer):
    user = _user(server, "react")
    _say(server, small_tokenizer, f"Thought:\nI need a task created.\nUser Response:\n{GOOD}")
    reply, state = _first_message(user)
    assert reply.content == GOOD and state.messages[-1].content == GOOD  # the thought never reaches the agent
    (body,) = _chat_bodies(server)
    assert "User Response:" in body["messages"][0]["content"]  # asked for the format in the system prompt
    assert user.calls == 1


def test_verify_regenerates_a_message_that_fails_its_check(server, small_tokenizer):
    user = _user(server, "verify")
    _say(server, small_tokenizer, OFF, "Classification: false", GOOD, "Classification: true")
    reply, state = _first_message(user)
    assert reply.content == GOOD and state.messages[-1].content == GOOD
    bodies = _chat_bodies(server)
    assert len(bodies) == 4 and user.calls == 4
    check = bodies[1]["messages"]
    assert "Classification: true" in check[0]["content"] and "'Important Meeting'" in check[0]["content"]
    assert OFF in check[1]["content"] and GREETING.content in check[1]["content"]
    assert "tools" not in bodies[1] or not bodies[1]["tools"]


def test_verify_keeps_the_last_message_after_max_checks(server, small_tokenizer):
    user = _user(server, "verify", TAU2_USER_STRATEGY_MAX_CHECKS="2")
    _say(server, small_tokenizer, OFF, "Classification: false", "Still pizza, please.", "no verdict here")
    reply, _ = _first_message(user)
    assert reply.content == "Still pizza, please." and user.calls == 4  # 2 messages, 2 checks, no third try


def test_max_checks_bounds_the_calls(server, small_tokenizer):
    user = _user(server, "verify", TAU2_USER_STRATEGY_MAX_CHECKS="1")
    _say(server, small_tokenizer, OFF, "Classification: false")
    reply, _ = _first_message(user)
    assert reply.content == OFF and user.calls == 2  # one check, no regeneration: the message is kept


def test_a_passing_check_costs_one_call_more(server, small_tokenizer):
    user = _user(server, "verify")
    _say(server, small_tokenizer, GOOD, "Classification: true")
    reply, _ = _first_message(user)
    assert reply.content == GOOD and user.calls == 2


def test_reflection_reflects_then_retries(server, small_tokenizer):
    user = _user(server, "reflection")
    _say(server, small_tokenizer, OFF, "Classification: false",
         f"Reflection:\nThe scenario is about a task, not food.\nResponse:\n{GOOD}", "Classification: true")
    reply, state = _first_message(user)
    assert reply.content == GOOD and "Reflection" not in state.messages[-1].content
    bodies = _chat_bodies(server)
    assert len(bodies) == 4 and "Reflection:" in bodies[2]["messages"][0]["content"]
    assert OFF in bodies[2]["messages"][1]["content"]  # the rejected message is what it reflects on
    assert GOOD in bodies[3]["messages"][1]["content"]  # and the new one is checked in turn


def test_a_failing_user_call_raises_so_the_episode_aborts(server, small_tokenizer):
    """The strategies add no error handling of their own: a call that fails after litellm's retries raises, and
    the rollout ends the episode aborted (tested for the user side in test_rollout / test_faults)."""
    user = _user(server, "verify", TAU2_USER_MAX_RETRIES="0")
    server.faults.fail_next(5)
    with pytest.raises(Exception, match="injected fault"):
        user.generate_next_message(GREETING, user.get_init_state())
    assert user.calls == 1 and len(_chat_bodies(server)) == 1


def test_strategies_use_litellm_and_refuse_the_async_client(server):
    from tau2_rl_pipeline.users import UserConfigError

    env = {"TAU2_USER_MODEL": "openai/tiny", "TAU2_USER_API_BASE": server.base_url + "/v1"}
    assert user_client_kind(Tau2Config.from_env(env)) == "async"  # a local server: async by default
    assert user_client_kind(Tau2Config.from_env({**env, "TAU2_USER_STRATEGY": "verify"})) == "litellm"
    with pytest.raises(UserConfigError, match="TAU2_USER_STRATEGY=react makes its calls over litellm"):
        make_user_factory("llm", Tau2Config.from_env({**env, "TAU2_USER_STRATEGY": "react",
                                                       "TAU2_USER_CLIENT": "async"}))


def test_parsers():
    assert strip_thought("Thought: x\nUser Response: hello") == "hello"
    assert strip_thought("no markers") == "no markers"
    assert parse_check("reasoning...\nClassification: TRUE") and not parse_check("Classification: false")
    assert not parse_check("") and not parse_check("looks fine")
    assert parse_reflection("Reflection: bad\nResponse: new one") == "new one"
    with pytest.raises(ValueError, match="unknown user strategy"):
        StrategyUser(strategy="shout")
