"""The refusal detector (benchmark/refusal.py) on labelled agent messages (tests/data/refusals*.jsonl): realistic
customer-service turns in airline, retail and telecom, refusals and non-refusals, hard negatives among them (lookup
failures, conditionals, questions, the user's own inability). `refusals.jsonl` is the set the patterns were written
against; `refusals_heldout.jsonl` was written afterwards and never tuned on. docs/evaluation.md prints both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.refusal import is_refusal

DATA = Path(__file__).parent / "data"
# the floors a change to the patterns must keep (docs/evaluation.md: the measured values)
FLOORS = {"refusals.jsonl": (0.95, 0.95), "refusals_heldout.jsonl": (0.9, 0.75)}


def corpus(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def precision_recall(rows: list[dict]) -> tuple[float, float]:
    flagged = [is_refusal(r["text"]) for r in rows]
    tp = sum(f and r["refusal"] for f, r in zip(flagged, rows))
    return tp / max(1, sum(flagged)), tp / sum(r["refusal"] for r in rows)


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_precision_and_recall_floors_on_the_labelled_corpus(name: str) -> None:
    rows = corpus(name)
    assert {r["domain"] for r in rows} == {"airline", "retail", "telecom"}
    assert sum(r["refusal"] for r in rows) >= 10 and sum(not r["refusal"] for r in rows) >= 10
    precision, recall = precision_recall(rows)
    assert precision >= FLOORS[name][0] and recall >= FLOORS[name][1]


@pytest.mark.parametrize("text,refused", [
    ("Let me know if you can't make the 3 pm flight.", False),  # the user's inability, set as a condition
    ("I can't find a reservation under that id; could you check it?", False),  # a lookup, not a decision
    ("If it is not eligible, I won't be able to refund it.", False),  # a hypothesis
    ("Can't I help you with something else?", False),  # a question
    ("I’m unable to assist with that request.", True),  # a typographic apostrophe
    ("I cannot process a refund for a basic economy ticket.", True),
    ("Sorry, this order can no longer be cancelled.", True),
    ("That would be against our policy.", True)])
def test_clauses(text: str, refused: bool) -> None:
    assert is_refusal(text) is refused
