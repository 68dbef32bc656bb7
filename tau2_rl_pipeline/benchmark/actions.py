"""Parse a policy completion in the Qwen3 tool-call format into tool calls or a plain reply, and render one back.

Qwen3's chat template writes each call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` after
the assistant's text. The rollout feeds a parse error back to the model as its observation, so every malformed
completion maps to one :class:`ParseError` whose message says what was wrong and what is expected; this module
never raises on any input string and scans with ``str.find`` only, so its cost is linear in the input length
(no backtracking regexes: the text comes from a sampled policy and can be anything).

Choices a reader could not guess:
- A ``</tool_call>`` with no opener before it is an ``UNTERMINATED_BLOCK`` error (the tags do not pair up).
- A block whose JSON is valid but not an object (``[1]``, ``"x"``) is ``BAD_JSON``: it is not a call.
- Missing ``"arguments"`` means ``{}`` (as SGLang's Qwen tool parser reads it); ``null`` or any other non-object is
  ``BAD_ARGUMENTS``. ``"arguments"`` may be a JSON string holding an object (OpenAI style).
- JSON is read strictly: ``NaN``/``Infinity``, floats that overflow, and integers over 4300 digits are ``BAD_JSON``
  (such an int would make ``int()`` quadratic when the interpreter's digit limit is off), as is nesting deep enough
  to hit ``RecursionError``.
- A string (key or value, at any depth) holding a lone UTF-16 surrogate, as a JSON escape such as ``"\\ud800"``
  decodes to, is ``BAD_JSON``: it is not a character, and a tool that echoed it would put text no tokenizer or
  UTF-8 encoder accepts into the next observation. An escaped surrogate *pair* is one character and is fine.
- On any error the action has no calls and no content: nothing from a malformed completion is executed.
- The format cannot carry a string argument containing ``</tool_call>`` (the template does not escape it); such a
  block is cut at that tag and fails as ``BAD_JSON``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import Enum

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>")
EXPECTED_FORMAT = '<tool_call>\n{"name": <tool-name>, "arguments": <args-json-object>}\n</tool_call>'

_MAX_QUOTE_CHARS = 200  # model text quoted back in an error message
_MAX_TOOL_LIST_CHARS = 600  # valid-tool list in an UNKNOWN_TOOL message
_MAX_INT_DIGITS = 4300  # CPython's default int<->str limit, enforced whatever the interpreter's setting


class ParseErrorKind(str, Enum):
    BAD_JSON = "bad_json"
    MISSING_NAME = "missing_name"
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"
    UNTERMINATED_BLOCK = "unterminated_block"
    TOO_MANY_CALLS = "too_many_calls"
    EMPTY = "empty"


@dataclass(frozen=True)
class ParseError:
    kind: ParseErrorKind
    message: str  # shown to the model as its error observation


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: dict
    raw: str  # the block's inner text, exactly as sampled


@dataclass(frozen=True)
class ParsedAction:
    content: str  # text outside the tool-call blocks, stripped; "" when none or on error
    tool_calls: tuple[ParsedToolCall, ...]
    error: ParseError | None

    @property
    def is_tool_call(self) -> bool:
        return self.error is None and bool(self.tool_calls)


# ---------------------------------------------------------------------------------------------------------------
# Rendering (byte-identical to the Qwen3 chat template's assistant body)


def format_tool_call(name: str, arguments: dict) -> str:
    """One block as the template writes it; transformers' ``tojson`` is ``json.dumps(ensure_ascii=False)``."""
    rendered_arguments = json.dumps(arguments, ensure_ascii=False)
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + rendered_arguments + "}\n</tool_call>"


def render_assistant_text(content: str, tool_calls: Sequence[tuple[str, dict]]) -> str:
    """The assistant body between ``<|im_start|>assistant\\n`` and ``<|im_end|>``: content, then each block,
    with a newline before a block unless it is the first one and content is empty."""
    parts = [content]
    for i, (name, arguments) in enumerate(tool_calls):
        if content or i > 0:
            parts.append("\n")
        parts.append(format_tool_call(name, arguments))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Parsing


class _BlockError(Exception):
    """Internal: one block failed; carries the error to report."""

    def __init__(self, kind: ParseErrorKind, message: str):
        super().__init__(message)
        self.error = ParseError(kind, message)


def _quote(text: str) -> str:
    """Model text for an error message: bounded, and with lone surrogates replaced so it can always be encoded."""
    if len(text) > _MAX_QUOTE_CHARS:
        text = text[:_MAX_QUOTE_CHARS] + "...[truncated]"
    return "`" + text.encode("utf-8", "replace").decode("utf-8") + "`"


def _strict_int(digits: str) -> int:
    if len(digits.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"integer longer than {_MAX_INT_DIGITS} digits")
    return int(digits)


