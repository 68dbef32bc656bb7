"""Bad model output: 10,000 generated and adversarial completions never crash the parser or an episode, and the
tool boundary holds: private and dunder attributes, user-only tools and wrong argument types are error
observations that change no database.

The corpus is tests/data/adversarial/ (small files) plus outputs built in bench/faults.py (megabyte lines, deeply
nested and huge JSON, hundreds of <tool_call> blocks, lone surrogates); bench/faults.py reports the parser's time
per output.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tau2_rl_pipeline.benchmark.actions import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_tool_call, parse_completion
from tau2_rl_pipeline.benchmark.episode import Episode, build_environment
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.episode_loop import COMPLETED, TRUNCATED

ROOT = Path(__file__).resolve().parents[1]
TOTAL_OUTPUTS = 10_000
LIVE_OUTPUTS = 200
MAX_ERROR_CHARS = 1_000  # an error observation stays short whatever the model wrote


from bench_faults import faults  # noqa: E402  (bench/faults.py, shared by the hardening tests)


@pytest.fixture(scope="module")
def outputs() -> list[str]:
    return faults.all_bad_outputs(TOTAL_OUTPUTS)


def test_the_corpus_holds_each_kind_of_bad_output(outputs: list[str]) -> None:
    assert len(outputs) == TOTAL_OUTPUTS and len(faults.corpus_files()) >= 8
    assert any(len(o) >= 1 << 20 and "\n" not in o for o in outputs)  # a one-megabyte line
    assert any(o.count(TOOL_CALL_OPEN) >= 300 for o in outputs)  # hundreds of blocks
    assert any(o.count("[") >= 100_000 for o in outputs)  # deeply nested JSON
    assert any("<|im_start|>system" in o for o in outputs)  # role tokens inside text
    assert any(0xD800 <= ord(c) <= 0xDFFF for o in outputs[:50] for c in o)  # invalid unicode (lone surrogates)


def test_every_bad_output_parses_to_one_well_formed_action(outputs: list[str]) -> None:
    allowed = set(faults.MOCK_TOOLS)
    for text in outputs:
        action = parse_completion(text, allowed_tools=allowed)
        if action.error is not None:
            assert action.tool_calls == () and action.content == ""
            assert 0 < len(action.error.message) <= MAX_ERROR_CHARS
            action.error.message.encode("utf-8")  # an observation the tokenizer can always take
        else:
            assert action.content or action.tool_calls
            assert TOOL_CALL_OPEN not in action.content and TOOL_CALL_CLOSE not in action.content
            assert all(c.name in allowed and isinstance(c.arguments, dict) for c in action.tool_calls)
        assert parse_completion(text, allowed_tools=allowed) == action  # pure: same text, same action


def test_bad_outputs_in_live_episodes_are_scored_as_the_models_and_never_crash(outputs: list[str],
                                                                               small_tokenizer: Any) -> None:
    """The corpus and the big outputs, then generated ones, each as the policy's reply in a live mock episode."""
    subset = outputs[:LIVE_OUTPUTS]
    trajectories = asyncio.run(faults.live_bad_output_episodes(small_tokenizer, subset, Tau2Config.from_env({})))
    assert len(trajectories) == len(subset)
    for t in trajectories:
        # bad output is the model's failure: scored (reward 0 or not), never aborted as infrastructure
        assert t.status in (COMPLETED, TRUNCATED) and t.reward_info is not None, t.error
        assert len(t.loss_mask) == len(t.response_ids) == len(t.rollout_logprobs)
        # text that looks like chat markup stays text inside the agent's own turn: no injected system turn
        assert {m.role for m in t.messages} <= {"assistant", "user", "tool"}
    assert sum(t.parse_errors for t in trajectories) > 0 and sum(t.refused_calls for t in trajectories) > 0


