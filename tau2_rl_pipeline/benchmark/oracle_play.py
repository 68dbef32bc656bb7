"""The oracle agent in a live conversation: tau2's gold actions, in order, then the closing message, played
against a user simulator. Since this agent is perfect, every failure is the user simulator's or the task's, and
`failure_cause` says which: the qualification of a user simulator (tau2_rl_pipeline/eval/qualify.py) counts them.

The oracle's moves are completions as a policy would write them, through the same Episode (`act` / `aact`): an
agent gold action is a tool call; a user-side gold action (telecom's device steps) is asked for in words ("Please
toggle airplane mode now, with {...}."; no other word, which the scripted user could take for another step), up
to ASKS times, and counted as done when the user makes
the matching tool call (tau2's Action.compare_with_tool_call); then the task's communicate info as the closing
message, and, if the user still talks, the agent's stop. Any BaseUser plays the other side: tau2's LLM user over
litellm or the asynchronous client (an SGLang-served user model too), or the scripted user.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from tau2.data_model.message import UserMessage
from tau2.data_model.tasks import Action, Task

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.episode import AGENT_STOP_TOKEN, Episode
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions

ASKS = 2  # times the oracle asks for one device action before it goes on without it
TRANSFER_TOKENS = ("###TRANSFER###", "###OUT-OF-SCOPE###")  # tau2's user-side endings other than ###STOP###
USER_STOPPED_EARLY = "user stopped before the gold actions were done"
USER_ACTION_NOT_PERFORMED = "user did not perform a device action"
USER_TRANSFERRED_OR_ENDED = "user transferred or ended early"
EVALUATOR_DISAGREED = "evaluator disagreed"
EPISODE_LIMIT = "episode hit tau2's step or error limit"
CAUSES = (USER_STOPPED_EARLY, USER_ACTION_NOT_PERFORMED, USER_TRANSFERRED_OR_ENDED, EVALUATOR_DISAGREED,
          EPISODE_LIMIT)


@dataclass
class OracleNotes:
    """What happened to the oracle's plan: how many gold actions it got to, which device actions the user never
    performed, whether it said its closing message."""

    gold_done: int = 0
    missed: list[str] = field(default_factory=list)
    closed: bool = False
    used: set[str] = field(default_factory=set)  # ids of the user's tool calls matched to a gold action


def ask_text(action: Action) -> str:
    """The oracle's request for a user-side action: its name in words (what the scripted user listens for) and its
    arguments."""
    args = f", with {json.dumps(action.arguments, sort_keys=True)}" if action.arguments else ""
    return f"Please {action.name.replace('_', ' ')} now{args}."


def performed(messages: list, action: Action, notes: OracleNotes) -> bool:
    """Whether the user made the tool call `action` describes, one not matched to an earlier gold action (a user
    may do two steps on one request); the call found is marked matched."""
    call = next((c for m in messages if isinstance(m, UserMessage) and m.tool_calls for c in m.tool_calls
                 if c.id not in notes.used and action.compare_with_tool_call(c)), None)
    if call is not None:
        notes.used.add(call.id)
    return call is not None


def oracle_moves(episode: Episode, notes: OracleNotes) -> Iterator[str]:
    """The oracle's completions, one per policy turn, each chosen after the previous one was played."""
    task: Task = episode.task
    for action in gold_actions(task):
        if episode.done:
            return
        if action.requestor == "user" and not performed(episode.messages, action, notes):
            for _ in range(ASKS):
                yield ask_text(action)
                if performed(episode.messages, action, notes):
                    break
                if episode.done:
                    return
            else:
                notes.missed.append(action.name)
        else:
            yield render_assistant_text("", [(action.name, action.arguments)])
        notes.gold_done += 1
    if episode.done:
        return
    notes.closed = True
    yield final_message(task)
    if not episode.done:
        yield AGENT_STOP_TOKEN


def play(episode: Episode) -> OracleNotes:
    """The oracle against a blocking user (tau2's UserSimulator over litellm, the scripted user)."""
    notes = OracleNotes()
    episode.start()
    for completion in oracle_moves(episode, notes):
        if episode.done:
            break
        episode.act(completion)
    return notes


async def aplay(episode: Episode) -> OracleNotes:
    """`play` against an asynchronous user (user_client.py): its model calls awaited on the loop."""
    notes = OracleNotes()
    await episode.astart()
    for completion in oracle_moves(episode, notes):
        if episode.done:
            break
        await episode.aact(completion)
    return notes


def failure_cause(notes: OracleNotes, n_gold: int, termination_reason: str, last_user_text: str,
                  success: bool) -> str | None:
    """Why an oracle episode failed (one of CAUSES), or None when it succeeded. A user-side ending counts first (a
    transfer or out-of-scope token, a stop before the gold actions were done, or before the closing message), then
    a device action never performed, then tau2's limits; a complete conversation that still scored below 1 is the
    evaluator's disagreement (a task fault when it happens under every simulator)."""
    if success:
        return None
    if termination_reason == "user_stop":
        if any(token in last_user_text for token in TRANSFER_TOKENS):
            return USER_TRANSFERRED_OR_ENDED
        if notes.gold_done < n_gold:
            return USER_STOPPED_EARLY
        if not notes.closed:
            return USER_TRANSFERRED_OR_ENDED
    if notes.missed:
        return USER_ACTION_NOT_PERFORMED
    if termination_reason in ("max_steps", "too_many_errors"):
        return EPISODE_LIMIT
    return EVALUATOR_DISAGREED


def last_user_text(episode: Episode) -> str:
    return next((m.content for m in reversed(episode.messages) if isinstance(m, UserMessage) and m.content), "")
