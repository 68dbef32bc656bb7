"""The oracle agent in a live conversation with a user simulator.

The oracle agent in a live conversation: it probes the user for the facts the gold actions need, then plays
tau2's gold actions in order and the closing message, against a user simulator. Since this agent is perfect, every
failure is the user simulator's or the task's, and the user's behaviour is checked on every episode, successes
included (a user can sink an episode that still scores 1.0): the qualification of a user simulator
(tau2_rl_pipeline/eval/qualify.py) counts the causes `episode_causes` names.

The oracle's moves are completions as a policy would write them, through the same Episode (`act` / `aact`):
- first, for each fact the gold actions need that the scenario states (scenario.py: ids, names, reasons, choices)
  and the user has not said yet, a question (`probe_question`); the answer must state the scenario's value, else
  the user gave facts that differ from the scenario (a user that ends the conversation instead has not answered:
  its cause is the ending). What the user volunteers unasked is the monitors' to check (user_monitors.py: an
  identifier or a name that the scenario does not hold);
- each agent gold action is a tool call; a user-side gold action (telecom's device steps) is asked for in words
  ("Please toggle airplane mode now, with {...}."; no other word, which the scripted user could take for another
  step), up to ASKS times, and counted as done when the user makes the matching tool call (tau2's
  Action.compare_with_tool_call);
- then the task's communicate info as the closing message; a user that still talks is asked ANYTHING_ELSE up to
  LINGER times before the agent's stop, and one that never ends it is named.
Any BaseUser plays the other side: tau2's LLM user over litellm or the asynchronous client (an SGLang-served user
model too), the scripted user, or the canned users of tau2_rl_pipeline/eval/canned_users.py.
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
from tau2_rl_pipeline.benchmark.scenario import probe_question, scenario_of, states
from tau2_rl_pipeline.benchmark.user_monitors import (
    USER_CAUSES,
    USER_LOOPED,
    USER_NEVER_ENDED,
    USER_WRONG_FACTS,
    user_causes,
)

ASKS = 2  # times the oracle asks for one device action before it goes on without it
TRANSFER_TOKENS = ("###TRANSFER###", "###OUT-OF-SCOPE###")  # tau2's user-side endings other than ###STOP###
USER_STOPPED_EARLY = "user stopped before the gold actions were done"
USER_ACTION_NOT_PERFORMED = "user did not perform a device action"
USER_TRANSFERRED_OR_ENDED = "user transferred or ended early"
EVALUATOR_DISAGREED = "evaluator disagreed"
EPISODE_LIMIT = "episode hit tau2's step or error limit"
LINGER = 2  # times the oracle asks ANYTHING_ELSE after its closing message before it ends the conversation
ANYTHING_ELSE = "Is there anything else I can help you with?"
CAUSES = (*USER_CAUSES, USER_STOPPED_EARLY, USER_ACTION_NOT_PERFORMED, USER_TRANSFERRED_OR_ENDED, EVALUATOR_DISAGREED,
          EPISODE_LIMIT)


@dataclass
class OracleNotes:
    """What happened to the oracle's plan: the facts it asked for and those the user's answer did not state, how
    many gold actions it got to, which device actions the user never performed, whether it said its closing
    message, whether it had to end the conversation itself after LINGER questions."""

    probed: int = 0
    wrong_facts: list[str] = field(default_factory=list)
    gold_done: int = 0
    missed: list[str] = field(default_factory=list)
    closed: bool = False
    lingered: bool = False
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
    for fact in scenario_of(task).facts:
        if episode.done:
            return
        if any(states(text, fact.value) for text in user_texts(episode.messages)):
            continue
        before = len(episode.messages)
        yield probe_question(fact)
        notes.probed += 1
        if not any(states(text, fact.value) for text in user_texts(episode.messages[before:])):
            if episode.done:  # no answer is no wrong answer: the user ended it, which is its own cause
                return
            notes.wrong_facts.append(fact.label)
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
    for _ in range(LINGER):
        if episode.done:
            return
        yield ANYTHING_ELSE
    if not episode.done:
        notes.lingered = True
        yield AGENT_STOP_TOKEN


def user_texts(messages: list) -> list[str]:
    return [m.content for m in messages if isinstance(m, UserMessage) and not m.is_tool_call() and m.content]


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
    evaluator's disagreement (a task set aside when it happens under every simulator and the gold replay)."""
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


def episode_causes(notes: OracleNotes, monitors: dict, n_gold: int, termination_reason: str,
                   last_user_text: str, success: bool) -> list[str]:
    """Every cause of one oracle episode, most telling first: the user-side monitors' (user_monitors.py) with the
    oracle's own findings (facts that differ, a conversation the user never ended), then, for a failed episode,
    `failure_cause`; a device step never performed goes before a loop (the oracle asks for each step twice, so a
    user that will not do them says the same no over and over). Empty for a clean success."""
    found = set(user_causes(monitors))
    found |= {USER_WRONG_FACTS} if notes.wrong_facts else set()
    found |= {USER_NEVER_ENDED} if notes.lingered else set()
    causes = [c for c in USER_CAUSES if c in found]
    failed = failure_cause(notes, n_gold, termination_reason, last_user_text, success)
    if failed == USER_ACTION_NOT_PERFORMED and USER_LOOPED in causes:  # asked for each step twice, it said no alike
        causes.insert(causes.index(USER_LOOPED), failed)
    return causes + ([failed] if failed is not None and failed not in causes else [])


def last_user_text(episode: Episode) -> str:
    return next((m.content for m in reversed(episode.messages) if isinstance(m, UserMessage) and m.content), "")
