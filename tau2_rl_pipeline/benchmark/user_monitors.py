"""User-side monitors: how the user simulator behaved in an episode, whatever the reward.

A user simulator is part of the reward: one that goes silent, parrots the agent, recites its instructions, invents
facts or never hangs up can sink an episode, or let a wrong one through, and GRPO then learns from it.

Per episode (`user_monitors`, pure: the episode's tau2 messages, its task's scenario (scenario.py), how it ended):
- user_turns, user_mean_chars: the user's text messages (tool calls apart) and their mean length in characters;
- empty_replies: user messages with no tool call and fewer than 2 letters or digits once ###STOP### and the like
  are taken out (a bare stop is an ending, not an empty reply);
- user_mean_words: the mean words of those messages (the qualification sets it beside the reference user's);
- echoes: user messages that copy the agent's last text message (similarity >= ECHO_SIMILARITY, the agent's
  message at least 3 words), or paraphrase it: similarity >= PARAPHRASE_SIMILARITY and nothing new said (no
  yes / no, no number or identifier, no word of the scenario that the agent's message does not hold);
- looped: the longest run of consecutive user text messages (no tool call between them) that say the same thing
  (similarity >= ECHO_SIMILARITY, at least 3 words each); LOOP_RUN or more is a user going round in circles (the
  scripted user says "I'm not sure what you want me to do" at most 3 times before it stops);
- leakage: the largest share, over the scenario's hidden texts (task instructions, unknown info, persona, tau2's
  user guidelines), of that text's LEAK_NGRAM-word runs that the user's messages repeat; a hidden text shorter
  than LEAK_NGRAM words (a persona "You are shy, rigid.") is one run of its own length, from LEAK_MIN_WORDS words;
- invented_facts: what the user says that neither the scenario nor any earlier message holds: identifiers (a
  letter and a digit, or 4+ digits; "26th", "3pm" aside), a name it introduces itself by ("my name is ...", "I'm
  ...", "this is ..."), and a capitalised word one letter or two off a name of the scenario ("Silvb" for Silva):
  facts that contradict the scenario;
- stopped_before_request: the user ended the conversation (###STOP###, ###TRANSFER###, ###OUT-OF-SCOPE###) before
  any message of its held a word of its request (a word of the scenario's reason for the call of at least 4
  letters that is not a common one, or a fact the gold actions need): talking about the weather is not a request;
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
PARAPHRASE_SIMILARITY = 0.7  # this close to the agent's message and nothing new said: a paraphrased echo
LOOP_RUN = 4
LEAK_NGRAM = 6
LEAK_MIN_WORDS = 3  # a shorter hidden text ("Be nice.") is said in passing, not recited
LEAK_SHARE = 0.5  # a user repeating half of a hidden text's 6-word runs recites it
NAME_SIMILARITY = 0.75  # "Silvb" ~ "Silva": the same name, misspelt

USER_EMPTY = "user sent empty replies"
USER_ECHOED = "user echoed the agent"
USER_LOOPED = "user repeated itself in a loop"
USER_LEAKED = "user revealed its instructions"
USER_OTHER_LANGUAGE = "user answered in another language"
USER_WRONG_FACTS = "user gave facts that differ from the scenario"
USER_STOPPED_AT_ONCE = "user stopped before stating its request"
USER_NEVER_ENDED = "user never ended the conversation"
USER_CAUSES = (USER_EMPTY, USER_ECHOED, USER_LOOPED, USER_LEAKED, USER_OTHER_LANGUAGE, USER_WRONG_FACTS,
               USER_STOPPED_AT_ONCE, USER_NEVER_ENDED)

_ID = re.compile(r"[#@\w.\-]*\d[#@\w.\-]*")
_NOT_ID = re.compile(r"^\d+(?:st|nd|rd|th|am|pm|s|k|h|m|min|gb|mb)?$")
_ENGLISH = frozenset("the a an and to of i you my me is it for in on that this be have can with please would "
                     "want need do not what your thanks thank yes no".split())
# words too common to show a request, a name or something new said
_COMMON = _ENGLISH | frozenset("you your yours i me my we our they them he she his her it its is are was were be "
                               "been am "
                               "will would could should can may might must shall do does did done have has had want "
                               "wants need needs like would just also very really about some any all this that these "
                               "those there here what which when where who why how then than from into with without "
                               "they they're you're i'm it's let lets get got make made help call calling today now "
                               "hello thank thanks please okay sure well know think tell told said say".split())
_YES_NO = frozenset("yes yeah yep no nope correct right ok okay sure confirm confirmed".split())
_INTRODUCTION = re.compile(r"\b(?:[Mm]y name is|[Mm]y name's|[Nn]ame is|I am|I'm|[Tt]his is|[Cc]all me"
                           r"|under the name(?: of)?)\s+([A-Z][a-zA-Z'\-]+(?:\s+[A-Z][a-zA-Z'\-]+)?)")
_NOT_A_NAME = frozenset("sorry not just here calling looking trying glad happy afraid sure fine good great still also "
                        "a the an so very really monday tuesday wednesday thursday friday saturday sunday".split())
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


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, words(a), words(b)).ratio()


def says_something_new(reply: str, agent: str, vocabulary: frozenset[str] = frozenset()) -> bool:
    """Whether `reply` holds a word `agent` does not that carries information: a yes or no, a number or identifier,
    or a word of `vocabulary` (the scenario's, common words apart)."""
    theirs = set(words(agent).split())
    return any(t in _YES_NO or any(c.isdigit() for c in t) or (t in vocabulary and t not in _COMMON)
               for t in set(words(reply).split()) - theirs)


def is_echo(reply: str, agent: str, vocabulary: frozenset[str] = frozenset()) -> bool:
    """`reply` copies `agent` (similarity >= ECHO_SIMILARITY), or paraphrases it saying nothing new."""
    if len(agent.split()) < 3 or not reply:
        return False
    ratio = similarity(reply, agent)
    return ratio >= ECHO_SIMILARITY or (ratio >= PARAPHRASE_SIMILARITY
                                        and not says_something_new(reply, agent, vocabulary))


def longest_loop(runs: Sequence[Sequence[str]]) -> int:
    """The longest run of consecutive messages, within each of `runs`, that say the same thing (similarity >=
    ECHO_SIMILARITY to the one before, at least 3 words each); 0 when no message has 3 words."""
    best = 0
    for run in runs:
        length = 0
        for i, text in enumerate(run):
            if len(text.split()) < 3:
                length = 0
                continue
            same = i > 0 and len(run[i - 1].split()) >= 3 and similarity(text, run[i - 1]) >= ECHO_SIMILARITY
            length = length + 1 if same else 1
            best = max(best, length)
    return best


def _ngrams(text: str, n: int = LEAK_NGRAM) -> set[tuple[str, ...]]:
    tokens = words(text).split()
    n = min(n, len(tokens)) if len(tokens) >= LEAK_MIN_WORDS else n
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def leakage(user_texts: Sequence[str], hidden: Sequence[str]) -> float:
    """The largest share of a hidden text's word runs that the user's messages repeat (0.0 when none); a hidden text
    of LEAK_MIN_WORDS to LEAK_NGRAM words counts as one run of its own length."""
    said_words = " " + " ".join(words(t) for t in user_texts) + " "
    said = set().union(*(_ngrams(t) for t in user_texts)) if user_texts else set()
    shares = []
    for text in hidden:
        grams = _ngrams(text)
        if len(words(text).split()) < LEAK_NGRAM and grams:
            shares.append(float(f" {words(text)} " in said_words))
        elif grams:
            shares.append(len(grams & said) / len(grams))
    return max(shares, default=0.0)


_CAPITALISED = re.compile(r"(?<![.!?:]\s)(?<![.!?:])(?<!^)(?<!\n)\b([A-Z][a-z]{3,})\b")  # not a sentence opener


def stated_names(text: str) -> list[str]:
    """The names `text` introduces its speaker by ("my name is Ana Lee", "I'm Ana", "this is Ana")."""
    out = []
    for m in _INTRODUCTION.finditer(text or ""):
        parts = [p for p in m.group(1).split() if p.lower() not in _NOT_A_NAME]
        if parts and parts[0] == m.group(1).split()[0]:
            out.append(" ".join(parts))
    return out


def misspelt_names(text: str, names: Sequence[str], seen: str) -> list[str]:
    """Capitalised words of `text` (not opening a sentence, not common), not in `seen`, one or two letters off one of
    `names` ("Silvb" for "Silva")."""
    out = []
    for token in _CAPITALISED.findall(text or ""):
        low = token.lower()
        if low not in _COMMON and f" {low} " not in f" {seen} " and any(
                difflib.SequenceMatcher(None, low, name).ratio() >= NAME_SIMILARITY for name in names):
            out.append(token)
    return out


def scenario_names(scenario: Scenario) -> list[str]:
    """The scenario's names, lower case: capitalised words of its text that are not sentence openers, the names in
    its user ids (sophia_silva_7557), and the words of its facts labelled as names or user ids."""
    found = {t.lower() for t in _CAPITALISED.findall(scenario.text)}
    found |= {w for m in re.finditer(r"\b([a-z]+)_([a-z]+)_\d+\b", scenario.text) for w in m.groups() if len(w) >= 4}
    for fact in scenario.facts:
        if "name" in fact.label or fact.label.endswith("user id"):
            found |= {w for w in words(fact.value).split() if w.isalpha() and len(w) >= 4}
    return sorted(found - _COMMON)


def request_words(scenario: Scenario) -> set[str]:
    """The words that show a request stated: the uncommon words (4+ letters) of its reason for the call, and the
    words of the facts its gold actions need."""
    said = {w for w in words(scenario.request).split() if len(w) >= 4 and w not in _COMMON}
    return said | {w for f in scenario.facts for w in words(f.value).split() if len(w) >= 3 and w not in _COMMON}


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
    runs: list[list[str]] = [[]]  # the user's text messages, cut at each tool call of its own
    empty = echoes = foreign = 0
    invented: list[str] = []
    stated = False
    stopped_early = False
    agent_last = ""
    seen = words(scenario.text)
    vocabulary = frozenset(seen.split())
    names, wanted = scenario_names(scenario), request_words(scenario)
    for message in messages:
        if isinstance(message, UserMessage) and not message.is_tool_call():
            text = message.content or ""
            bare = control_free(text)
            empty += is_empty(message)
            echoes += is_echo(bare, agent_last, vocabulary)
            foreign += other_language(bare)
            invented += [t for t in identifiers(bare) + stated_names(bare) if f" {words(t)} " not in f" {seen} "]
            invented += misspelt_names(bare, names, seen)
            if any(token in text for token in CONTROL_TOKENS) and not stated:
                stopped_early = True
            stated = stated or bool(wanted & set(words(bare).split())) or (not wanted and len(bare.split()) >= 3)
            if bare:
                texts.append(bare)
                runs[-1].append(bare)
        elif isinstance(message, UserMessage):
            runs.append([])
        elif isinstance(message, AssistantMessage) and message.content and not message.is_tool_call():
            agent_last = message.content
        seen += " " + words(getattr(message, "content", None) or "")
    user_turns = sum(isinstance(m, UserMessage) and not m.is_tool_call() for m in messages)
    user_stopped = any(isinstance(m, UserMessage) and any(t in (m.content or "") for t in CONTROL_TOKENS)
                       for m in messages)
    return {"user_turns": user_turns, "user_mean_chars": sum(map(len, texts)) / len(texts) if texts else 0.0,
            "user_mean_words": sum(len(t.split()) for t in texts) / len(texts) if texts else 0.0,
            "empty_replies": empty, "echoes": echoes, "looped": longest_loop(runs),
            "leakage": round(leakage(texts, scenario.hidden), 4),
            "invented_facts": sorted(set(invented)), "stopped_before_request": stopped_early,
            "never_stopped": termination_reason == "max_steps" and not user_stopped,
            "other_language": foreign}


def user_causes(monitors: Mapping[str, Any]) -> list[str]:
    """What the monitors say went wrong on the user's side, in USER_CAUSES order (empty for a clean episode; the
    records of an older run lack `looped`)."""
    hits = {USER_EMPTY: monitors["empty_replies"] > 0, USER_ECHOED: monitors["echoes"] > 0,
            USER_LOOPED: monitors.get("looped", 0) >= LOOP_RUN,
            USER_LEAKED: monitors["leakage"] >= LEAK_SHARE, USER_OTHER_LANGUAGE: monitors["other_language"] > 0,
            USER_WRONG_FACTS: bool(monitors["invented_facts"]),
            USER_STOPPED_AT_ONCE: monitors["stopped_before_request"], USER_NEVER_ENDED: monitors["never_stopped"]}
    return [cause for cause in USER_CAUSES if hits[cause]]


def batch_user_monitors(episodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Means of the user's turns and message length (characters, words), and the share of episodes with each
    user-side cause."""
    n = len(episodes)
    if n == 0:
        return {"episodes": 0}
    out: dict[str, Any] = {"episodes": n, "user_turns_mean": sum(e["user_turns"] for e in episodes) / n,
                           "user_mean_chars": sum(e["user_mean_chars"] for e in episodes) / n,
                           "user_mean_words": sum(e.get("user_mean_words", 0.0) for e in episodes) / n}
    causes = [set(user_causes(e)) for e in episodes]
    out["user_flagged_share"] = sum(bool(c) for c in causes) / n
    for cause, key in zip(USER_CAUSES, ("empty", "echo", "loop", "leak", "other_language", "wrong_facts",
                                        "stopped_at_once", "never_ended"), strict=True):
        out[f"user_{key}_share"] = sum(cause in c for c in causes) / n
    return out
