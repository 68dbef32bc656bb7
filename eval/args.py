"""The evaluator's command line (tau2-rl-eval, python -m eval.eval_passk): every flag, in groups."""

from __future__ import annotations

import argparse
from pathlib import Path

from eval.submission import add_submission_args
from tau2_rl_pipeline.benchmark.users import USER_KINDS
from tau2_rl_pipeline.config import add_config_args, command_parser

DESCRIPTION = "Pass@K evaluator: each (task, sample) is a tau2 episode, run concurrently, saved when done."


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "tau2-rl-eval", DESCRIPTION,
        epilog="Writes --output, its .episodes.jsonl (resumable), tau2 results, a chart. Demo: tau2-rl-eval --backend "
               "local --model outputs/demo/sft --user scripted --domains mock --task-split base")
    g = p.add_argument_group("policy")
    g.add_argument("--backend", choices=("sglang", "local"), default="sglang",
                   help="sglang = an SGLang server (--sglang-url); local = the in-process engine on --model")
    g.add_argument("--sglang-url", default=None, help="SGLang server or router, e.g. http://127.0.0.1:30000")
    g.add_argument("--hf-checkpoint", default=None,
                   help="checkpoint evaluated: local dir or hub id in the HF cache (sglang: its tokenizer; local: "
                        "its weights unless --model)")
    g.add_argument("--model", default=None, help="local backend: model directory or hub id to load")
    g.add_argument("--tokenizer", default=None, help="tokenizer dir or hub id; unset = the checkpoint's")
    g.add_argument("--device", default="auto", help="local backend: torch device, cuda if any")
    g = p.add_argument_group("tasks")
    g.add_argument("--domains", default="airline,retail,telecom", help="comma-separated tau2 domains")
    g.add_argument("--task-split", default="test",
                   help="split of every domain ('base' only: mock, banking_knowledge)")
    g.add_argument("--task-ids", default=None,
                   help="comma-separated task ids (default: all)")
    g.add_argument("--num-samples", type=int, default=4, help="episodes per task: n in pass@k / pass^k, k <= n")
    g.add_argument("--runs", type=int, default=1, metavar="N", help="N runs, new seeds each: mean +- sd, pooled")
    g = p.add_argument_group("sampling (default: Qwen3-4B-Instruct-2507's recommended settings)")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--top-p", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=20, help="-1 = whole vocabulary")
    g.add_argument("--max-new-tokens", type=int, default=1024, help="per policy turn")
    g.add_argument("--seed", type=int, default=300,
                   help="run seed; each episode's seed derives from it (a resumed run reproduces an uninterrupted one)")
    g = p.add_argument_group("run")
    g.add_argument("--user", choices=USER_KINDS, default="llm",
                   help="llm = tau2's user simulator; scripted = offline ScriptedUser (plumbing check, not a tau2 score)")
    g.add_argument("--concurrency", type=int, default=32, help="episodes in flight at once (over all --procs)")
    g.add_argument("--procs", type=int, default=1,
                   help="rollout processes sharing episodes and concurrency (--backend sglang; bench/README.md, P2)")
    g.add_argument("--output", type=Path, default=Path("outputs/eval/passk.json"), help="summary JSON path")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue <output>.episodes.jsonl: finished episodes kept, aborted ones retried")
    g.add_argument("--compare", type=Path, default=None, metavar="BASELINE.json",
                   help="paired test against a finished run (tau2-rl-compare)")
    add_submission_args(p)
    add_config_args(p)
    return p


def csv_list(text: str) -> list[str]:
    return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
