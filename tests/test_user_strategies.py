"""User strategies (TAU2_USER_STRATEGY) on tau2's real UserSimulator, through either user client (litellm, and the
async client awaited on a loop) to the loopback server, whose chat replies are canned (scripted token sequences):
each strategy's calls and what reaches the conversation, the same through both clients, and (run twice against
fresh servers) the same request bodies byte for byte."""

from __future__ import annotations

import asyncio
import json

import pytest
from support.loopback_server import LoopbackServer
from tau2.data_model.message import AssistantMessage

from tau2_rl_pipeline.benchmark.actions import format_tool_call
from tau2_rl_pipeline.benchmark.episode import Episode, build_environment
from tau2_rl_pipeline.benchmark.tasks import get_task, load_tasks
from tau2_rl_pipeline.benchmark.user_client import AsyncUserSimulator
from tau2_rl_pipeline.benchmark.user_strategies import (
    AsyncStrategyUser,
    StrategyUser,
    parse_check,
    parse_reflection,
    strip_thought,
)
from tau2_rl_pipeline.benchmark.users import make_user_factory, user_client_kind
from tau2_rl_pipeline.config import Tau2Config

GREETING = AssistantMessage(role="assistant", content="Hi! How can I help you today?")
GOOD = "Please create a task called Buy groceries for me."
OFF = "I would like to order a pizza with extra cheese."
CLIENTS = ("litellm", "async")


def _new_server(engine) -> LoopbackServer:
    return LoopbackServer(engine, default_max_tokens=256)


@pytest.fixture
def server(tiny_engine):
    with _new_server(tiny_engine) as srv:
        yield srv


@pytest.fixture(params=CLIENTS)
def client(request) -> str:
    return request.param


def _factory(server, strategy: str, client: str, **env: str):
    return make_user_factory("llm", Tau2Config.from_env({
        "TAU2_USER_MODEL": "openai/tiny", "TAU2_USER_API_BASE": server.base_url + "/v1",
        "TAU2_USER_STRATEGY": strategy, "TAU2_USER_CLIENT": client, **env}))


def _say(server, small_tokenizer, *replies: str) -> None:
    server.script(*[small_tokenizer.encode(r, add_special_tokens=False) + [small_tokenizer.eos_token_id]
                    for r in replies])


def _play(server, strategy: str, client: str, agent_turns=(GREETING,), domain: str = "mock", **env: str):
    """The user's answers to `agent_turns` over `client`: blocking (litellm) or awaited (async); the user, its
    last reply and its state. mock plays create_task_1; another domain its first test task that starts fresh."""
    factory = _factory(server, strategy, client, **env)
    task = get_task(domain, "create_task_1") if domain == "mock" else next(
        t for t in load_tasks(domain, "test") if not (t.initial_state and t.initial_state.message_history))
    user = factory(task, build_environment(domain, True))
    state = user.get_init_state()
    if client == "litellm":
        for turn in agent_turns:
            reply, state = user.generate_next_message(turn, state)
        return user, reply, state

    async def go():
        try:
            out = None, state
            for turn in agent_turns:
                out = await user.agenerate_next_message(turn, out[1])
            return out
        finally:
            await factory.aclose()

    reply, state = asyncio.run(go())
    return user, reply, state


def _chat_bodies(server) -> list[dict]:
    return [body for path, body in server.requests if path == "/v1/chat/completions"]


def test_each_client_gets_the_strategy_user_of_its_kind(server):
    for client, kind in (("litellm", StrategyUser), ("async", AsyncStrategyUser)):
        user = _factory(server, "verify", client)(get_task("mock", "create_task_1"), build_environment("mock", True))
        assert type(user) is kind and user.strategy == "verify"
    assert isinstance(user, AsyncUserSimulator)  # the async one is the async client's simulator underneath


def test_llm_is_tau2s_user_simulator_with_one_call(server, small_tokenizer, client):
    _say(server, small_tokenizer, GOOD)
    user, reply, _ = _play(server, "llm", client)
    assert not isinstance(user, StrategyUser)  # the default path is tau2's simulator, whichever client it uses
    assert reply.content == GOOD and len(_chat_bodies(server)) == 1


def test_react_strips_the_thought(server, small_tokenizer, client):
    _say(server, small_tokenizer, f"Thought:\nI need a task created.\nUser Response:\n{GOOD}")
    user, reply, state = _play(server, "react", client)
    assert reply.content == GOOD and state.messages[-1].content == GOOD  # the thought never reaches the agent
    (body,) = _chat_bodies(server)
    assert "User Response:" in body["messages"][0]["content"]  # asked for the format in the system prompt
    assert user.calls == 1


