"""The original cookbook's command line, unchanged: `python3 eval/eval_passk.py --hf-checkpoint ... --sglang-url ...`.

The evaluator lives in the package (tau2_rl_pipeline/eval/, installed as `tau2-rl-eval`); this script only runs it,
so the commands users already have keep working. Run it with the project's interpreter (.venv/bin/python3, or with
the venv activated): it needs the installed package.
"""

import sys

try:
    from tau2_rl_pipeline.eval.eval_passk import main
except ModuleNotFoundError as exc:  # the package is not installed in this interpreter
    sys.exit(f"eval/eval_passk.py: {exc.name} is not installed here: run `bash scripts/setup.sh` and use "
             ".venv/bin/python3 (or `source .venv/bin/activate`)")

if __name__ == "__main__":
    sys.exit(main())