def _finite_float(digits: str) -> float:
    value = float(digits)
    if not math.isfinite(value):
        raise ValueError(f"number {digits[:20]} is out of range")
    return value


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str) -> object:
    """json.loads that fails only with ValueError (bad JSON, NaN, huge int, a lone surrogate) for any input,
    nesting included."""
    try:
        value = json.loads(text, parse_int=_strict_int, parse_float=_finite_float, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    _reject_lone_surrogates(value)
    return value


def _reject_lone_surrogates(value: object) -> None:
    """ValueError if any string in a decoded JSON value is not valid Unicode; walks with a stack (no recursion:
    the value can be nested as deep as json.loads allows)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise ValueError(f"a string holds a lone surrogate \\u{ord(item[exc.start]):04x}, which is not "
                                     "a character; escape only valid characters or surrogate pairs") from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _block_error(kind: ParseErrorKind, index: int, problem: str, hint: str = "") -> _BlockError:
    hint = hint or f"Write each call as {EXPECTED_FORMAT}"
    return _BlockError(kind, f"Error in tool call #{index + 1}: {problem}. {hint}")


def _tool_list(allowed_tools: Collection[str]) -> str:
    listed = ", ".join(sorted(allowed_tools)) or "(none)"
    if len(listed) > _MAX_TOOL_LIST_CHARS:
        listed = listed[:_MAX_TOOL_LIST_CHARS] + ", ...[truncated]"
    return listed


def _parse_block(raw: str, index: int, allowed_tools: Collection[str] | None) -> ParsedToolCall:
    try:
        call = _loads(raw)
    except ValueError as exc:
        raise _block_error(ParseErrorKind.BAD_JSON, index, f"invalid JSON ({exc}) in {_quote(raw.strip())}") from None
    if not isinstance(call, dict):
        raise _block_error(ParseErrorKind.BAD_JSON, index, f"expected a JSON object, got {_quote(raw.strip())}")
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise _block_error(ParseErrorKind.MISSING_NAME, index, 'missing a non-empty string "name"')
    if allowed_tools is not None and name not in allowed_tools:
        hint = f"Valid tools: {_tool_list(allowed_tools)}"
        raise _block_error(ParseErrorKind.UNKNOWN_TOOL, index, f"unknown tool {_quote(name)}", hint)
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = _loads(arguments)
        except ValueError as exc:
            problem = f'"arguments" string is not a JSON object ({exc}): {_quote(call["arguments"])}'
            raise _block_error(ParseErrorKind.BAD_ARGUMENTS, index, problem) from None
    if not isinstance(arguments, dict):
        problem = f'"arguments" must be a JSON object, got {type(arguments).__name__}'
        raise _block_error(ParseErrorKind.BAD_ARGUMENTS, index, problem)
    return ParsedToolCall(name=name, arguments=arguments, raw=raw)


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, visible reply) of a completion from a thinking model (Qwen3 thinking: ``<think>...</think>``).

    As Qwen3's chat template reads a turn: everything up to the last ``</think>`` is reasoning (its opener may be
    in the prompt, not the completion); a ``<think>`` never closed makes the rest of the turn reasoning (cut by
    max_new_tokens mid-thought). The reply keeps only what follows. Text with no tags is all reply.
    """
    close = text.rfind(THINK_CLOSE)
    if close != -1:
        return text[:close + len(THINK_CLOSE)], text[close + len(THINK_CLOSE):].lstrip("\n")
    opened = text.find(THINK_OPEN)
    if opened != -1:
        return text[opened:], text[:opened]
    return "", text


def _strip_end_of_turn(text: str) -> str:
    stripped = text.rstrip()
    for token in END_OF_TURN_TOKENS:
        if stripped.endswith(token):
            return stripped[: -len(token)]
    return text


def _error(kind: ParseErrorKind, message: str) -> ParsedAction:
    return ParsedAction(content="", tool_calls=(), error=ParseError(kind, message))


def parse_completion(
    text: str, allowed_tools: Collection[str] | None = None, max_tool_calls: int = 16
) -> ParsedAction:
    """Split a completion into its text and tool calls; any malformed block makes the whole action an error.

    ``allowed_tools`` are the names the agent may call (None accepts any name). One pass of ``str.find``.
    """
    text = _strip_end_of_turn(text)
    segments: list[str] = []  # text outside blocks
    calls: list[ParsedToolCall] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        outside = text[pos:] if start == -1 else text[pos:start]
        if TOOL_CALL_CLOSE in outside:
            return _error(
                ParseErrorKind.UNTERMINATED_BLOCK,
                f"Error: found {TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN} before it. "
                f"Write each call as {EXPECTED_FORMAT}",
            )
        segments.append(outside)
        if start == -1:
            break
        index = len(calls)
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end == -1:
            return _error(
                ParseErrorKind.UNTERMINATED_BLOCK,
                f"Error in tool call #{index + 1}: {TOOL_CALL_OPEN} is never closed with {TOOL_CALL_CLOSE}. "
                f"Write each call as {EXPECTED_FORMAT}",
            )
        if index >= max_tool_calls:
            return _error(
                ParseErrorKind.TOO_MANY_CALLS,
                f"Error: more than {max_tool_calls} tool calls in one turn; make at most {max_tool_calls}.",
            )
        try:
            calls.append(_parse_block(text[body_start:end], index, allowed_tools))
        except _BlockError as exc:
            return ParsedAction(content="", tool_calls=(), error=exc.error)
        pos = end + len(TOOL_CALL_CLOSE)
    content = "\n".join(s.strip() for s in segments if s.strip())
    if not content and not calls:
        return _error(ParseErrorKind.EMPTY, f"Error: empty reply. Reply with text or a tool call as {EXPECTED_FORMAT}")
    return ParsedAction(content=content, tool_calls=tuple(calls), error=None)