def test_verify_regenerates_a_message_that_fails_its_check(server, small_tokenizer, client):
    _say(server, small_tokenizer, OFF, "Classification: false", GOOD, "Classification: true")
    user, reply, state = _play(server, "verify", client)
    assert reply.content == GOOD and state.messages[-1].content == GOOD
    bodies = _chat_bodies(server)
    assert len(bodies) == 4 and user.calls == 4
    check = bodies[1]["messages"]
    assert "Classification: true" in check[0]["content"] and "'Important Meeting'" in check[0]["content"]
    assert OFF in check[1]["content"] and GREETING.content in check[1]["content"]
    assert "tools" not in bodies[1] or not bodies[1]["tools"]


def test_verify_keeps_the_last_message_after_max_checks(server, small_tokenizer, client):
    _say(server, small_tokenizer, OFF, "Classification: false", "Still pizza, please.", "no verdict here")
    user, reply, _ = _play(server, "verify", client, TAU2_USER_STRATEGY_MAX_CHECKS="2")
    assert reply.content == "Still pizza, please." and user.calls == 4  # 2 messages, 2 checks, no third try


def test_max_checks_bounds_the_calls(server, small_tokenizer, client):
    _say(server, small_tokenizer, OFF, "Classification: false")
    user, reply, _ = _play(server, "verify", client, TAU2_USER_STRATEGY_MAX_CHECKS="1")
    assert reply.content == OFF and user.calls == 2  # one check, no regeneration: the message is kept


def test_a_passing_check_costs_one_call_more(server, small_tokenizer, client):
    _say(server, small_tokenizer, GOOD, "Classification: true")
    user, reply, _ = _play(server, "verify", client)
    assert reply.content == GOOD and user.calls == 2


def test_reflection_reflects_then_retries(server, small_tokenizer, client):
    _say(server, small_tokenizer, OFF, "Classification: false",
         f"Reflection:\nThe scenario is about a task, not food.\nResponse:\n{GOOD}", "Classification: true")
    user, reply, state = _play(server, "reflection", client)
    assert reply.content == GOOD and "Reflection" not in state.messages[-1].content
    bodies = _chat_bodies(server)
    assert len(bodies) == 4 == user.calls and "Reflection:" in bodies[2]["messages"][0]["content"]
    assert OFF in bodies[2]["messages"][1]["content"]  # the rejected message is what it reflects on
    assert GOOD in bodies[3]["messages"][1]["content"]  # and the new one is checked in turn


def test_a_failing_user_call_raises_so_the_episode_aborts(server, client):
    """The strategies add no error handling of their own: a call that fails after the client's retries raises, and
    the rollout ends the episode aborted (tested for the user side in test_rollout / test_faults)."""
    factory = _factory(server, "verify", client, TAU2_USER_MAX_RETRIES="0")
    user = factory(get_task("mock", "create_task_1"), build_environment("mock", True))
    server.faults.fail_next(5)
    with pytest.raises(Exception, match="injected fault"):
        if client == "litellm":
            user.generate_next_message(GREETING, user.get_init_state())
        else:
            async def go():
                try:
                    await user.agenerate_next_message(GREETING, user.get_init_state())
                finally:
                    await factory.aclose()

            asyncio.run(go())
    assert user.calls == 1 and len(_chat_bodies(server)) == 1


def test_auto_keeps_the_async_client_with_a_strategy(server):
    env = {"TAU2_USER_MODEL": "openai/tiny", "TAU2_USER_API_BASE": server.base_url + "/v1"}
    for strategy in ("llm", "react", "verify", "reflection"):  # a local server: async, whatever the strategy
        assert user_client_kind(Tau2Config.from_env({**env, "TAU2_USER_STRATEGY": strategy})) == "async"
    assert user_client_kind(Tau2Config.from_env({"TAU2_USER_MODEL": "gpt-4.1", "TAU2_USER_STRATEGY": "verify"})) \
        == "litellm"  # a provider model: litellm


