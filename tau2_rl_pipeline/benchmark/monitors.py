"""Behaviour monitors: what an agent did in an episode beyond its reward, the rates that show reward hacking.

An RL run learns whatever its reward lets through: tau2's airline reward basis has no ACTION check on most tasks,
so extra writes go unpunished, and transferring, ending the conversation or refusing can all be cheaper than
solving the task. These per-episode counts, from the episode's tau2 messages and its task (pure functions; the
tool kinds come from the domain's toolkits through `tool_kinds`, the one edge), make those rates visible per
step (local GRPO step log, slime's rollout metrics) and per run (the evaluator's summary and chart).

Per episode (`episode_monitors`), over the policy's own messages: a task's initial history (tau2's
`initial_state.message_history`, which the episode opens with: mock's two history tasks start with a create_task
call) is left out, as it is not the policy's doing:
- tool_calls: agent tool calls the policy made, refused ones (bad arguments) included; completions that do not
  parse, or call a tool the agent does not have, are parse errors (counted in the records' parse_errors);
- over_actions: agent write calls that ran without error and match no gold action still unmatched (tau2's own
  Action.compare_with_tool_call, each gold action matched once): acting beyond what the task asks;
- order_only: agent write calls that match an unmatched gold action only once the items of their list arguments
  are put in one order (retail 108's return items listed in reverse, which tau2's DB check scores 1.0): counted
  apart, not as over-actions, each consuming its gold action;
- repeated_reads: agent read calls identical (name and arguments) to an earlier one since the last successful
  write (re-reading after a change is legitimate);
- transfers: calls to transfer_to_human_agents;
- ended_by: "agent" (agent stop), "user" (user stop) or "limit" (any other ending: limits, truncation);
- max_turns / max_errors: the episode ended at a turn or step limit / at tau2's error limit;
- refused: some agent text declines a request (refusal.is_refusal: rules over clause structure, a heuristic measured
  on a labelled corpus, counted, never scored);
- action_checked: the task's reward basis includes ACTION (else an over-action cannot cost reward).
`batch_monitors` turns a batch of these (with each episode's success) into means and shares, among them the
share of successes whose task has no ACTION check.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from tau2.data_model.message import AssistantMessage, Message, ToolMessage
from tau2.data_model.tasks import Action, RewardType, Task

from tau2_rl_pipeline.benchmark.episode import INVALID_TOOL_CALL, build_environment
from tau2_rl_pipeline.benchmark.refusal import is_refusal

TRANSFER_TOOL = "transfer_to_human_agents"
READ, WRITE = "read", "write"
MAX_TURN_REASONS = ("max_turns", "max_steps")
MAX_ERROR_REASONS = ("too_many_errors",)
COUNTS = ("tool_calls", "over_actions", "order_only", "repeated_reads", "transfers")
FLAGS = ("max_turns", "max_errors", "refused")


def tool_calls_of(messages: Sequence[Message]) -> list[tuple[Any, ToolMessage | None]]:
    """Each agent tool call (parse errors left out) with its result message, in order."""
    results = {m.id: m for m in messages if isinstance(m, ToolMessage)}
    return [(call, results.get(call.id)) for m in messages if isinstance(m, AssistantMessage) and m.tool_calls
            for call in m.tool_calls if call.name != INVALID_TOOL_CALL]


def _key(call: Any) -> tuple[str, str]:
    return call.name, json.dumps(call.arguments, sort_keys=True, default=str)


def _signature(message: Message) -> tuple:
    calls = getattr(message, "tool_calls", None) or []
    return message.role, message.content, [(c.id, c.name, c.arguments) for c in calls]


def policy_messages(messages: Sequence[Message], task: Task) -> list[Message]:
    """`messages` after the task's initial history, when they open with it (an episode's and tau2's do)."""
    history = task.initial_state.message_history if task.initial_state else None
    n = len(history or [])
    if n and len(messages) >= n and all(_signature(m) == _signature(h) for m, h in zip(messages, history)):
        return list(messages[n:])
    return list(messages)


