"""The refusal detector (benchmark/refusal.py) on labelled agent messages (tests/data/refusals*.jsonl): realistic
customer-service turns in airline, retail and telecom, refusals and non-refusals, hard negatives among them (lookup
failures, conditionals, questions, the user's own inability, consequences stated before an offer to proceed).
`refusals.jsonl` and `refusals_heldout.jsonl` were both in front of whoever wrote the rules (the first from the start,
the second since the rules replaced the phrase patterns): they pin behaviour, they do not measure it.
docs/evaluation.md prints the counts."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.refusal import is_refusal, refusal_rule

DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location("train_refusal_model",
                                               Path(__file__).parents[1] / "scripts" / "train_refusal_model.py")
train_refusal_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_refusal_model)
# the floors a change to the patterns must keep (docs/evaluation.md: the measured values)
FLOORS = {"refusals.jsonl": (0.95, 0.95), "refusals_heldout.jsonl": (0.95, 0.95)}


# The phrase list the rules replaced (the first monitor's), kept here as the baseline that docs/evaluation.md sets
# beside them.
PHRASE_LIST = re.compile(
    r"\b(?:can(?:no|'|’)t|can ?not|(?:am|'m|’m) (?:unable|not able)|unable|won(?:'|’)t|will not"
    r"|not (?:allowed|permitted))"
    r" (?:to )?(?:help|assist|do that|process|proceed|fulfil+|complete|make|change|modify|cancel|book|provide)"
    r"|\bagainst (?:our|the) polic", re.IGNORECASE)
# (true positives, false positives, false negatives): the counts docs/evaluation.md prints, of the detector as shipped
# (the rules, then the learned model) and of the phrase list alone. Every corpus but F was trained or tuned on, so the
# others pin behaviour; they do not measure it.
MEASURED = {("refusals.jsonl", "rules"): (30, 0, 0), ("refusals.jsonl", "phrase list"): (10, 2, 20),
            ("refusals_heldout.jsonl", "rules"): (10, 0, 0), ("refusals_heldout.jsonl", "phrase list"): (2, 1, 8),
            ("refusals_outside.jsonl", "rules"): (46, 0, 0), ("refusals_outside.jsonl", "phrase list"): (6, 0, 40),
            ("refusals_blind_b.jsonl", "rules"): (65, 0, 0), ("refusals_blind_c.jsonl", "rules"): (60, 0, 0),
            ("refusals_blind_d.jsonl", "rules"): (63, 0, 2), ("refusals_blind_e.jsonl", "rules"): (63, 0, 2),
            ("refusals_blind_f.jsonl", "rules"): (67, 3, 3)}


# Each corpus below was written and labelled BLIND, by a separate writer that never read the detector, its tests or
# the other corpora (tests/data/<corpus>.md says how), and measured ONCE with the detector frozen at the commit named,
# before anyone here opened it: (commit, true positives, false positives, misses). Only that first figure is blind;
# the detector was then widened on the corpus's misses (and the learned model trained on it), so each later figure on
# it is not. The blind figures stay as floors.
BLIND = {"refusals_outside.jsonl": ("4db9c79", 35, 1, 11), "refusals_blind_b.jsonl": ("d25e47b", 47, 1, 18),
         "refusals_blind_c.jsonl": ("8f4fe06", 45, 2, 15), "refusals_blind_d.jsonl": ("ccdf6dd", 53, 2, 12),
         "refusals_blind_e.jsonl": ("80aa004", 46, 0, 19),
         # the detector as shipped (the rules and the learned model), F neither read nor trained on since
         "refusals_blind_f.jsonl": ("5029c70", 67, 3, 3)}
# Each writer's corpus held out, the model trained on the others (scripts/train_refusal_model.py --folds): the model
# alone, and the shipped combination (the rules, tuned on every corpus but E at the time, then the model).
FOLDS = {"written against the rules": {"model": (39, 0, 1), "rules or model": (40, 0, 0)},
         "outside": {"model": (42, 0, 4), "rules or model": (46, 0, 0)},
         "B": {"model": (62, 0, 3), "rules or model": (65, 0, 0)},
         "C": {"model": (57, 3, 3), "rules or model": (59, 2, 1)},
         "D": {"model": (61, 1, 4), "rules or model": (63, 0, 2)},
         "E": {"model": (55, 1, 10), "rules or model": (62, 0, 3)}}


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


@pytest.mark.parametrize("name", sorted(BLIND))
def test_each_blind_corpus_keeps_the_figures_measured_once_before_it_was_read(name: str) -> None:
    rows = corpus(name)
    _, tp, fp, fn = BLIND[name]
    assert sum(r["refusal"] for r in rows) == tp + fn
    precision, recall = precision_recall(rows)
    assert precision >= tp / (tp + fp) and recall >= tp / (tp + fn), (precision, recall)


def test_each_writer_held_out_gives_the_figures_the_docs_print() -> None:
    folds = train_refusal_model.folds()
    assert {writer: {k: tuple(v) for k, v in got.items()} for writer, got in folds.items()} == FOLDS


def test_the_shipped_model_is_the_one_the_corpora_make() -> None:
    assert train_refusal_model.main(["--check"]) == 0  # else: python scripts/train_refusal_model.py


def test_the_learned_model_does_not_overrule_a_clause_the_rules_set_aside() -> None:
    from tau2_rl_pipeline.benchmark.refusal_model import shipped

    text = "If it is not eligible, I won't be able to refund it."
    assert shipped().probability(text) >= 0.6  # the model alone would call it a refusal
    assert refusal_rule(text) is None


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
