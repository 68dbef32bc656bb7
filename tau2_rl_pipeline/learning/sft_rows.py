"""The SFT row format both trainers read.

What the rollout shows the policy for a domain (tau2's agent prompt and tool schemas) followed by the agent's view
of a conversation. Seed data, oracle demonstrations and RFT selection all write rows through here, so SFT teaches
exactly the protocol the policy is later run and scored with."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from tau2.data_model.message import AssistantMessage, Message, UserMessage
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
from tau2.user.user_simulator import UserSimulator

from tau2_rl_pipeline.benchmark.episode import build_environment
from tau2_rl_pipeline.benchmark.prompting import agent_system_prompt, to_agent_chat, tool_schemas


@dataclass(frozen=True)
class DomainSpec:
    system_prompt: str
    tools: tuple[dict, ...]
    agent_tools: frozenset[str]
    user_tools: frozenset[str]


@functools.cache
def domain_spec(domain: str) -> DomainSpec:
    """tau2's agent prompt, tool schemas and tool names of a domain (built once: environments take ~0.3 s)."""
    env = build_environment(domain)
    return DomainSpec(
        system_prompt=agent_system_prompt(env.get_policy()),
        tools=tuple(tool_schemas(env.get_tools())),
        agent_tools=frozenset(env.tools.get_tools()) if env.tools else frozenset(),
        user_tools=frozenset(env.user_tools.get_tools()) if env.user_tools else frozenset(),
    )


def sft_row(domain: str, chat: list[dict], metadata: dict) -> dict:
    """A row in the rollout's protocol: tau2's system prompt first, then `chat` (the agent's view)."""
    spec = domain_spec(domain)
    messages = [{"role": "system", "content": spec.system_prompt}, *chat]
    return {"messages": messages, "tools": list(spec.tools), "metadata": {"domain": domain, **metadata}}


def conversation_key(row: dict) -> str:
    """Identity of a row's training content, for deduplication (metadata does not count)."""
    return json.dumps([row["messages"], row["tools"]], sort_keys=True, ensure_ascii=False)


def sft_chat(messages: list[Message]) -> list[dict]:
    """The agent's view of a finished episode as SFT chat. The user's closing stop message is dropped (the policy
    never answers it); the greeting, which the rollout puts in the prompt, and completions the parser rejected
    (kept as sampled, so the error that follows makes sense) are context only, not trained on."""
    chat: list[dict] = []
    for msg in messages:
        for entry in to_agent_chat([msg]):
            untrained = isinstance(msg, AssistantMessage) and (
                (msg.raw_data or {}).get("unparsed_text") is not None
                or (not chat and msg.content == DEFAULT_FIRST_AGENT_MESSAGE.content))
            chat.append({**entry, "step_loss_mask": 0} if untrained else entry)
    if messages and isinstance(messages[-1], UserMessage) and UserSimulator.is_stop(messages[-1]):
        chat.pop()
    return chat
