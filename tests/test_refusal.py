"""The refusal detector (benchmark/refusal.py) on labelled agent messages (tests/data/refusals*.jsonl): realistic
customer-service turns in airline, retail and telecom, refusals and non-refusals, hard negatives among them (lookup
failures, conditionals, questions, the user's own inability). `refusals.jsonl` is the set the patterns were written
against; `refusals_heldout.jsonl` was written afterwards and never tuned on. docs/evaluation.md prints both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.refusal import is_refusal

DATA = Path(__file__).parent / "data"
# the floors a change to the patterns must keep (docs/evaluation.md: the measured values)
FLOORS = {"refusals.jsonl": (0.95, 0.95), "refusals_heldout.jsonl": (0.9, 0.75)}


# The phrase list the patterns replaced (benchmark/monitors.py before issue 31), kept here as the baseline that
# docs/evaluation.md sets beside them.
PHRASE_LIST = re.compile(
    r"\b(?:can(?:no|'|’)t|can ?not|(?:am|'m|’m) (?:unable|not able)|unable|won(?:'|’)t|will not"
    r"|not (?:allowed|permitted))"
    r" (?:to )?(?:help|assist|do that|process|proceed|fulfil+|complete|make|change|modify|cancel|book|provide)"
    r"|\bagainst (?:our|the) polic", re.IGNORECASE)
# (true positives, false positives, false negatives): the counts docs/evaluation.md prints
MEASURED = {("refusals.jsonl", "patterns"): (30, 0, 0), ("refusals.jsonl", "phrase list"): (10, 2, 20),
            ("refusals_heldout.jsonl", "patterns"): (8, 0, 2), ("refusals_heldout.jsonl", "phrase list"): (2, 1, 8)}


def corpus(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def counts(rows: list[dict], detector=is_refusal) -> tuple[int, int, int]:
    flagged = [bool(detector(r["text"])) for r in rows]
    tp = sum(f and r["refusal"] for f, r in zip(flagged, rows))
    return tp, sum(flagged) - tp, sum(r["refusal"] for r in rows) - tp


def precision_recall(rows: list[dict]) -> tuple[float, float]:
    tp, fp, fn = counts(rows)
    return tp / max(1, tp + fp), tp / (tp + fn)


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
    ("If the fee is $12.40 or more, I can't waive it.", False),  # a decimal point ends no sentence
    ("Your total is $12.40. I can't waive the fee, sorry.", True),
    ("I’m unable to assist with that request.", True),  # a typographic apostrophe
    ("I cannot process a refund for a basic economy ticket.", True),
    ("Sorry, this order can no longer be cancelled.", True),
    ("That would be against our policy.", True)])
def test_clauses(text: str, refused: bool) -> None:
    assert is_refusal(text) is refused


@pytest.mark.parametrize("name,detector", sorted(MEASURED))
def test_the_counts_the_docs_print(name: str, detector: str) -> None:
    assert counts(corpus(name), is_refusal if detector == "patterns" else PHRASE_LIST.search) == MEASURED[name, detector]
