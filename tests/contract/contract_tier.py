"""Puts slime, Megatron-LM and the SGLang double on sys.path (tests only), or says why the tier cannot run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from third_party import third_party_path

SLIME_DIR = third_party_path() / "slime-624b824"
MEGATRON_DIR = third_party_path() / "megatron-lm-1dcf0daf"
SGLANG_DOUBLE = Path(__file__).resolve().parent / "sglang_double"
TIER_PACKAGES = ("ray", "wandb", "triton", "pybase64", "sglang_router")


def _missing() -> str | None:
    for path in (SLIME_DIR, MEGATRON_DIR):
        if not path.is_dir():
            return (f"contract tier skipped: {path} not found; put the pinned slime and Megatron-LM sources of "
                    "../shared/third_party beside the repository or set TAU2_THIRD_PARTY=DIR")
    absent = [name for name in TIER_PACKAGES if importlib.util.find_spec(name) is None]
    if absent:
        return (f"contract tier skipped: {', '.join(absent)} not installed; bash scripts/test.sh installs "
                "requirements-contract.lock")
    return None


MISSING = _missing()
if MISSING is None:
    for path in (MEGATRON_DIR, SLIME_DIR, SGLANG_DOUBLE):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