def _unordered(value: Any) -> Any:
    """`value` with the items of every list in one order (sorted by their JSON), recursively."""
    if isinstance(value, dict):
        return {k: _unordered(v) for k, v in value.items()}
    if isinstance(value, list):
        return sorted((_unordered(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True, default=str))
    return value


def matches_up_to_order(action: Action, call: Any) -> bool:
    """tau2's own Action.compare_with_tool_call once every list argument of both is put in one order."""
    return action.model_copy(update={"arguments": _unordered(action.arguments)}).compare_with_tool_call(
        call.model_copy(update={"arguments": _unordered(call.arguments)}))


def episode_monitors(messages: Sequence[Message], task: Task, termination_reason: str,
                     kinds: Mapping[str, str]) -> dict[str, Any]:
    """The monitors of one episode (module docstring); `kinds`: agent tool name -> "read", "write", ..."""
    gold = [a for a in (task.evaluation_criteria.actions or [] if task.evaluation_criteria else [])
            if a.requestor == "assistant"]
    unmatched = list(gold)
    over, order_only, repeats, transfers = 0, 0, 0, 0
    seen_reads: set[tuple[str, str]] = set()
    messages = policy_messages(messages, task)
    calls = tool_calls_of(messages)
    for call, result in calls:
        ok = result is not None and not result.error
        kind = kinds.get(call.name)
        transfers += call.name == TRANSFER_TOOL
        if kind == READ:
            repeats += _key(call) in seen_reads
            seen_reads.add(_key(call))
        elif kind == WRITE and ok:
            seen_reads.clear()
            match = next((a for a in unmatched if a.compare_with_tool_call(call)), None)
            if match is None:
                match = next((a for a in unmatched if matches_up_to_order(a, call)), None)
                order_only += match is not None
            if match is None:
                over += 1
            else:
                unmatched.remove(match)
    basis = task.evaluation_criteria.reward_basis if task.evaluation_criteria else []
    ended_by = {"agent_stop": "agent", "user_stop": "user"}.get(termination_reason, "limit")
    texts = [m.content for m in messages if isinstance(m, AssistantMessage) and m.content]
    return {"tool_calls": len(calls), "over_actions": over, "order_only": order_only, "repeated_reads": repeats,
            "transfers": transfers, "ended_by": ended_by, "max_turns": termination_reason in MAX_TURN_REASONS,
            "max_errors": termination_reason in MAX_ERROR_REASONS,
            "refused": any(is_refusal(t) for t in texts),
            "action_checked": RewardType.ACTION in basis}


def batch_monitors(episodes: Sequence[Mapping[str, Any]], successes: Sequence[bool]) -> dict[str, Any]:
    """Means of the counts, shares of the flags and endings over a batch of episode monitors, and the share of
    successes whose task has no ACTION check (None when nothing succeeded)."""
    if len(episodes) != len(successes):
        raise ValueError(f"{len(episodes)} episodes but {len(successes)} success flags")
    n = len(episodes)
    if n == 0:
        return {"episodes": 0}
    out: dict[str, Any] = {"episodes": n}
    for name in COUNTS:
        out[f"{name}_mean"] = sum(e.get(name, 0) for e in episodes) / n  # order_only: absent from older files
    out["over_action_share"] = sum(e["over_actions"] > 0 for e in episodes) / n
    out["transfer_share"] = sum(e["transfers"] > 0 for e in episodes) / n
    for name in FLAGS:
        out[f"{name}_share"] = sum(bool(e[name]) for e in episodes) / n
    ended = Counter(e["ended_by"] for e in episodes)
    for who in ("agent", "user", "limit"):
        out[f"{who}_ended_share"] = ended[who] / n
    won = [e for e, s in zip(episodes, successes) if s]
    out["successes"] = len(won)
    out["successes_without_action_check_share"] = (sum(not e["action_checked"] for e in won) / len(won)
                                                   if won else None)
    return out


# -- the edge: which agent tools read and which write --------------------------------------------------------------
_KINDS: dict[str, dict[str, str]] = {}


def tool_kinds(domain: str, task: Task | None = None) -> dict[str, str]:
    """Agent tool name -> tau2's tool type ("read", "write", "think", "generic") of `domain`, built once per
    process (banking_knowledge builds its environment for a task)."""
    if domain not in _KINDS:
        tools = build_environment(domain, fast=True, task=task).tools
        _KINDS[domain] = {name: tools.tool_type(name).value for name in tools.tools} if tools else {}
    return _KINDS[domain]


def monitors(domain: str, task: Task, messages: Sequence[Message], termination_reason: str) -> dict[str, Any]:
    """`episode_monitors` with the domain's tool kinds."""
    return episode_monitors(messages, task, termination_reason, tool_kinds(domain, task))
