"""Does qualification catch a misbehaving user? The oracle against the canned users.

Does qualification catch a misbehaving user? The oracle of tau2-rl-qualify-user against the scripted user and
each canned user (tau2_rl_pipeline/eval/canned_users.py: a well-behaved one and one per known misbehaviour), on
real tau2 environments scored by tau2's evaluator; prints docs/evaluation.md's table (markdown).

    python -m tau2_rl_pipeline.eval.qualify_canned --domains mock,airline
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any

from tau2_rl_pipeline.benchmark.tasks import TaskLookupError
from tau2_rl_pipeline.benchmark.users import ScriptedUser
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.eval.args import csv_list
from tau2_rl_pipeline.eval.canned_users import CANNED_USERS
from tau2_rl_pipeline.eval.plan import make_plan
from tau2_rl_pipeline.eval.qualify import failing_tasks, qualification, run_oracle, set_aside_tasks
from tau2_rl_pipeline.metrics import is_success

USERS = {"scripted": ScriptedUser, **CANNED_USERS}


def qualify_user(name: str, domain: str, task_ids: Sequence[str] | None, max_failure_rate: float,
                 cfg: Tau2Config) -> dict[str, Any]:
    """One user on one domain's tasks (mock: base split, others: test): the qualification of its episodes (every
    failing task replayed, so that each one set aside is known), the causes of every bad one (each episode's
    causes, not only the first) and the records of the tasks not set aside."""
    plan = make_plan([domain], "base" if domain == "mock" else "test", task_ids, 1)
    user = USERS[name]
    records = asyncio.run(run_oracle(plan.episodes(), lambda task, environment: user(task), cfg, 300, 4))
    aside, _ = set_aside_tasks(plan.tasks, failing_tasks(records), records, None)  # each cause known: replay all
    result = qualification(records, aside, max_failure_rate)
    kept = [r for r in records if (domain, r["task_id"]) not in aside]
    result["records"] = kept
    result["all_causes"] = Counter(c for r in kept for c in r["qualify_causes"])
    result["flagged_successes"] = sum(is_success(r["reward"]) and bool(r["qualify_cause"]) for r in kept)
    return result


def table_rows(results: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    lines = ["| user | domain | qualified | bad episodes | of which scored 1.0 | first cause (episodes) | "
             "every cause named (episodes) | words / message |", "|---|---|---|---|---|---|---|---|"]
    for (name, domain), result in results.items():
        rate = result["overall"]
        d = result["domains"][domain]
        first = "; ".join(f"{c} ({v['episodes']})" for c, v in d["causes"].items()) or "-"
        every = "; ".join(f"{c} ({n})" for c, n in result["all_causes"].most_common()) or "-"
        lines.append(f"| {name} | {domain} | {'yes' if result['qualified'] else 'no'} | "
                     f"{rate['failed']}/{rate['n_episodes']} = {rate['value']:.2f} | {result['flagged_successes']} | "
                     f"{first} | {every} | {d['user_words_per_message']:.0f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tau2_rl_pipeline.eval.qualify_canned",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", default="mock,airline")
    p.add_argument("--users", default=",".join(USERS), help=f"of {', '.join(USERS)}")
    p.add_argument("--task-ids", default=None, help="comma-separated task ids (default: all)")
    p.add_argument("--max-failure-rate", type=float, default=0.05)
    args = p.parse_args(argv)
    names = csv_list(args.users)
    unknown = [n for n in names if n not in USERS]
    if unknown:
        print(f"error: unknown user(s) {', '.join(unknown)}; valid: {', '.join(USERS)}", file=sys.stderr)
        return 2
    cfg = Tau2Config.from_env()
    ids = csv_list(args.task_ids) if args.task_ids else None
    try:
        results = {(n, d): qualify_user(n, d, ids, args.max_failure_rate, cfg)
                   for n in names for d in csv_list(args.domains)}
    except TaskLookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(table_rows(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