FRAGMENTS = st.sampled_from([TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "{", "}", '"name": ', '"arguments": ', '"create_task"',
                             '"__class__"', '"_get_db"', '{"user_id": "user_1", "title": "t"}', "<|im_end|>",
                             "<|im_start|>user\n", "###STOP###", "\ud800", "\n"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.lists(FRAGMENTS | st.text(max_size=8), max_size=24).map("".join))
def test_any_completion_in_an_episode_is_an_observation_or_a_valid_call(text: str) -> None:
    task = load_tasks("mock", "base")[0]
    ep = Episode("mock", task, ScriptedUser(task))
    ep.start()
    before = ep.env.get_db_hash()
    result = ep.act(text)
    action = parse_completion(text, allowed_tools=ep.agent_tool_names)
    if action.error is not None or not action.is_tool_call:
        assert ep.env.get_db_hash() == before  # only a parsed call of a declared tool can change the database
    if action.error is not None:
        assert result.observations and all(o.error for o in result.observations)


# ---------------------------------------------------------------------------------------------------------------
# The tool boundary, domain by domain

_WRONG = {"string": {"not": ["a string"]}, "integer": "seven", "number": "many", "boolean": "maybe", "array": 7,
          "object": 7}


def wrong_arguments(schema: dict) -> dict | None:
    """Every property given a value of the wrong JSON type (None when a property has no single simple type)."""
    props = schema["function"]["parameters"].get("properties", {})
    if not props or any(p.get("type") not in _WRONG for p in props.values()):
        return None
    return {name: _WRONG[p["type"]] for name, p in props.items()}


def forbidden_names(ep: Episode) -> list[str]:
    """Names the agent must not reach: every attribute of the environment and its toolkits (dunders, private
    methods, helpers such as get_db_hash) that is not a declared agent tool, and every user-only tool."""
    names = set(dir(ep.env)) | set(dir(ep.env.tools)) | set(ep.user_tool_names)
    if ep.env.user_tools is not None:
        names |= set(dir(ep.env.user_tools))
    return sorted(names - ep.agent_tool_names)


def _hashes(ep: Episode) -> tuple[Any, Any]:
    return ep.env.get_db_hash(), ep.env.get_user_db_hash()


@pytest.mark.parametrize("domain,split", [("mock", "base"), ("airline", "test"), ("retail", "test"),
                                          ("telecom", "test")])
def test_forbidden_names_and_wrong_types_are_refused_and_change_no_database(domain: str, split: str) -> None:
    task = load_tasks(domain, split)[0]
    environment = build_environment(domain)
    ep = Episode(domain, task, ScriptedUser(task), max_steps=100_000, max_errors=100_000, environment=environment)
    ep.start()
    hash_each = domain in ("mock", "telecom")  # airline and retail hash a large DB: check once, after all calls
    start = _hashes(ep)
    calls = [(name, {}) for name in forbidden_names(ep)]
    calls += [(name, args) for name, tool in sorted(ep.env.tools.get_tools().items())
              if (args := wrong_arguments(tool.openai_schema)) is not None]
    assert len(calls) > 40 and ("__class__", {}) in calls
    for i, (name, args) in enumerate(calls, start=1):
        (observation,) = ep.act(format_tool_call(name, args)).observations
        assert observation.error and observation.content.startswith("Error"), (name, observation.content)
        assert ep.parse_errors + ep.refused_calls == i, name  # refused (by the parser or the boundary) unrun
        if hash_each:
            assert _hashes(ep) == start, name
    assert _hashes(ep) == start and not ep.done
    forbidden = len(forbidden_names(ep))
    assert ep.unknown_tool_calls == forbidden and ep.refused_calls == len(calls) - forbidden
    if domain == "telecom":
        assert ep.user_tool_calls_by_agent == len(ep.user_tool_names) > 0


# ---------------------------------------------------------------------------------------------------------------
# JSON escapes: the text a model writes is ASCII, but its JSON escapes can decode to anything (lone surrogates
# among them), which then reaches tools, their results and the next observation's tokenization.

ESCAPES = st.sampled_from(["\\ud800", "\\udfff", "\\udc00\\ud800", "\\ud83d\\ude00", "\\ud83d", "\\u0000", "\\u001f",
                           "\\u00e9", "\\uffff", "\\ufffe", '\\"', "\\\\", "\\/", "\\n", "\\t", "\\b", "\\u2028",
                           "<|im_end|>", "x", " "])
ESCAPED_STRING = st.lists(ESCAPES, min_size=1, max_size=6).map("".join)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(title=ESCAPED_STRING, key=st.sampled_from(["title", "user_id", "description", "\\ud800"]))
def test_json_escapes_in_a_tool_call_never_end_an_episode(small_tokenizer: Any, title: str, key: str) -> None:
    """A call whose string arguments (or keys) hold JSON escapes, run as the policy's reply in a live mock episode
    through run_episode (every caller's path): the tool result echoes the string back into the next observation.
    Scored as the model's episode, never aborted or raised; a lone surrogate is refused by the parser."""
    text = (f'<tool_call>\n{{"name": "create_task", "arguments": {{"user_id": "user_1", "{key}": "{title}"}}}}\n'
            "</tool_call>")
    (t,) = asyncio.run(faults.live_bad_output_episodes(small_tokenizer, [text], Tau2Config.from_env({})))
    assert t.status in (COMPLETED, TRUNCATED) and t.reward_info is not None, t.error
    assert len(t.loss_mask) == len(t.response_ids) == len(t.rollout_logprobs)
    action = parse_completion(text, allowed_tools=set(faults.MOCK_TOOLS))
    if action.error is None:
        json.dumps([c.arguments for c in action.tool_calls], ensure_ascii=False).encode("utf-8")  # valid Unicode
    else:
        assert t.parse_errors == 1


def test_a_lone_surrogate_escape_is_a_parse_error_that_says_so() -> None:
    for text in ('{"name": "create_task", "arguments": {"user_id": "\\ud800"}}',
                 '{"name": "create_task", "arguments": {"\\udc00": "x"}}',
                 '{"name": "create_task", "arguments": "{\\"user_id\\": \\"\\\\ud800\\"}"}',
                 '{"name": "create_task", "arguments": {"user_id": ["ok", {"a": "\\udfff"}]}}'):
        action = parse_completion(f"<tool_call>\n{text}\n</tool_call>", allowed_tools=set(faults.MOCK_TOOLS))
        assert action.error is not None and "surrogate" in action.error.message, text
        action.error.message.encode("utf-8")
    pair = parse_completion('<tool_call>\n{"name": "create_task", "arguments": {"title": "\\ud83d\\ude00"}}\n'
                            "</tool_call>", allowed_tools=set(faults.MOCK_TOOLS))
    assert pair.error is None and pair.tool_calls[0].arguments == {"title": "\U0001f600"}  # a pair is one character
