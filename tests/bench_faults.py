"""bench/faults.py (a script, not a package module) loaded once for the tests that share its fault machinery."""

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "bench" / "faults.py"
_spec = importlib.util.spec_from_file_location("bench_faults_impl", _PATH)
faults = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = faults
_spec.loader.exec_module(faults)
