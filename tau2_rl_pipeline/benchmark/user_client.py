"""tau2's LLM user simulator on the event loop, for a model served behind an OpenAI-compatible API.

tau2's `UserSimulator` calls litellm, synchronously: 5-7 ms of client CPU per call (the OpenAI SDK's request
transform, litellm's cost and logging machinery; bench/profiles/user_turn_litellm.txt) on a worker thread that
contends with the event loop for the GIL. `AsyncUserSimulator` is the same simulator (the installed tau2's class:
its system prompt from the guidelines and the task's scenario, its state, its role flip, its stop test) whose model
call is one aiohttp request through `http_post.RetryingPost`, awaited on the event loop. It follows whichever tau2
is installed, 26.3 or 1.0.1: where their user turns differ (what the state records of the message answered, the
request's validation, the re-ask of an empty answer, `raw_data`), tau2_version.py says how.

What it sends is what litellm sends for tau2's `generate(...)`, byte for byte: tau2's own message conversion
(`to_litellm_messages`) with None fields left out as litellm leaves them out, the model name after `openai/`,
seed, temperature, the user's tools with tool_choice "auto" (telecom; 1.0.1's mock too), then `extra_body`;
compact JSON, UTF-8 unescaped (tests/test_user_client.py records both clients over whole episodes and compares
the bodies, on both tau2s). What it reads is what tau2 reads: the first choice's content and tool calls
(arguments parsed from JSON), the requestor of each call flipped to "user"; on 26.3 an empty answer is asked again
up to `num_retries` times.
Differences, on purpose: a malformed answer (bad JSON, tool-call arguments that do not parse) is retried with
backoff like a transport failure, where tau2 raises at once; `cost` is 0.0 (a local server; litellm prices an
unknown model at 0.0 too); `raw_data` is the answer as received (the first choice on 26.3, the whole response on
1.0.1), not litellm's object dump.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tau2.data_model.message import Message, ToolCall, UserMessage
from tau2.user.user_simulator import UserSimulator
from tau2.utils.llm_utils import to_litellm_messages

from tau2_rl_pipeline.benchmark.tau2_version import (
    USER_ASKS_AGAIN_WHEN_EMPTY,
    USER_RAW_DATA_IS_RESPONSE,
    UserState,
    ValidUserInputMessage,
    check_user_request,
    record_user_input,
)
from tau2_rl_pipeline.http_post import RequestFailed, RetryingPost, split_urls

logger = logging.getLogger(__name__)
OPENAI_PREFIX = "openai/"
# litellm's order of the optional parameters tau2's user sends (after messages and model); extra_body comes last
PARAM_ORDER = ("seed", "temperature", "tool_choice", "tools")


class UserClientError(RuntimeError):
    """The user simulator's server did not answer usably after retries, or refused the request."""


def served_model_name(model: str) -> str:
    """The model name the server sees: litellm's `openai/<name>` route sends `<name>`."""
    return model.removeprefix(OPENAI_PREFIX)


def api_message(message: dict[str, Any]) -> dict[str, Any]:
    """One message of tau2's `to_litellm_messages` as litellm puts it on the wire: None fields left out."""
    return {k: v for k, v in message.items() if v is not None}


def user_request_payload(model: str, messages: list[Message], schemas: list[dict] | None, llm_args: dict) -> dict:
    """The chat-completions payload litellm sends for tau2's `generate(model, messages, tools, **llm_args)`, the
    tools given as their `openai_schema`s."""
    params = {"seed": llm_args.get("seed"), "temperature": llm_args.get("temperature"),
              "tool_choice": "auto" if schemas else None, "tools": schemas}
    payload: dict[str, Any] = {"messages": [api_message(m) for m in to_litellm_messages(messages)],
                               "model": served_model_name(model)}
    payload.update((k, params[k]) for k in PARAM_ORDER if params[k] is not None)
    payload.update(llm_args.get("extra_body") or {})
    return payload


def user_request_body(model: str, messages: list[Message], schemas: list[dict] | None, llm_args: dict) -> bytes:
    """The request body as sent: compact JSON, non-ASCII as UTF-8 (as the OpenAI SDK under litellm writes it)."""
    return json.dumps(user_request_payload(model, messages, schemas, llm_args), separators=(",", ":"),
                      ensure_ascii=False).encode()


