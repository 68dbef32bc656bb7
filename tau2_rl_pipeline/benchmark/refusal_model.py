"""The refusal detector's learned half: a logistic regression over word uni- and bigrams, pure-Python inference.

Rules over clause structure (refusal.py) miss each new writer's ways of saying no: on four corpora, each written
blind by a different writer, they found 0.71 to 0.82 of the refusals before their misses were read. A linear model over
tf-idf word uni- and bigrams, trained on the corpora of the other writers, found 0.85 to 0.98 of each writer's
refusals at precision 0.95 or more (`python scripts/train_refusal_model.py --folds`), and the two together more than
either; frozen, the two found 0.96 of a further writer's refusals at precision 0.96 (docs/evaluation.md). So a
message counts as a refusal when a rule matches or, unless a rule's match was set aside, this model's probability
reaches THRESHOLD.

The weights (refusal_model.json, shipped in the package) are made by `python scripts/train_refusal_model.py` from the
labelled corpora in tests/data (sklearn's TfidfVectorizer with `features` as its analyzer, min_df 2, sublinear tf,
and LogisticRegression, C 10, balanced classes); a test retrains and compares. Inference here repeats sklearn's
arithmetic: tf 1 + ln(count), times the idf, L2-normalised, dotted with the weights, plus the intercept, a sigmoid.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from importlib import resources

from tau2_rl_pipeline.benchmark.refusal import normalise

THRESHOLD = 0.6  # chosen on held-out writers (every fold: precision >= 0.95 with the rules), not on the final one
MODEL_FILE = "refusal_model.json"
_TOKEN = re.compile(r"[a-z0-9]+|\?")


def features(text: str) -> list[str]:
    """The message's word unigrams and bigrams, after refusal.normalise (contractions spelled out), "?" a word."""
    words = _TOKEN.findall(normalise(text))
    return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


@dataclass(frozen=True)
class Model:
    idf: dict[str, float]
    weights: dict[str, float]
    intercept: float

    def probability(self, text: str) -> float:
        counts = Counter(g for g in features(text) if g in self.idf)
        values = {g: (1.0 + math.log(n)) * self.idf[g] for g, n in counts.items()}
        norm = math.sqrt(sum(v * v for v in values.values())) or 1.0
        z = self.intercept + sum(v * self.weights[g] for g, v in values.items()) / norm
        return 1.0 / (1.0 + math.exp(-z))


def from_dict(state: dict) -> Model:
    return Model(idf=state["idf"], weights=state["weights"], intercept=float(state["intercept"]))


@cache
def shipped() -> Model:
    """The model in the package (read once)."""
    return from_dict(json.loads(resources.files("tau2_rl_pipeline.benchmark").joinpath(MODEL_FILE).read_text()))


def learned_refusal(text: str, model: Model | None = None) -> bool:
    """The model (the shipped one unless given) puts the message at THRESHOLD or above."""
    return (model or shipped()).probability(text) >= THRESHOLD
