"""tau2-rl-qualify-user's command line, parsed where nothing heavy is imported.

What it does is eval/qualify.py's; --help and a refused option answer at once here, and tau2 and litellm load only
when the run starts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from tau2_rl_pipeline.benchmark import USER_KINDS
from tau2_rl_pipeline.config import COUNT, SEED, Bounded, add_config_args, command_parser

DESCRIPTION = "how often does a user simulator sink a perfect agent?"


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("tau2-rl-qualify-user", DESCRIPTION,
                       epilog="QUALIFIED when the failure rate (tasks set aside apart) is at most --max-failure-rate; "
                              "exit 0 qualified, 1 not, 2 bad setup.")
    p.add_argument("--user", choices=USER_KINDS, default="llm",
                   help="llm = tau2's user simulator as TAU2_USER_* configure it; scripted = the offline user")
    p.add_argument("--domains", default="airline,retail,telecom", help="comma-separated tau2 domains")
    p.add_argument("--task-split", default="test", help="split of every domain ('base' only: mock)")
    p.add_argument("--task-ids", default=None, help="comma-separated task ids (default: all)")
    p.add_argument("--num-samples", type=COUNT, default=1, help="oracle episodes per task")
    p.add_argument("--seed", type=SEED, default=300, help="run seed (each episode's user seed derives from it)")
    p.add_argument("--concurrency", type=COUNT, default=16, help="episodes in flight at once")
    p.add_argument("--max-failure-rate", type=Bounded(float, at_least=0.0, at_most=1.0), default=0.05,
                   help="the verdict's bound (tasks set aside apart). A failing user takes longer: each task it "
                        "fails is replayed once without a user, until the verdict is settled")
    p.add_argument("--against", type=Path, action="append", default=[], metavar="OTHER.json",
                   help="another simulator's qualification: a task is set aside only if it fails there too")
    p.add_argument("--output", type=Path, default=Path("outputs/qualify/user.json"), help="summary JSON path")
    g = p.add_argument_group("the GRPO gate (scripts/train_grpo.sh runs it)", more=True)
    g.add_argument("--check", type=Path, default=None, metavar="SUMMARY.json",
                   help="only check that a finished qualification covers this run (TAU2_USER_* settings, tau2 "
                        "version, --run-tasks' domains and splits, else --domains x --task-split) within "
                        "--max-failure-rate (eval/qualify_gate.py)")
    g.add_argument("--run-tasks", type=Path, default=None, metavar="TASKS.jsonl",
                   help="with --check: the GRPO task index whose domains and splits the qualification must cover")
    add_config_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from tau2_rl_pipeline.eval.qualify import run  # tau2's user stack and litellm: seconds, after parsing

    return run(args)