def parse_chat_response(content: bytes) -> tuple[dict, UserMessage]:
    """The first choice of a chat-completions answer, and the user message tau2 makes of it; ValueError names what
    is malformed."""
    body = json.loads(content)
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or message.get("role") != "assistant":
        raise ValueError("the first choice has no assistant message")
    text = message.get("content")
    if text is not None and not isinstance(text, str):
        raise ValueError("the message content is not a string")
    calls = []
    for call in message.get("tool_calls") or []:
        try:
            function = call["function"]
            arguments = json.loads(function["arguments"])
            calls.append(ToolCall(id=call["id"], name=function["name"], arguments=arguments, requestor="user"))
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed tool call {str(call)[:200]}: {type(e).__name__}: {e}") from None
    usage = body.get("usage")
    usage = ({"completion_tokens": usage.get("completion_tokens"), "prompt_tokens": usage.get("prompt_tokens")}
             if isinstance(usage, dict) else None)
    return choice, UserMessage(role="user", content=text, tool_calls=calls or None, cost=0.0, usage=usage,
                               raw_data=body if USER_RAW_DATA_IS_RESPONSE else choice)


def chat_client(api_base: str, *, timeout_s: float, max_retries: int, max_in_flight: int) -> RetryingPost:
    """The HTTP client of a user-simulator server (or router), or of several (their API bases comma-separated: each
    call goes to the one with the fewest in flight), shared by every user an episode factory builds. The key, when
    there is one, is OPENAI_API_KEY (litellm's), read here and sent only to those servers; else "EMPTY", as litellm
    sends for a local server."""
    key = os.environ.get("OPENAI_API_KEY") or "EMPTY"
    urls = [base.rstrip("/") + "/chat/completions" for base in split_urls(api_base)]
    return RetryingPost(urls, name="user simulator /v1/chat/completions",
                        timeout_s=timeout_s, max_retries=max_retries, max_in_flight=max_in_flight,
                        headers={"Authorization": f"Bearer {key}"})


class AsyncUserSimulator(UserSimulator):
    """tau2's `UserSimulator` whose model call is awaited on the event loop (`agenerate_next_message`); the
    blocking `generate_next_message` stays tau2's, over litellm."""

    def __init__(self, client: RetryingPost, *, tools=None, instructions=None, llm: str, llm_args: dict):
        super().__init__(tools=tools, instructions=instructions, llm=llm, llm_args=llm_args)
        self.client = client
        # tau2 rebuilds each tool's schema from its pydantic model on every call; the tools never change
        self.tool_schemas = [tool.openai_schema for tool in tools] if tools else None

    def generate_next_message(self, message: ValidUserInputMessage, state: UserState):
        """A blocking caller (the gym wrapper, a script) gets tau2's own path: litellm, the same request."""
        return super().generate_next_message(message, state)

    async def agenerate_next_message(self, message: ValidUserInputMessage,
                                     state: UserState) -> tuple[UserMessage, UserState]:
        """tau2's `UserSimulator._generate_next_message` (the installed tau2's), its model call on the event loop."""
        record_user_input(message, state)
        reply = await self.acall(state.system_messages + state.flip_roles(), self.tool_schemas)
        state.messages.append(reply)
        return reply, state

    async def acall(self, messages: list[Message], tool_schemas: list[dict] | None) -> UserMessage:
        """One model call, awaited: what the installed tau2's `generate(self.llm, messages, tools,
        **self.llm_args)` checks, sends and reads, as the user's message (also the extra calls of the user
        strategies, user_strategies.py)."""
        check_user_request(messages)
        body = user_request_body(self.llm, messages, tool_schemas, self.llm_args)
        asks = self.llm_args.get("num_retries", 0) if USER_ASKS_AGAIN_WHEN_EMPTY else 0
        for attempt in range(asks + 1):
            try:
                _, reply = await self.client.post(body, parse_chat_response)
            except RequestFailed as e:
                what = f"refused the request (HTTP {e.status})" if e.status else f"failed after {e.attempts} attempts"
                raise UserClientError(f"{self.client.url} {what}: {e.detail}") from None
            if (reply.content or "").strip() or reply.tool_calls:
                break
            if attempt < asks:  # tau2 26.3 asks again when the answer has neither text nor tool calls
                logger.warning("empty answer from the user simulator, asking again (%d/%d)", attempt + 1, asks)
        return reply
