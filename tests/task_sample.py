"""The test tasks the parametrized reward checks (oracle replays, fast_env parity) run on.

Normally every test task of airline, retail and telecom. The tau2 1.0.1 pass (tests/test_tau2_v1.py) sets
TAU2_TEST_TASKS_PER_DOMAIN=n to keep the suite within its time: n tasks per domain, the judged ones (retail's NL
assertions) first, the rest spread evenly over the split. A full 1.0.1 sweep is the same command without it.
"""

from __future__ import annotations

import os

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import needs_judge

PER_DOMAIN_ENV = "TAU2_TEST_TASKS_PER_DOMAIN"


def representative(tasks: list, n: int) -> list:
    """n of `tasks`: the judged ones first, then evenly spaced others, in the split's order."""
    judged = [t for t in tasks if needs_judge(t)][: max(1, n // 2)]
    rest = [t for t in tasks if t not in judged]
    picked = judged + rest[:: max(1, len(rest) // max(1, n - len(judged)))][: n - len(judged)]
    return [t for t in tasks if t in picked]


def test_tasks(domains=("airline", "retail", "telecom"), split: str = "test") -> list[tuple[str, object]]:
    n = int(os.environ.get(PER_DOMAIN_ENV, "0"))
    return [(d, t) for d in domains for t in (representative(load_tasks(d, split), n) if n else load_tasks(d, split))]


test_tasks.__test__ = False  # a helper, not a pytest test
