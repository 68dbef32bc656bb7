"""What a task's user scenario tells the user simulator, split the way the user-side checks need it.

What a task's user scenario tells the user simulator, split the way the user-side checks need it (pure, except
`scenario_of`, which reads tau2's user-simulator guidelines once):

- request: what the user calls about (the reason for the call; the whole instructions when they are one string,
  as in mock), and known: what it may say it knows (known info);
- hidden: what it is told but should never recite: the task instructions, the unknown info, the persona, and
  tau2's own user-simulator guidelines (the rest of its system prompt);
- facts: the values the gold actions need that the scenario states (ids, names, reasons, choices): each gold
  argument leaf (a string or number) whose words appear, as a whole, in the scenario. The probing oracle
  (oracle_play.py) asks for each of them with `probe_question` and checks the answer with `states`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tau2.data_model.tasks import Task

MIN_FACT_CHARS = 3  # shorter values ("no", "2") appear in any text: never asked for, never checked


def words(text: str) -> str:
    """Lower-case alphanumeric runs joined by one space: the form facts are compared in ("#W123" ~ "w123",
    "one_way" ~ "one-way")."""
    return " ".join(re.findall(r"[a-z0-9]+", (text or "").lower()))


def states(text: str, value: str) -> bool:
    """Whether `text` holds `value` as whole words (case and punctuation apart)."""
    target = words(value)
    return bool(target) and f" {target} " in f" {words(text)} "


@dataclass(frozen=True)
class Fact:
    """One value a gold action needs: the tool, the argument's words ("passenger 2 first name"), the value."""

    tool: str
    label: str
    value: str


@dataclass(frozen=True)
class Scenario:
    text: str
    request: str
    known: str = ""
    hidden: tuple[str, ...] = ()
    facts: tuple[Fact, ...] = field(default_factory=tuple)


def probe_question(fact: Fact) -> str:
    """The oracle's question for one fact (the scripted user answers exactly this question)."""
    return f"For {fact.tool.replace('_', ' ')}, what is the {fact.label}?"


def _label(path: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for key in path:
        if isinstance(key, int):
            name = parts.pop() if parts else "item"
            parts.append(f"{name[:-1] if name.endswith('s') else name} {key + 1}")
        else:
            parts.append(str(key).replace("_", " "))
    return " ".join(parts)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield path, str(value)


def scenario_facts(task: Task, text: str) -> tuple[Fact, ...]:
    """The agent-side gold actions' argument values that `text` (the scenario) states, each value once, in gold
    order."""
    actions = task.evaluation_criteria.actions or [] if task.evaluation_criteria else []
    facts: dict[str, Fact] = {}
    asked: dict[tuple[str, str], int] = {}
    for action in actions:
        if action.requestor != "assistant":
            continue
        for path, value in _leaves(action.arguments or {}):
            key = words(value)
            if len(key) >= MIN_FACT_CHARS and key not in facts and states(text, value):
                label = _label(path)
                n = asked[(action.name, label)] = asked.get((action.name, label), 0) + 1
                if n > 1:  # one question, one value: retail 39 looks a user up by two zips, the new one first
                    label = f"other {label}" if n == 2 else f"{label} number {n}"
                facts[key] = Fact(action.name, label, value)
    return tuple(facts.values())


def split_scenario(task: Task, guidelines: str = "") -> Scenario:
    """The task's scenario as the user-side checks read it (module docstring)."""
    user = task.user_scenario
    text = str(user)
    persona = (user.persona or "").strip() if getattr(user, "persona", None) else ""
    instructions = user.instructions
    if isinstance(instructions, str):
        request, known, hidden = instructions.strip(), "", [persona]
    else:
        request = (instructions.reason_for_call or "").strip()
        known = (instructions.known_info or "").strip()
        hidden = [persona, (instructions.task_instructions or "").strip(), (instructions.unknown_info or "").strip()]
    hidden.append(guidelines)
    return Scenario(text=text, request=request, known=known, hidden=tuple(h for h in hidden if h),
                    facts=scenario_facts(task, text))


@functools.cache
def _guidelines() -> str:
    from tau2.user.user_simulator import get_global_user_sim_guidelines

    return get_global_user_sim_guidelines(use_tools=False)


def scenario_of(task: Task) -> Scenario:
    """`split_scenario` with tau2's user-simulator guidelines among the hidden texts."""
    return split_scenario(task, _guidelines())
