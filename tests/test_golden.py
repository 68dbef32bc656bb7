"""The golden dry runs (tests/support/golden.py): every stage script's DRY_RUN=1 output, for each stage x layout
(one node, hostfiles of 2x4 and 4x2, a running cluster by RAY_ADDRESS) x preset, equal to tests/golden/.

A difference is a change of what a user's command would do: the failure shows it as a diff; an intended one is
regenerated with `python -m support.golden --write` (from tests/) and named in its commit message.
"""

from __future__ import annotations

from support.golden import GOLDEN, cases, differences, run_all


def test_every_golden_file_has_its_case() -> None:
    names = {c.name for c in cases()}
    assert len(names) == len(cases()) and {p.stem for p in GOLDEN.glob("*.txt")} == names


def test_the_dry_runs_equal_their_golden_files() -> None:
    diffs = differences(run_all())
    assert not diffs, "the dry runs differ from tests/golden/ (rewrite with python -m support.golden --write):\n" + \
        "\n".join(diffs)
