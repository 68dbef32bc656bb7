"""Train the refusal detector's learned half (tau2_rl_pipeline/benchmark/refusal_model.json) from the labelled corpora.

    python scripts/train_refusal_model.py            # rewrite the shipped weights from tests/data/refusals*.jsonl
    python scripts/train_refusal_model.py --check    # exit 1 if the shipped weights are not what the corpora make
    python scripts/train_refusal_model.py --folds    # each writer's corpus held out: the model trained on the others

The corpora are the ones written blind by separate writers (tests/data/refusals_*.md say how each was made) and the
two written against the rules. refusals_blind_f.jsonl, measured blind on the frozen detector, is never trained on:
it stays a measurement. sklearn (a dependency of tau2) trains; the package's inference needs only the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tau2_rl_pipeline.benchmark import refusal_model  # noqa: E402
from tau2_rl_pipeline.benchmark.refusal import refusal_rule  # noqa: E402

DATA = ROOT / "tests" / "data"
# writer -> corpus files: a fold holds out one writer
TRAIN = {"written against the rules": ("refusals.jsonl", "refusals_heldout.jsonl"),
         "outside": ("refusals_outside.jsonl",), "B": ("refusals_blind_b.jsonl",), "C": ("refusals_blind_c.jsonl",),
         "D": ("refusals_blind_d.jsonl",), "E": ("refusals_blind_e.jsonl",)}
OUT = ROOT / "tau2_rl_pipeline" / "benchmark" / refusal_model.MODEL_FILE
DIGITS = 6


def rows(names: tuple[str, ...]) -> list[dict]:
    return [json.loads(line) for name in names for line in (DATA / name).read_text().splitlines() if line.strip()]


def fit(train: list[dict]) -> dict:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    vectorizer = TfidfVectorizer(analyzer=refusal_model.features, min_df=2, sublinear_tf=True)
    x = vectorizer.fit_transform([r["text"] for r in train])
    model = LogisticRegression(C=10.0, class_weight="balanced", max_iter=5000).fit(x, [r["refusal"] for r in train])
    vocabulary = sorted(vectorizer.vocabulary_, key=vectorizer.vocabulary_.get)
    return {"about": "refusal_model.py: made by scripts/train_refusal_model.py; do not edit",
            "corpora": sorted(n for names in TRAIN.values() for n in names), "rows": len(train),
            "idf": {g: round(float(v), DIGITS) for g, v in zip(vocabulary, vectorizer.idf_)},
            "weights": {g: round(float(v), DIGITS) for g, v in zip(vocabulary, model.coef_[0])},
            "intercept": round(float(model.intercept_[0]), DIGITS)}


def combined(text: str, model: refusal_model.Model) -> bool:
    """refusal.refusal_rule's verdict with `model` in place of the shipped one."""
    return refusal_rule(text, model) is not None


def counts(labelled: list[dict], flagged: list[bool]) -> tuple[int, int, int]:
    tp = sum(f and r["refusal"] for f, r in zip(flagged, labelled))
    return tp, sum(flagged) - tp, sum(r["refusal"] for r in labelled) - tp


def folds() -> dict[str, dict[str, tuple[int, int, int]]]:
    """For each writer: the model trained on the other writers' corpora, alone and with the rules, on this one."""
    out = {}
    for writer, names in TRAIN.items():
        model = refusal_model.from_dict(fit([r for w, n in TRAIN.items() if w != writer for r in rows(n)]))
        held = rows(names)
        learned = [refusal_model.learned_refusal(r["text"], model) for r in held]
        out[writer] = {"model": counts(held, learned),
                       "rules or model": counts(held, [combined(r["text"], model) for r in held])}
    return out


def same(a: dict, b: dict, tolerance: float = 1e-4) -> bool:
    """Equal vocabularies, and weights and idf within `tolerance` (another BLAS may round the last digits apart)."""
    return (a["idf"].keys() == b["idf"].keys() and abs(a["intercept"] - b["intercept"]) <= tolerance
            and all(abs(a[k][g] - b[k][g]) <= tolerance for k in ("idf", "weights") for g in a["idf"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the shipped weights are stale")
    parser.add_argument("--folds", action="store_true", help="print each writer held out")
    args = parser.parse_args(argv)
    if args.folds:
        for writer, result in folds().items():
            print(writer, json.dumps(result))
        return 0
    made = fit([r for names in TRAIN.values() for r in rows(names)])
    if args.check:
        if not same(made, json.loads(OUT.read_text())):
            print(f"{OUT.relative_to(ROOT)} is not what the corpora make: python scripts/train_refusal_model.py",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(json.dumps(made, indent=0, sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(made['weights'])} features from {made['rows']} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
