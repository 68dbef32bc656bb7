"""What the policy sees: tau2's agent prompt, the tool schemas and the conversation as chat messages.

What the policy sees: tau2's agent system prompt, the tool schemas, and the agent's view of the conversation
as chat messages for the tokenizer's own chat template.

The system prompt is tau2's `LLMAgent` prompt (instructions + the domain policy; telecom's policy is the main
policy plus the tech-support manual, as tau2's environment builds it). Tools go to
`apply_chat_template(..., tools=...)` so the model sees the tool format it was trained on (Qwen3: a
`<tools>` block in the system turn, `<tool_call>` blocks in assistant turns, `<tool_response>` in user turns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
from tau2.data_model.message import AssistantMessage, Message, ToolMessage, UserMessage


def agent_system_prompt(policy: str) -> str:
    """tau2's own agent system prompt for a domain policy (not a paraphrase: the eval compares to tau2 runs)."""
    return SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)


def tool_schemas(tools: Iterable[Any]) -> list[dict]:
    """OpenAI function-format schemas of tau2 Tool objects."""
    return [tool.openai_schema for tool in tools]


def assistant_chat_message(content: str, tool_calls: Sequence[tuple[str, dict]] = ()) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        msg["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": arguments}}
            for name, arguments in tool_calls
        ]
    return msg


def to_agent_chat(messages: Iterable[Message]) -> list[dict]:
    """The agent's view of a tau2 trajectory: its own turns, the user's text turns, and tool results sent to it.

    The user's own tool calls (telecom device tools) and their results are invisible to the agent, as in tau2.
    An assistant message carries its raw completion text in `raw_data["text"]` when the completion could not be
    parsed; that raw text is what the model actually produced, so it is what the model sees again.
    """
    chat: list[dict] = []
    for msg in messages:
        if isinstance(msg, AssistantMessage):
            raw = (msg.raw_data or {}).get("unparsed_text")
            if raw is not None:
                chat.append(assistant_chat_message(raw))
            else:
                calls = [(tc.name, tc.arguments) for tc in msg.tool_calls or []]
                chat.append(assistant_chat_message(msg.content or "", calls))
        elif isinstance(msg, UserMessage):
            if not msg.is_tool_call():
                chat.append({"role": "user", "content": msg.content or ""})
        elif isinstance(msg, ToolMessage):
            if msg.requestor == "assistant":
                chat.append({"role": "tool", "content": msg.content or ""})
    return chat


def render(tokenizer, chat: list[dict], tools: list[dict] | None, *, add_generation_prompt: bool) -> str:
    """The chat template's text for a conversation (tools=None renders no tools block)."""
    return tokenizer.apply_chat_template(
        chat, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt)


