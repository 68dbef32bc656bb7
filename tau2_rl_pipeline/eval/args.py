"""The evaluator's command line (tau2-rl-eval, python -m tau2_rl_pipeline.eval.eval_passk): every flag, in groups."""

from __future__ import annotations

import argparse
from pathlib import Path

from tau2_rl_pipeline.benchmark import USER_KINDS
from tau2_rl_pipeline.config import COUNT, SEED, TEMPERATURE, Bounded, add_config_args, command_parser
from tau2_rl_pipeline.eval.submission import add_submission_args

DESCRIPTION = "Pass@K evaluator: each (task, sample) is a tau2 episode, run concurrently, saved when done."


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "tau2-rl-eval", DESCRIPTION,
        epilog="Writes --output (summary JSON), <output>.episodes.jsonl (a rerun resumes it), tau2 results files "
               "and a PNG chart.")
    g = p.add_argument_group("policy")
    g.add_argument("--backend", choices=("sglang", "local"), default="sglang",
                   help="sglang (--sglang-url) or local (--model)")
    g.add_argument("--sglang-url", default=None,
                   help="SGLang server or router URL, or URLs, comma-separated")
    g.add_argument("--hf-checkpoint", default=None, help="checkpoint: local dir or HF hub id (sglang: its tokenizer)")
    g.add_argument("--model", default=None, help="local backend: model directory or hub id to load")
    g = p.add_argument_group("tasks")
    g.add_argument("--domains", default="airline,retail,telecom", help="comma-separated tau2 domains")
    g.add_argument("--task-split", default="test", help="split of every domain (mock: base)")
    g.add_argument("--num-samples", type=COUNT, default=4, help="episodes per task: n in pass@k, k <= n")
    g = p.add_argument_group("sampling", "default: Qwen3-4B-Instruct-2507's recommended settings (the demo evaluates "
                             "with top-p 1, top-k -1, 96 new tokens, 8 turns, seed 0: docs/evaluation.md)", more=True)
    g.add_argument("--temperature", type=TEMPERATURE, default=0.7)
    g.add_argument("--top-p", type=Bounded(float, above=0.0, at_most=1.0), default=0.8)
    g.add_argument("--top-k", type=Bounded(int, at_least=1, also=(-1,)), default=20, help="-1 = whole vocabulary")
    g.add_argument("--max-new-tokens", type=COUNT, default=1024, help="per policy turn")
    g.add_argument("--seed", type=SEED, default=300,
                   help="run seed; each episode's seed derives from it (a resumed run reproduces an uninterrupted one)")
    g = p.add_argument_group("run")
    g.add_argument("--user", choices=USER_KINDS, default="llm",
                   help="llm: tau2's user simulator; scripted: offline")
    g.add_argument("--output", type=Path, default=None, metavar="PATH",
                   help="default: outputs/eval/<model>.<domains>.<split>.json")
    g = p.add_argument_group("more run options", more=True)
    g.add_argument("--task-ids", default=None, help="comma-separated task ids (default: all)")
    g.add_argument("--device", default="auto", help="local backend: torch device (auto: cuda if any)")
    g.add_argument("--tokenizer", default=None, help="tokenizer dir or hub id; unset = the checkpoint's")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue <output>.episodes.jsonl: finished episodes kept, aborted ones retried")
    g.add_argument("--concurrency", type=COUNT, default=32, help="episodes in flight at once (over all --procs)")
    g.add_argument("--procs", type=COUNT, default=1,
                   help="rollout processes sharing episodes and concurrency (--backend sglang; bench/README.md, P2)")
    g.add_argument("--runs", type=COUNT, default=1,
                   help="repeat N times, each run its own seeds: mean +- sd over runs beside the pooled estimate")
    g.add_argument("--compare", type=Path, default=None, metavar="BASELINE.json",
                   help="also compare this run against a finished one over the same tasks (tau2-rl-compare)")
    add_submission_args(p)
    add_config_args(p)
    return p


def default_output(model: str | None, domains: list[str], split: str) -> Path:
    """One summary per checkpoint, domains and split, so a second evaluation never meets the first one's files:
    the checkpoint's last two path parts (outputs/demo/sft -> demo-sft; Org/Name -> Org-Name)."""
    parts = [x for x in Path(model or "model").parts if x not in ("/", ".", "..")][-2:]
    name = "-".join(parts).replace(" ", "_") or "model"
    return Path("outputs") / "eval" / f"{name}.{'+'.join(domains)}.{split}.json"


def csv_list(text: str) -> list[str]:
    return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
