"""The async user client (tau2_rl_pipeline/benchmark/user_client.py) sends what tau2's UserSimulator over litellm sends, byte
for byte, and reads the answers as tau2 does; and a policy's reasoning stays private.

Each domain's episode is driven twice with the same policy completions and the same canned user replies (a
loopback server scripted with token ids; telecom's user calls a device tool): once through tau2's own
`UserSimulator` (litellm, blocking) and once through `AsyncUserSimulator` (awaited on a loop), each against a fresh
server that records every request body. The bodies, the tau2 messages and tau2's rewards must be equal. The whole
file runs again on tau2-bench 1.0.1 (tests/test_tau2_v1.py), whose user turn differs in places (tau2_version.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

import pytest
from support.loopback_server import LoopbackServer
from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage

from tau2_rl_pipeline.benchmark.actions import format_tool_call, render_assistant_text, split_reasoning
from tau2_rl_pipeline.benchmark.episode import Episode, build_environment
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import USER_ASKS_AGAIN_WHEN_EMPTY, V1
from tau2_rl_pipeline.benchmark.user_client import AsyncUserSimulator, user_request_payload
from tau2_rl_pipeline.benchmark.users import UserConfigError, make_user_factory, user_client_kind
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.engines import SamplingParams, SGLangEngine
from tau2_rl_pipeline.rollout.episode_loop import COMPLETED, Driver, EpisodeSpec, run_episode

# domain -> (task split, a read-only agent tool and its arguments)
DOMAINS = {"mock": ("base", "get_users", {}), "airline": ("test", "list_all_airports", {}),
           "retail": ("test", "list_all_product_types", {}),
           "telecom": ("test", "get_customer_by_phone", {"phone_number": "555-123-2002"})}
USER_CLIENTS = ("litellm", "async")  # tau2's UserSimulator over litellm; user_client.py's AsyncUserSimulator
SECRET = "my private plan"  # written only inside the policy's reasoning
SEED = 11


def first_task(domain: str) -> Any:
    tasks = load_tasks(domain, DOMAINS[domain][0])
    return next(t for t in tasks if not (t.initial_state and t.initial_state.message_history))


def policy_turns(domain: str) -> list[str]:
    """The agent's completions: a tool call, a question, then a reply whose reasoning holds a tool call."""
    _, tool, args = DOMAINS[domain]
    hidden = format_tool_call(tool, args)
    return [render_assistant_text("Let me look.", [(tool, args)]),
            "Could you check the status bar of your phone, please? Merci, café ☃.",
            f"<think>\n{SECRET}: call {hidden}\n</think>\n\nIs there anything else I can do?"]


def user_replies(domain: str) -> list[str]:
    """The canned user: its request, then (telecom) a device tool call and what it saw, then a stop."""
    device = [format_tool_call("check_status_bar", {}), "It shows the battery at 80%."] if domain == "telecom" \
        else ["I checked, it looks fine."]
    return ["Hi! I need help with my account, s'il vous plaît: naïve ☃.", *device, "No, thanks. ###STOP###"]


def llm_config(server: LoopbackServer, client: str, **overrides: Any) -> Tau2Config:
    return Tau2Config.from_env({}, user_model="openai/" + server.model_name, user_api_base=server.base_url + "/v1",
                               user_client=client, user_max_retries=1, **overrides)


def drive(domain: str, server: LoopbackServer, client: str, seed: int | None = SEED) -> Episode:
    """One whole episode with the user over `client` against `server` (scripted with the canned replies)."""
    tokenizer = server.tokenizer
    server.script(*[tokenizer.encode(r + tokenizer.eos_token, add_special_tokens=False)
                    for r in user_replies(domain)])
    task, environment = first_task(domain), build_environment(domain, fast=True)
    factory = make_user_factory("llm", llm_config(server, client))
    user = factory(task, environment)
    if seed is not None:
        user.set_seed(seed)
    episode = Episode(domain, task, user, environment=environment, fast=True)
    if client == "litellm":
        episode.start()
        for completion in policy_turns(domain):
            if not episode.done:
                episode.act(completion)
    else:
        async def go() -> None:
            await episode.astart()
            for completion in policy_turns(domain):
                if not episode.done:
                    await episode.aact(completion)
            await factory.aclose()

        asyncio.run(go())
    return episode


@functools.cache
def _pair(domain: str, engine: Any, seed: int | None = SEED) -> dict[str, tuple[Episode, list[bytes]]]:
    out = {}
    for client in USER_CLIENTS:
        with LoopbackServer(engine) as server:
            episode = drive(domain, server, client, seed)
            out[client] = (episode, list(server.raw_bodies))
    return out