# (strategy, canned replies, max checks): one case per path through a strategy
CASES = {
    "react": ("react", [f"Thought:\nI need a task.\nUser Response:\n{GOOD}"], "2"),
    "verify-regenerates": ("verify", [OFF, "Classification: false", GOOD, "Classification: true"], "2"),
    "verify-gives-up": ("verify", [OFF, "Classification: false", "Still pizza.", "no verdict"], "2"),
    "reflection": ("reflection", [OFF, "Classification: false", f"Reflection:\nOff topic.\nResponse:\n{GOOD}",
                                  "Classification: false", "Response: none", "Classification: true"], "3"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_both_clients_send_the_same_strategy_requests_byte_for_byte(tiny_engine, small_tokenizer, case):
    """Each client against a fresh server with the same canned replies: the same calls, in the same order, with
    the same bodies; the same message reaches the conversation."""
    strategy, replies, max_checks = CASES[case]
    runs = {}
    for client in CLIENTS:
        with _new_server(tiny_engine) as srv:
            _say(srv, small_tokenizer, *replies)
            user, reply, state = _play(srv, strategy, client, TAU2_USER_STRATEGY_MAX_CHECKS=max_checks)
            runs[client] = (list(srv.raw_bodies), reply.content, user.calls, state.messages[-1].content)
    assert runs["async"] == runs["litellm"]
    bodies, content, calls, _ = runs["async"]
    assert len(bodies) == calls == len(replies)  # every canned reply was asked for, no call more
    assert content == {"react": GOOD, "verify-regenerates": GOOD, "verify-gives-up": "Still pizza.",
                       "reflection": "none"}[case]


def test_a_users_tool_call_is_never_checked_and_tools_go_only_with_its_own_calls(tiny_engine, small_tokenizer):
    """Telecom's user has device tools: its own calls carry them (tool_choice auto), the strategy's checks carry
    none; a tool call it makes is not checked. The same bodies through both clients."""
    ask = AssistantMessage(role="assistant", content="Could you check the status bar of your phone?")
    replies = ["My phone has no data.", "Classification: true", format_tool_call("check_status_bar", {})]
    runs = {}
    for client in CLIENTS:
        with _new_server(tiny_engine) as srv:
            _say(srv, small_tokenizer, *replies)
            user, reply, _ = _play(srv, "verify", client, (GREETING, ask), domain="telecom")
            runs[client] = (list(srv.raw_bodies), reply.tool_calls[0].name, user.calls)
    assert runs["async"] == runs["litellm"]
    bodies, tool, calls = runs["async"]
    assert tool == "check_status_bar" and calls == 3  # message, its check, the tool call (unchecked)
    own, check, call = (json.loads(b) for b in bodies)
    assert own["tool_choice"] == "auto" and call["tool_choice"] == "auto" and "tools" not in check


def test_a_whole_telecom_episode_with_a_strategy_is_the_same_through_both_clients(tiny_engine, small_tokenizer):
    """Episodes as the rollout plays them (blocking over litellm, awaited over the async client), a verify user
    with device tools: a failed check regenerates, the device call runs unchecked, the stop is checked too. The
    same request bodies, conversation and tau2 reward through both clients."""
    policy = ["Could you check the status bar of your phone, please?", "Is there anything else I can do?"]
    replies = ["My phone has no data.", "Classification: true",
               format_tool_call("check_status_bar", {}),
               "Pizza, please.", "Classification: false", "The status bar shows no signal.", "Classification: true",
               "No, thanks. ###STOP###", "Classification: true"]
    task = next(t for t in load_tasks("telecom", "test")
                if not (t.initial_state and t.initial_state.message_history))
    runs = {}
    for client in CLIENTS:
        with _new_server(tiny_engine) as srv:
            _say(srv, small_tokenizer, *replies)
            factory = _factory(srv, "verify", client)
            user = factory(task, environment := build_environment("telecom", True))
            assert type(user) is {"litellm": StrategyUser, "async": AsyncStrategyUser}[client]
            episode = Episode("telecom", task, user, environment=environment, fast=True)
            if client == "litellm":
                episode.start()
                for completion in policy:
                    episode.act(completion)
            else:
                async def go(episode=episode, factory=factory):
                    await episode.astart()
                    for completion in policy:
                        await episode.aact(completion)
                    await factory.aclose()

                asyncio.run(go())
            messages = [m.model_dump(mode="json", exclude={"timestamp", "raw_data"}) for m in episode.messages]
            runs[client] = (list(srv.raw_bodies), messages, user.calls, episode.done, episode.evaluate().reward)
    assert runs["async"] == runs["litellm"]
    bodies, messages, calls, done, _ = runs["async"]
    assert done and calls == len(bodies) == len(replies)
    said = [m["content"] for m in messages if m["role"] == "user" and m["content"]]
    assert said == ["My phone has no data.", "The status bar shows no signal.", "No, thanks. ###STOP###"]
    assert any(m["role"] == "tool" and m["requestor"] == "user" for m in messages)  # the device call ran


def test_parsers():
    assert strip_thought("Thought: x\nUser Response: hello") == "hello"
    assert strip_thought("no markers") == "no markers"
    assert parse_check("reasoning...\nClassification: TRUE") and not parse_check("Classification: false")
    assert not parse_check("") and not parse_check("looks fine")
    assert parse_reflection("Reflection: bad\nResponse: new one") == "new one"
    with pytest.raises(ValueError, match="unknown user strategy"):
        StrategyUser(strategy="shout")
