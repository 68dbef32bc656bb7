"""The NL-assertion judge's answers in tests: gpt-4.1 cannot run here and a tiny model cannot judge, so the loopback
server answers tau2 1.0.1's judge prompt in the exact JSON tau2 parses (`chat_answer`), over real HTTP, through the
project's judge client. `verdict(outcome) -> bool` decides each expected outcome (default: met)."""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

_OUTCOMES = re.compile(r"expectedOutcomes:\s*(\[.*\])\s*$", re.S)


def expected_outcomes(body: dict[str, Any]) -> list[str] | None:
    """The assertions listed in tau2's judge prompt (its user turn ends with `expectedOutcomes:` + a list)."""
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str):
            match = _OUTCOMES.search(content)
            if match:
                return list(ast.literal_eval(match.group(1)))
    return None


def judge_answer(verdict: Callable[[str], bool] = lambda outcome: True) -> Callable[[dict[str, Any]], str | None]:
    def answer(body: dict[str, Any]) -> str | None:
        outcomes = expected_outcomes(body)
        if outcomes is None:
            return None  # not a judge request: the model answers
        return json.dumps({"results": [{"expectedOutcome": o, "reasoning": "loopback judge", "metExpectation":
                                        verdict(o)} for o in outcomes]})

    return answer