@pytest.fixture
def pair(tiny_engine: Any):
    return lambda domain: _pair(domain, tiny_engine)


def comparable(episode: Episode) -> list[dict]:
    """tau2's messages without what differs by nature (timestamps; litellm's dump of its response object)."""
    return [m.model_dump(mode="json", exclude={"timestamp", "raw_data"}) for m in episode.messages]


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_the_async_client_sends_tau2s_requests_byte_for_byte(pair, domain: str) -> None:
    runs = pair(domain)
    litellm_bodies, async_bodies = runs["litellm"][1], runs["async"][1]
    assert len(litellm_bodies) == len(user_replies(domain))  # every user turn went out, through each client
    assert async_bodies == litellm_bodies
    first = json.loads(async_bodies[0])
    assert first["seed"] == SEED and first["temperature"] == 0.0
    assert first["messages"][0]["role"] == "system" and "<scenario>" in first["messages"][0]["content"]
    environment = build_environment(domain, fast=True)  # the user's tools: telecom's device; 1.0.1's mock has some
    user_tools = {t.name for t in environment.get_user_tools()} if environment.user_tools is not None else set()
    if user_tools:  # they go with every request
        assert first["tool_choice"] == "auto" and {t["function"]["name"] for t in first["tools"]} == user_tools
    else:
        assert "tools" not in first
    if domain == "telecom":
        assert "check_status_bar" in user_tools
        assert json.loads(async_bodies[2])["messages"][-1]["role"] == "tool"  # the device's answer, role-flipped


def test_the_requests_are_the_same_without_a_seed(tiny_engine: Any) -> None:
    """A run with no sampling seed sends none (slime may not set one): litellm's parameter order without it."""
    runs = _pair("telecom", tiny_engine, None)
    assert runs["async"][1] == runs["litellm"][1]
    assert "seed" not in json.loads(runs["async"][1][0])


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_the_same_replies_make_the_same_episode_and_rewards(pair, domain: str) -> None:
    runs = pair(domain)
    (sync, _), (asynchronous, _) = runs["litellm"], runs["async"]
    assert sync.done and asynchronous.done and sync.termination_reason == asynchronous.termination_reason
    assert comparable(asynchronous) == comparable(sync)
    user_calls = [c for m in asynchronous.messages if isinstance(m, UserMessage) for c in m.tool_calls or []]
    assert [c.name for c in user_calls] == (["check_status_bar"] if domain == "telecom" else [])
    assert asynchronous.evaluate().model_dump(mode="json") == sync.evaluate().model_dump(mode="json")


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_reasoning_is_never_seen_by_the_user_or_the_evaluator_nor_run(pair, domain: str) -> None:
    """The last policy turn reasons with a tool call inside `<think>...</think>`: through either client, the user
    simulator's requests, tau2's messages (what its evaluator reads) and the agent's chat never hold it, and the
    call never runs."""
    for episode, bodies in pair(domain).values():
        assert all(SECRET not in body.decode() for body in bodies)
        assert json.loads(bodies[-1])["messages"][-1]["content"] == "Is there anything else I can do?"
        assert all(SECRET not in json.dumps(m.model_dump(mode="json")) for m in episode.evaluated_messages())
        assert all(SECRET not in str(turn.get("content")) for turn in episode.agent_view())
        agent_calls = [c for m in episode.messages if isinstance(m, AssistantMessage) for c in m.tool_calls or []]
        assert len(agent_calls) == 1  # the first turn's; the one written inside the reasoning never ran
        assert sum(isinstance(m, ToolMessage) and m.requestor == "assistant" for m in episode.messages) == 1


def test_reasoning_stays_in_the_sampled_tokens(tiny_engine: Any) -> None:
    """Token in, token out: the rollout trains on the reasoning as sampled, while tau2's side never sees it."""
    domain = "mock"
    with LoopbackServer(tiny_engine) as user_server, LoopbackServer(tiny_engine) as policy_server:
        tokenizer = policy_server.tokenizer
        policy_server.script(*[tokenizer.encode(t + tokenizer.eos_token, add_special_tokens=False)
                               for t in policy_turns(domain)])
        user_server.script(*[tokenizer.encode(r + tokenizer.eos_token, add_special_tokens=False)
                             for r in user_replies(domain)])
        cfg = llm_config(user_server, "auto", episode_workers=0)
        factory = make_user_factory("llm", cfg)
        task, environment = first_task(domain), build_environment(domain, fast=True)

        async def go():
            engine = SGLangEngine(policy_server.base_url, max_retries=0)
            try:
                return await run_episode(
                    EpisodeSpec.from_config(domain, task, factory(task, environment), cfg, environment=environment),
                    Driver.from_config(engine, tokenizer, SamplingParams(
                        max_new_tokens=512, stop_token_ids=(tokenizer.eos_token_id,), seed=SEED), cfg))
            finally:
                await engine.aclose()
                await factory.aclose()

        traj = asyncio.run(go())
        bodies = list(user_server.raw_bodies)
    assert traj.status == COMPLETED and traj.termination_reason == "user_stop", traj.error
    sampled = tokenizer.decode([t for t, m in zip(traj.response_ids, traj.loss_mask) if m],
                               skip_special_tokens=False)
    assert f"<think>\n{SECRET}" in sampled
    assert len(bodies) == len(user_replies(domain)) and all(SECRET not in b.decode() for b in bodies)
    assert all(SECRET not in json.dumps(m.model_dump(mode="json")) for m in traj.messages)
    assert traj.reward_info is not None and "user_s" in traj.timings


