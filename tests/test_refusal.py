"""The refusal detector (benchmark/refusal.py) on labelled agent messages (tests/data/refusals*.jsonl): realistic
customer-service turns in airline, retail and telecom, refusals and non-refusals, hard negatives among them (lookup
failures, conditionals, questions, the user's own inability, consequences stated before an offer to proceed).
`refusals.jsonl` and `refusals_heldout.jsonl` were both in front of whoever wrote the rules (the first from the start,
the second since the rules replaced the phrase patterns): they pin behaviour, they do not measure it.
docs/evaluation.md prints the counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.refusal import is_refusal, refusal_rule

DATA = Path(__file__).parent / "data"
# the floors a change to the patterns must keep (docs/evaluation.md: the measured values)
FLOORS = {"refusals.jsonl": (0.95, 0.95), "refusals_heldout.jsonl": (0.95, 0.95)}


# The phrase list the rules replaced (the first monitor's), kept here as the baseline that docs/evaluation.md sets
# beside them.
PHRASE_LIST = re.compile(
    r"\b(?:can(?:no|'|’)t|can ?not|(?:am|'m|’m) (?:unable|not able)|unable|won(?:'|’)t|will not"
    r"|not (?:allowed|permitted))"
    r" (?:to )?(?:help|assist|do that|process|proceed|fulfil+|complete|make|change|modify|cancel|book|provide)"
    r"|\bagainst (?:our|the) polic", re.IGNORECASE)
# (true positives, false positives, false negatives): the counts docs/evaluation.md prints
# The outside corpus's rules figure is the one AFTER it was read (three rule families widened, "without" no longer
# a condition: 40, 0, 6): not blind; the blind one is BLIND_FLOORS below.
MEASURED = {("refusals.jsonl", "rules"): (30, 0, 0), ("refusals.jsonl", "phrase list"): (10, 2, 20),
            ("refusals_heldout.jsonl", "rules"): (10, 0, 0), ("refusals_heldout.jsonl", "phrase list"): (2, 1, 8),
            ("refusals_outside.jsonl", "rules"): (40, 0, 6), ("refusals_outside.jsonl", "phrase list"): (6, 0, 40)}


# tests/data/refusals_outside.jsonl (91 messages: 46 refusals, 45 hard negatives; tests/data/refusals_outside.md says
# how) was written and labelled BLIND: by a separate helper that never read the detector, its tests or the corpora
# above, while the rules were being written. The rules were frozen at commit 4db9c79 before anyone here opened the
# file, and measured on it once: 35 true positives, 1 false positive, 11 misses, precision 35/36 = 0.97, recall
# 35/46 = 0.76 (under the 0.8 recall aimed at). Those blind figures are the floors below; whatever was changed after
# reading the file cannot count as blind (docs/evaluation.md keeps the two apart).
BLIND = "refusals_outside.jsonl"
BLIND_FLOORS = (35 / 36, 35 / 46)


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


def test_the_blind_corpus_keeps_the_figures_measured_once_before_it_was_read() -> None:
    rows = corpus(BLIND)
    assert (len(rows), sum(r["refusal"] for r in rows)) == (91, 46)
    precision, recall = precision_recall(rows)
    assert precision >= BLIND_FLOORS[0] and recall >= BLIND_FLOORS[1], (precision, recall)


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


@pytest.mark.parametrize("text,rule", [
    # what the phrase patterns missed on outside data: each kind of refusal, by its rule
    ("I must decline that request.", "declining verb"),
    ("I'm going to have to turn down the exchange.", "declining verb"),
    ("I'm afraid changing the name on the ticket isn't possible.", "impersonal impossibility"),
    ("That won't be possible, I'm afraid.", "impersonal impossibility"),
    ("I'm not in a position to offer compensation for the delay.", "agent inability"),
    ("No, I will not waive the change fee.", "agent unwillingness"),
    ("Sorry, refunds can only be issued to the original card.", "restriction, with an apology"),
    ("The system won't let me modify an order that has shipped.", "policy cited"),
    ("No changes can be made to a reservation that has been flown.", "impersonal impossibility"),
    ("That is beyond what we are permitted to do.", "impersonal impossibility"),
    ("Sorry, bending that rule is not something I will do.", "impersonal impossibility"),
    # a refusal inside a question sentence, as a clause of its own
    ("I can't change the cabin for one flight - would you like to upgrade the whole trip instead?", "agent inability"),
    ("How about keeping the current plan, since I can't switch it while the line is suspended?", "agent inability"),
    ("A refund isn't possible. Would you like a travel certificate instead?", "impersonal impossibility"),
    # what is not one
    ("Once cancelled, the reservation cannot be reinstated. Would you like me to proceed?", None),  # a consequence
    ("Please note that this cannot be undone. Are you sure you want to cancel?", None),
    ("Seats can't be changed after check-in, so let's pick one now.", None),  # a rule ahead, not a decision
    ("I won't charge your card until the exchange is complete.", None),  # good news, no apology
    ("I can't proceed until you confirm the details above.", None),  # waits on the customer
    ("Normally basic economy can't be changed, but since you bought insurance, I can change it.", None),
    ("Is it not possible for you to restart the phone?", None),  # the question itself
    ("We can't be sure of the delivery date, but it usually takes 3-5 days.", None),  # a hedge
    ("That's impossible to predict, but the weather looks fine.", None),
    ("I'm unable to pull up that order; could you give me the order number again?", None),  # a lookup
    ("You won't be charged a fee for this change.", None)])
def test_each_rule_and_what_is_not_a_refusal(text: str, rule: str | None) -> None:
    assert refusal_rule(text) == rule


@pytest.mark.parametrize("name,detector", sorted(MEASURED))
def test_the_counts_the_docs_print(name: str, detector: str) -> None:
    assert counts(corpus(name), is_refusal if detector == "rules" else PHRASE_LIST.search) == MEASURED[name, detector]
