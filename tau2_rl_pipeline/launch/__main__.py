"""`python3 -m tau2_rl_pipeline.launch STAGE --prog SCRIPT`: the stage scripts' one call to the planner.

Prints the plan's notes (the sizing sheet, the cluster plan, warnings) to stderr as `SCRIPT: line`, and on stdout the
plan in shell words for scripts/common.sh's runner (`StagePlan.to_bash`); a refusal is one `SCRIPT: error: line` and
exit status 1, before anything starts. Stdlib only: a dry run needs neither slime nor a GPU stack.
"""

from __future__ import annotations

import argparse
import os
import sys

from tau2_rl_pipeline.launch.build import STAGES, plan_stage
from tau2_rl_pipeline.launch.settings import Refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tau2_rl_pipeline.launch", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--prog", default="launch")
    a = parser.parse_args(argv)
    notes: list[str] = []
    try:
        plan = plan_stage(a.stage, a.prog, os.environ, os.getcwd(), notes=notes)
    except Refused as exc:
        print("".join(f"{a.prog}: {line}\n" for line in notes), end="", file=sys.stderr)
        print(f"{a.prog}: error: {exc}", file=sys.stderr)
        return 1
    print("".join(f"{a.prog}: {line}\n" for line in plan.notes), end="", file=sys.stderr)
    print(plan.to_bash(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