def test_split_reasoning_reads_a_turn_as_qwen3s_template_does() -> None:
    assert split_reasoning("<think>\nplan\n</think>\n\nHello") == ("<think>\nplan\n</think>", "Hello")
    assert split_reasoning("plan only\n</think>\n\nHello") == ("plan only\n</think>", "Hello")  # opener in prompt
    assert split_reasoning("Hi <think>cut short by max_new_tokens") == ("<think>cut short by max_new_tokens", "Hi ")
    assert split_reasoning("no tags at all") == ("", "no tags at all")


# ---------------------------------------------------------------------------------------------------------------
# The setting


def test_auto_picks_the_async_client_for_a_local_openai_server_only() -> None:
    local = {"TAU2_USER_API_BASE": "http://127.0.0.1:30001/v1", "TAU2_USER_MODEL": "openai/Qwen/Qwen3-4B"}
    assert user_client_kind(Tau2Config.from_env(local)) == "async"
    assert user_client_kind(Tau2Config.from_env({**local, "TAU2_USER_CLIENT": "litellm"})) == "litellm"
    assert user_client_kind(Tau2Config.from_env({})) == "litellm"  # gpt-4.1 through its provider
    assert user_client_kind(Tau2Config.from_env({**local, "TAU2_USER_MODEL": "hosted_vllm/q"})) == "litellm"
    with pytest.raises(UserConfigError, match="TAU2_USER_API_BASE"):
        make_user_factory("llm", Tau2Config.from_env({"TAU2_USER_CLIENT": "async"}))


def test_the_async_client_runs_with_episode_work_on_the_loop_where_litellm_refuses() -> None:
    local = {"TAU2_USER_API_BASE": "http://127.0.0.1:30001/v1", "TAU2_USER_MODEL": "openai/q",
             "TAU2_EPISODE_WORKERS": "0"}
    assert make_user_factory("llm", Tau2Config.from_env(local)).client is not None
    with pytest.raises(UserConfigError, match="TAU2_EPISODE_WORKERS=0"):
        make_user_factory("llm", Tau2Config.from_env({**local, "TAU2_USER_CLIENT": "litellm"}))


@pytest.mark.parametrize("bound", [1, 3])
def test_user_requests_in_flight_are_bounded(tiny_engine: Any, bound: int) -> None:
    with LoopbackServer(tiny_engine, latency_s=0.2) as server:
        tokenizer = server.tokenizer
        server.script(*[tokenizer.encode("Hi." + tokenizer.eos_token, add_special_tokens=False)] * 6)
        factory = make_user_factory("llm", llm_config(server, "async", user_max_in_flight=bound))
        task = first_task("mock")
        users = [factory(task, build_environment("mock")) for _ in range(6)]

        async def go() -> None:
            greeting = AssistantMessage(role="assistant", content="Hi! How can I help you today?")
            await asyncio.gather(*(u.agenerate_next_message(greeting, u.get_init_state()) for u in users))
            await factory.aclose()

        asyncio.run(go())
    assert isinstance(users[0], AsyncUserSimulator)
    assert server.count("/v1/chat/completions") == 6 and server.max_concurrent == bound


def answers_through(client: str, tiny_engine: Any, replies: list[str],
                    turns: list[AssistantMessage]) -> tuple[list[tuple], list[bytes]]:
    """The user's answer to each agent turn through `client` (its text, or tau2's refusal: type and first words),
    and the request bodies the server received, given the canned `replies` ("" = an empty answer)."""
    with LoopbackServer(tiny_engine) as server:
        tokenizer = server.tokenizer
        server.script(*[tokenizer.encode(r + tokenizer.eos_token, add_special_tokens=False) for r in replies])
        factory = make_user_factory("llm", llm_config(server, client))
        user = factory(first_task("mock"), build_environment("mock"))
        state, outcomes = user.get_init_state(), []

        async def answer(turn: AssistantMessage) -> Any:
            if client == "async":
                return await user.agenerate_next_message(turn, state)
            return user.generate_next_message(turn, state)

        async def go() -> None:
            for turn in turns:
                try:
                    reply, _ = await answer(turn)
                    outcomes.append(("reply", reply.content))
                except (AssertionError, ValueError) as e:  # tau2 1.0.1's refusals; the episode ends aborted
                    outcomes.append(("error", type(e).__name__, str(e)[:40]))
            await factory.aclose()

        asyncio.run(go())
        return outcomes, list(server.raw_bodies)


