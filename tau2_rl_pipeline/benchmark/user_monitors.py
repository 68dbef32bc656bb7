"""User-side monitors: how the user simulator behaved in an episode, whatever the reward.

A user simulator is part of the reward: one that goes silent, parrots the agent, recites its instructions, invents
facts or never hangs up can sink an episode, or let a wrong one through, and GRPO then learns from it.

Per episode (`user_monitors`, pure: the episode's tau2 messages, its task's scenario (scenario.py), how it ended):
- user_turns, user_mean_chars: the user's text messages (tool calls apart) and their mean length;
- empty_replies: user messages with no tool call and fewer than 2 letters or digits once ###STOP### and the like
  are taken out (a bare stop is an ending, not an empty reply);
- echoes: user messages that copy the agent's last text message (similarity >= ECHO_SIMILARITY, the agent's
  message at least 3 words);
- leakage: the largest share, over the scenario's hidden texts (task instructions, unknown info, persona, tau2's
  user guidelines), of that text's LEAK_NGRAM-word runs that the user's messages repeat;
- invented_facts: identifiers (a letter and a digit, or 4+ digits; "26th", "3pm" aside) the user says that neither
  the scenario nor any earlier message holds: facts that contradict the scenario;
- stopped_before_request: the user ended the conversation before any message of at least 3 words;
- never_stopped: the episode ran into tau2's step limit without the user ever ending it;
- other_language: user messages in another language (mostly non-Latin letters, or more common function words of
  Spanish, French, German, Italian or Portuguese than of English).
`user_causes` names what a monitor's values say went wrong, in a fixed order; `batch_user_monitors` takes the
means and shares over a batch (the evaluator's summary, slime's rollout log).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tau2.data_model.message import AssistantMessage, Message, UserMessage

from tau2_rl_pipeline.benchmark.scenario import Scenario, words

CONTROL_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
ECHO_SIMILARITY = 0.9
LEAK_NGRAM = 6
LEAK_SHARE = 0.5  # a user repeating half of a hidden text's 6-word runs recites it
REQUEST_WORDS = 3

USER_EMPTY = "user sent empty replies"
USER_ECHOED = "user echoed the agent"
USER_LEAKED = "user revealed its instructions"
USER_OTHER_LANGUAGE = "user answered in another language"
USER_WRONG_FACTS = "user gave facts that differ from the scenario"
USER_STOPPED_AT_ONCE = "user stopped before stating its request"
USER_NEVER_ENDED = "user never ended the conversation"
USER_CAUSES = (USER_EMPTY, USER_ECHOED, USER_LEAKED, USER_OTHER_LANGUAGE, USER_WRONG_FACTS, USER_STOPPED_AT_ONCE,
               USER_NEVER_ENDED)

_ID = re.compile(r"[#@\w.\-]*\d[#@\w.\-]*")
_NOT_ID = re.compile(r"^\d+(?:st|nd|rd|th|am|pm|s|k|h|m|min|gb|mb)?$")
_ENGLISH = frozenset("the a an and to of i you my me is it for in on that this be have can with please would "
                     "want need do not what your thanks thank yes no".split())
_FOREIGN = frozenset("el la los las que y en por con una para es mi necesito gracias hola por favor le les des et "
                     "est je vous une du au pas mon ma der die das und ich nicht ist sie mein bitte danke il di che "
                     "non sono per grazie um uma não com meu minha obrigado".split())


def control_free(text: str | None) -> str:
    out = text or ""
    for token in CONTROL_TOKENS:
        out = out.replace(token, "")
    return out.strip()


def is_empty(message: UserMessage) -> bool:
    if message.is_tool_call():
        return False
    text = message.content or ""
    bare = control_free(text)
    if not bare and text.strip():  # a bare ###STOP###: an ending
        return False
    return sum(ch.isalnum() for ch in bare) < 2


def is_echo(reply: str, agent: str) -> bool:
    if len(agent.split()) < 3 or not reply:
        return False
    return difflib.SequenceMatcher(None, words(reply), words(agent)).ratio() >= ECHO_SIMILARITY


def _ngrams(text: str, n: int = LEAK_NGRAM) -> set[tuple[str, ...]]:
    tokens = words(text).split()
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def leakage(user_texts: Sequence[str], hidden: Sequence[str]) -> float:
    """The largest share of a hidden text's word runs that the user's messages repeat (0.0 when none)."""
    said = set().union(*(_ngrams(t) for t in user_texts)) if user_texts else set()
    shares = [len(grams & said) / len(grams) for grams in map(_ngrams, hidden) if grams]
    return max(shares, default=0.0)


def identifiers(text: str) -> list[str]:
    tokens = [t.strip(".-") for t in _ID.findall(text or "")]
    return [t for t in tokens
            if (re.search(r"[A-Za-z]", t) or sum(c.isdigit() for c in t) >= 4) and not _NOT_ID.match(t.lower())]


def other_language(text: str) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    if len(letters) < 6:
        return False
    if sum(not ch.isascii() for ch in letters) / len(letters) > 0.3:
        return True
    tokens = re.findall(r"[^\W\d_]+", text.lower())
    foreign = sum(t in _FOREIGN for t in tokens)
    return foreign >= 2 and foreign > sum(t in _ENGLISH for t in tokens)


def user_monitors(messages: Sequence[Message], scenario: Scenario, termination_reason: str) -> dict[str, Any]:
    """The user-side monitors of one episode (module docstring)."""
    texts: list[str] = []
    empty = echoes = foreign = 0
    invented: list[str] = []
    stated = False
    stopped_early = False
    agent_last = ""
    seen = words(scenario.text)
    for message in messages:
        if isinstance(message, UserMessage) and not message.is_tool_call():
            text = message.content or ""
            bare = control_free(text)
            empty += is_empty(message)
            echoes += is_echo(bare, agent_last)
            foreign += other_language(bare)
            invented += [t for t in identifiers(bare) if f" {words(t)} " not in f" {seen} "]
            if any(token in text for token in CONTROL_TOKENS[:1]) and not stated:
                stopped_early = True
            stated = stated or len(bare.split()) >= REQUEST_WORDS
            if bare:
                texts.append(bare)
        elif isinstance(message, AssistantMessage) and message.content and not message.is_tool_call():
            agent_last = message.content
        seen += " " + words(getattr(message, "content", None) or "")
    user_turns = sum(isinstance(m, UserMessage) and not m.is_tool_call() for m in messages)
    user_stopped = any(isinstance(m, UserMessage) and CONTROL_TOKENS[0] in (m.content or "") for m in messages)
    return {"user_turns": user_turns, "user_mean_chars": sum(map(len, texts)) / len(texts) if texts else 0.0,
            "empty_replies": empty, "echoes": echoes, "leakage": round(leakage(texts, scenario.hidden), 4),
            "invented_facts": sorted(set(invented)), "stopped_before_request": stopped_early,
            "never_stopped": termination_reason == "max_steps" and not user_stopped,
            "other_language": foreign}


def user_causes(monitors: Mapping[str, Any]) -> list[str]:
    """What the monitors say went wrong on the user's side, in USER_CAUSES order (empty for a clean episode)."""
    hits = {USER_EMPTY: monitors["empty_replies"] > 0, USER_ECHOED: monitors["echoes"] > 0,
            USER_LEAKED: monitors["leakage"] >= LEAK_SHARE, USER_OTHER_LANGUAGE: monitors["other_language"] > 0,
            USER_WRONG_FACTS: bool(monitors["invented_facts"]),
            USER_STOPPED_AT_ONCE: monitors["stopped_before_request"], USER_NEVER_ENDED: monitors["never_stopped"]}
    return [cause for cause in USER_CAUSES if hits[cause]]


def batch_user_monitors(episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means of the user's turns and message length, and the share of episodes with each user-side cause."""
    n = len(episodes)
    if n == 0:
        return {"episodes": 0}
    out: dict[str, Any] = {"episodes": n, "user_turns_mean": sum(e["user_turns"] for e in episodes) / n,
                           "user_mean_chars": sum(e["user_mean_chars"] for e in episodes) / n}
    causes = [set(user_causes(e)) for e in episodes]
    out["user_flagged_share"] = sum(bool(c) for c in causes) / n
    for cause, key in zip(USER_CAUSES, ("empty", "echo", "leak", "other_language", "wrong_facts",
                                        "stopped_at_once", "never_ended")):
        out[f"user_{key}_share"] = sum(cause in c for c in causes) / n
    return out
