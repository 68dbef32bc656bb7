"""Tests for tau2_rl_pipeline.benchmark.actions: Qwen3 tool-call parsing, its error observations, and template rendering."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tau2_rl_pipeline.benchmark.actions import (
    END_OF_TURN_TOKENS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedAction,
    ParseErrorKind,
    format_tool_call,
    parse_completion,
    render_assistant_text,
)

AGENT_TOOLS = ("get_customer_by_phone", "get_details_by_id", "transfer_to_human_agents")
USER_TOOL = "toggle_airplane_mode"  # a telecom *user* tool: the agent must not be able to call it

MAX_MESSAGE_CHARS = 1200  # error observations stay short whatever the model wrote


def block(payload: str) -> str:
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def call_block(name: str, arguments: object) -> str:
    return block(json.dumps({"name": name, "arguments": arguments}))


GOOD = call_block("get_customer_by_phone", {"phone_number": "555-123-2002"})

# ---------------------------------------------------------------------------------------------------------------
# Malformed completions: one row per way of being wrong

MALFORMED = [
    ("truncated json", block('{"name": "get_details_by_id", '), ParseErrorKind.BAD_JSON),
    ("not json", block("call get_details_by_id please"), ParseErrorKind.BAD_JSON),
    ("json list, not object", block('[{"name": "get_details_by_id"}]'), ParseErrorKind.BAD_JSON),
    ("NaN", block('{"name": "get_details_by_id", "arguments": {"x": NaN}}'), ParseErrorKind.BAD_JSON),
    ("float overflow", block('{"name": "get_details_by_id", "arguments": {"x": 1e999}}'), ParseErrorKind.BAD_JSON),
    ("5000-digit int", block('{"name": "get_details_by_id", "arguments": {"x": ' + "7" * 5000 + "}}"),
     ParseErrorKind.BAD_JSON),
    ("deep nesting", block("[" * 5000 + "]" * 5000), ParseErrorKind.BAD_JSON),
    ("missing name", block('{"arguments": {"id": "1"}}'), ParseErrorKind.MISSING_NAME),
    ("numeric name", block('{"name": 5, "arguments": {}}'), ParseErrorKind.MISSING_NAME),
    ("empty name", block('{"name": "", "arguments": {}}'), ParseErrorKind.MISSING_NAME),
    ("dunder name", call_block("__class__", {}), ParseErrorKind.UNKNOWN_TOOL),
    ("private name", call_block("_private", {}), ParseErrorKind.UNKNOWN_TOOL),
    ("user tool", call_block(USER_TOOL, {}), ParseErrorKind.UNKNOWN_TOOL),
    ("arguments list", call_block("get_details_by_id", [1, 2]), ParseErrorKind.BAD_ARGUMENTS),
    ("arguments number", call_block("get_details_by_id", 3), ParseErrorKind.BAD_ARGUMENTS),
    ("arguments null", call_block("get_details_by_id", None), ParseErrorKind.BAD_ARGUMENTS),
    ("arguments plain string", call_block("get_details_by_id", "id=1"), ParseErrorKind.BAD_ARGUMENTS),
    ("arguments string of list", call_block("get_details_by_id", "[1]"), ParseErrorKind.BAD_ARGUMENTS),
    ("arguments string too deep", call_block("get_details_by_id", "[" * 5000), ParseErrorKind.BAD_ARGUMENTS),
    ("never closed", f"Let me look.\n{TOOL_CALL_OPEN}\n" + '{"name": "get_details_by_id", "arguments": {}}',
     ParseErrorKind.UNTERMINATED_BLOCK),
    ("stray closer", f'{{"name": "get_details_by_id"}}\n{TOOL_CALL_CLOSE}', ParseErrorKind.UNTERMINATED_BLOCK),
    ("closer between blocks", GOOD + TOOL_CALL_CLOSE + GOOD, ParseErrorKind.UNTERMINATED_BLOCK),
    ("too many calls", "\n".join([GOOD] * 17), ParseErrorKind.TOO_MANY_CALLS),
    ("empty string", "", ParseErrorKind.EMPTY),
    ("whitespace", "  \n\t ", ParseErrorKind.EMPTY),
    ("only end of turn", "\n<|im_end|>", ParseErrorKind.EMPTY),
    ("only endoftext", "<|endoftext|>", ParseErrorKind.EMPTY),
]


@pytest.mark.parametrize("text,kind", [row[1:] for row in MALFORMED], ids=[row[0] for row in MALFORMED])
def test_malformed_completion_is_one_error_and_executes_nothing(text: str, kind: ParseErrorKind) -> None:
    action = parse_completion(text, allowed_tools=AGENT_TOOLS)
    assert action.error is not None and action.error.kind is kind
    assert action.tool_calls == () and action.content == "" and not action.is_tool_call
    assert action.error.message.startswith("Error") and len(action.error.message) <= MAX_MESSAGE_CHARS


def test_error_names_the_failing_block_and_drops_the_good_ones() -> None:
    text = "Checking.\n" + GOOD + "\n" + block('{"name": "get_details_by_id", "arguments": {') + "\n" + GOOD
    action = parse_completion(text, allowed_tools=AGENT_TOOLS)
    assert action.error is not None and action.error.kind is ParseErrorKind.BAD_JSON
    assert "tool call #2" in action.error.message
    assert action.tool_calls == ()


def test_messages_say_what_format_is_expected() -> None:
    bad_json = parse_completion(block("{oops"), allowed_tools=AGENT_TOOLS).error
    assert bad_json is not None and '{"name": <tool-name>, "arguments": <args-json-object>}' in bad_json.message
    assert "{oops" in bad_json.message  # the model sees what it wrote


def test_unknown_tool_message_lists_the_valid_tools_only() -> None:
    error = parse_completion(call_block(USER_TOOL, {}), allowed_tools=AGENT_TOOLS).error
    assert error is not None
    assert all(name in error.message for name in AGENT_TOOLS)
    assert error.message.count(USER_TOOL) == 1  # quoted as the offender, never offered as valid


def test_messages_stay_bounded_for_huge_model_text_and_tool_lists() -> None:
    huge_garbage = parse_completion(block("x" * 100_000)).error
    huge_name = parse_completion(call_block("n" * 100_000, {}), allowed_tools=AGENT_TOOLS).error
    many_tools = parse_completion(call_block("nope", {}), allowed_tools=[f"tool_{i:05d}" for i in range(5000)]).error
    for error in (huge_garbage, huge_name, many_tools):
        assert error is not None and len(error.message) <= MAX_MESSAGE_CHARS
    assert "truncated" in huge_garbage.message and "truncated" in many_tools.message


def test_lone_surrogates_never_reach_the_message_unencodable() -> None:
    error = parse_completion(block('{"name": "\ud800'), allowed_tools=AGENT_TOOLS).error
    assert error is not None and error.kind is ParseErrorKind.BAD_JSON
    error.message.encode("utf-8")  # would raise UnicodeEncodeError on a lone surrogate


# ---------------------------------------------------------------------------------------------------------------
# Well-formed completions


def test_one_call() -> None:
    action = parse_completion(GOOD, allowed_tools=AGENT_TOOLS)
    assert action.error is None and action.is_tool_call and action.content == ""
    (call,) = action.tool_calls
    assert call.name == "get_customer_by_phone" and call.arguments == {"phone_number": "555-123-2002"}
    assert call.raw == '\n{"name": "get_customer_by_phone", "arguments": {"phone_number": "555-123-2002"}}\n'


def test_several_calls_with_text_around_them() -> None:
    second = call_block("get_details_by_id", {"id": "L1001", "extra": {"nested": [1, "ü"]}})
    text = f"  I will check two things.\n{GOOD}\nand then\n{second}\n  Done.  "
    action = parse_completion(text, allowed_tools=AGENT_TOOLS)
    assert action.error is None
    assert [c.name for c in action.tool_calls] == ["get_customer_by_phone", "get_details_by_id"]
    assert action.tool_calls[1].arguments == {"id": "L1001", "extra": {"nested": [1, "ü"]}}
    assert action.content == "I will check two things.\nand then\nDone."


def test_arguments_as_a_json_string_holding_an_object() -> None:
    text = call_block("get_details_by_id", json.dumps({"id": "L1001"}))
    action = parse_completion(text, allowed_tools=AGENT_TOOLS)
    assert action.error is None and action.tool_calls[0].arguments == {"id": "L1001"}


def test_missing_arguments_means_no_arguments() -> None:
    action = parse_completion(block('{"name": "transfer_to_human_agents"}'), allowed_tools=AGENT_TOOLS)
    assert action.error is None and action.tool_calls[0].arguments == {}


@pytest.mark.parametrize("end", [*END_OF_TURN_TOKENS, "<|im_end|>\n"])
def test_a_trailing_end_of_turn_token_is_stripped(end: str) -> None:
    action = parse_completion(GOOD + end, allowed_tools=AGENT_TOOLS)
    assert action.error is None and action.content == "" and len(action.tool_calls) == 1
    reply = parse_completion("Your flight is booked." + end)
    assert reply.error is None and reply.content == "Your flight is booked." and not reply.is_tool_call


def test_plain_reply_is_content_without_calls() -> None:
    action = parse_completion("Could you give me your user id?", allowed_tools=AGENT_TOOLS)
    assert action == ParsedAction(content="Could you give me your user id?", tool_calls=(), error=None)


def test_max_tool_calls_is_the_limit() -> None:
    assert parse_completion("\n".join([GOOD] * 3), max_tool_calls=3).error is None
    error = parse_completion("\n".join([GOOD] * 3), max_tool_calls=2).error
    assert error is not None and error.kind is ParseErrorKind.TOO_MANY_CALLS and "2" in error.message


def test_no_allowed_tools_accepts_any_name_and_an_empty_set_accepts_none() -> None:
    assert parse_completion(call_block(USER_TOOL, {})).tool_calls[0].name == USER_TOOL
    error = parse_completion(call_block(USER_TOOL, {}), allowed_tools=set()).error
    assert error is not None and error.kind is ParseErrorKind.UNKNOWN_TOOL


# ---------------------------------------------------------------------------------------------------------------
# Properties: never raises, always well-formed, rendering round-trips

FRAGMENTS = [TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"', "\\",
             '"get_details_by_id"', '"__class__"', "null", "1e999", "NaN", "\n", " ", "<|im_end|>", "\ud800", "é"]
FRAGMENT_TEXT = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=5), max_size=40).map("".join)


def assert_well_formed(action: ParsedAction) -> None:
    if action.error is not None:
        assert isinstance(action.error.kind, ParseErrorKind) and action.error.message
        assert action.tool_calls == () and action.content == "" and not action.is_tool_call
        assert len(action.error.message) <= MAX_MESSAGE_CHARS
        action.error.message.encode("utf-8")
    else:
        assert action.content or action.tool_calls
        assert action.content == action.content.strip()
        assert action.is_tool_call == bool(action.tool_calls)
        for call in action.tool_calls:
            assert call.name in AGENT_TOOLS and isinstance(call.arguments, dict)


@settings(max_examples=300, deadline=None)
@given(text=st.text() | FRAGMENT_TEXT)
def test_any_text_parses_to_a_well_formed_action(text: str) -> None:
    assert_well_formed(parse_completion(text, allowed_tools=AGENT_TOOLS))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
ARGUMENTS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4).filter(
    lambda args: TOOL_CALL_CLOSE not in json.dumps(args, ensure_ascii=False)  # the format cannot carry this
)
CONTENT = st.text().map(str.strip).filter(
    lambda c: TOOL_CALL_OPEN not in c and TOOL_CALL_CLOSE not in c and not c.endswith(END_OF_TURN_TOKENS)
)
CALLS = st.lists(st.tuples(st.sampled_from(AGENT_TOOLS), ARGUMENTS), max_size=4)


@settings(max_examples=300, deadline=None)
@given(content=CONTENT, calls=CALLS)
def test_render_then_parse_round_trips(content: str, calls: list[tuple[str, dict]]) -> None:
    action = parse_completion(render_assistant_text(content, calls) + "<|im_end|>", allowed_tools=AGENT_TOOLS)
    if not content and not calls:
        assert action.error is not None and action.error.kind is ParseErrorKind.EMPTY
        return
    assert action.error is None
    assert action.content == content
    assert [(c.name, c.arguments) for c in action.tool_calls] == calls


def test_pathological_megabyte_inputs_end_in_errors() -> None:
    deep_args = '{"name": "get_details_by_id", "arguments": "' + "[" * 1_000_000 + '"}'
    cases = {
        TOOL_CALL_OPEN * 100_000: ParseErrorKind.UNTERMINATED_BLOCK,
        TOOL_CALL_CLOSE * 100_000: ParseErrorKind.UNTERMINATED_BLOCK,
        block("{" * 1_000_000): ParseErrorKind.BAD_JSON,
        block("[" * 1_000_000): ParseErrorKind.BAD_JSON,
        block('"' + "a" * 1_000_000): ParseErrorKind.BAD_JSON,
        block(deep_args): ParseErrorKind.BAD_ARGUMENTS,
        (TOOL_CALL_OPEN + TOOL_CALL_CLOSE) * 100_000: ParseErrorKind.BAD_JSON,
        "\n".join([GOOD] * 20_000): ParseErrorKind.TOO_MANY_CALLS,
    }
    for text, kind in cases.items():
        error = parse_completion(text, allowed_tools=AGENT_TOOLS).error
        assert error is not None and error.kind is kind, text[:40]


def test_huge_integers_are_rejected_even_with_the_interpreter_digit_limit_off() -> None:
    """With the limit off, int() on a million digits is quadratic; the parser must refuse before converting."""
    text = block('{"name": "get_details_by_id", "arguments": {"n": ' + "9" * 1_000_000 + "}}")
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        error = parse_completion(text, allowed_tools=AGENT_TOOLS).error
    finally:
        sys.set_int_max_str_digits(previous)
    assert error is not None and error.kind is ParseErrorKind.BAD_JSON and "4300" in error.message


# ---------------------------------------------------------------------------------------------------------------
# Byte identity with the real Qwen3 chat template


def template_assistant_body(tokenizer, content: str, calls: list[tuple[str, dict]]) -> str:
    """What the real template writes for one assistant turn, between its header and <|im_end|>."""
    message: dict = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": args}} for name, args in calls
        ]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, message], tokenize=False)
    prefix = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert rendered.startswith(prefix) and rendered.endswith("<|im_end|>\n")
    return rendered[len(prefix) : -len("<|im_end|>\n")]


TRICKY_ARGS = {
    "city": 'Zürich — "quoted" <b>&\' \\ back',
    "nested": {"list": [1, 2.5, None, True, False, -0.0, 1e16], "empty": {}, "ctrl": "a\nb\tc\u2028\x00"},
    "emoji": "😀",
    "order": {"z": 1, "a": 2},
}
TEMPLATE_CASES = [
    ("", [("get_details_by_id", TRICKY_ARGS)]),
    ("Let me check.", [("get_details_by_id", TRICKY_ARGS), ("transfer_to_human_agents", {})]),
    ("", [("get_customer_by_phone", {"phone_number": "1"}), ("get_details_by_id", {"id": "L1"})]),
    ("Just a reply, no calls.", []),
]


@pytest.mark.parametrize("content,calls", TEMPLATE_CASES)
def test_rendering_is_byte_identical_to_the_chat_template(qwen3_tokenizer, content, calls) -> None:
    body = template_assistant_body(qwen3_tokenizer, content, calls)
    assert render_assistant_text(content, calls) == body
    action = parse_completion(body + "<|im_end|>", allowed_tools=AGENT_TOOLS)
    assert action.content == content and [(c.name, c.arguments) for c in action.tool_calls] == calls


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(AGENT_TOOLS), args=ARGUMENTS)
def test_format_tool_call_matches_the_template_for_any_arguments(qwen3_tokenizer, name, args) -> None:
    assert format_tool_call(name, args) == template_assistant_body(qwen3_tokenizer, "", [(name, args)])