def test_an_empty_answer_is_handled_as_the_installed_tau2_does(tiny_engine: Any) -> None:
    """26.3 asks again (the same request) and goes on; 1.0.1 returns the empty answer, then refuses the next
    request (tau2's own history validation, before anything is sent). The async client does what litellm does."""
    turns = [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
             AssistantMessage(role="assistant", content="Anything else?")]
    runs = {client: answers_through(client, tiny_engine, ["", "Hello.", "Bye."], turns) for client in USER_CLIENTS}
    assert runs["async"] == runs["litellm"]
    outcomes, bodies = runs["async"]
    if USER_ASKS_AGAIN_WHEN_EMPTY:  # 26.3
        assert outcomes == [("reply", "Hello."), ("reply", "Bye.")] and len(bodies) == 3 and bodies[0] == bodies[1]
    else:  # 1.0.1
        assert outcomes[0] == ("reply", "") and outcomes[1][:2] == ("error", "AssertionError") and len(bodies) == 1


@pytest.mark.skipif(not V1, reason="tau2 1.0.1 only: 26.3's messages carry no audio")
def test_an_audio_agent_turn_is_refused_as_tau2_1_0_1_refuses_it(tiny_engine: Any) -> None:
    turns = [AssistantMessage(role="assistant", content=None, is_audio=True, audio_content="AAAA")]
    runs = {client: answers_through(client, tiny_engine, ["Hello."], turns) for client in USER_CLIENTS}
    assert runs["async"] == runs["litellm"]
    outcomes, bodies = runs["async"]
    assert outcomes == [("error", "ValueError", "Assistant message cannot be audio. Use V")] and bodies == []


def test_an_empty_agent_turn_reaches_the_user_as_the_installed_tau2_records_it(tiny_engine: Any) -> None:
    """26.3 records every message the user answers; 1.0.1 leaves out one with neither text nor tool calls."""
    turns = [AssistantMessage(role="assistant", content="Hi! How can I help you today?"),
             AssistantMessage(role="assistant", content="")]
    runs = {client: answers_through(client, tiny_engine, ["Hello.", "Bye."], turns) for client in USER_CLIENTS}
    assert runs["async"] == runs["litellm"]
    outcomes, bodies = runs["async"]
    assert outcomes == [("reply", "Hello."), ("reply", "Bye.")]
    sent = json.loads(bodies[1])["messages"][1:]
    assert sent[:2] == [{"role": "user", "content": "Hi! How can I help you today?"},
                        {"role": "assistant", "content": "Hello."}]
    assert sent[2:] == ([] if V1 else [{"role": "user", "content": ""}])


def test_the_payload_follows_the_users_llm_args() -> None:
    from tau2.data_model.message import SystemMessage

    messages = [SystemMessage(role="system", content="s"), UserMessage(role="user", content="u")]
    payload = user_request_payload("openai/m", messages, None, {"temperature": 0.5, "extra_body": {"x": 1}})
    assert list(payload) == ["messages", "model", "temperature", "x"] and payload["model"] == "m"
    assert "seed" not in payload


def test_a_blocking_caller_of_the_async_user_gets_tau2s_own_path(tiny_engine: Any) -> None:
    """The gym wrapper and scripts call `generate_next_message`: tau2's litellm call, the same request."""
    with LoopbackServer(tiny_engine) as server:
        tokenizer = server.tokenizer
        server.script(*[tokenizer.encode("Hello." + tokenizer.eos_token, add_special_tokens=False)] * 2)
        factory = make_user_factory("llm", llm_config(server, "async"))
        user = factory(first_task("mock"), build_environment("mock"))
        greeting = AssistantMessage(role="assistant", content="Hi! How can I help you today?")
        blocking, _ = user.generate_next_message(greeting, user.get_init_state())

        async def go():
            reply, _ = await user.agenerate_next_message(greeting, user.get_init_state())
            await factory.aclose()
            return reply

        awaited = asyncio.run(go())
        bodies = list(server.raw_bodies)
    assert isinstance(user, AsyncUserSimulator) and blocking.content == awaited.content == "Hello."
    assert bodies[0] == bodies[1]
