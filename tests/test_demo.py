"""`bash scripts/demo.sh` from a fresh clone: every stage runs and the report carries each stage's numbers.

The settings are cut down to keep CI fast (the README's demo uses the defaults); the virtual environment is the
suite's own (TAU2_VENV), so the clone is fresh but nothing is downloaded again.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to clone the repository")
def test_demo_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    out = tmp_path / "demo"
    env = {**os.environ, "TAU2_VENV": sys.prefix}
    proc = subprocess.run(
        ["bash", "scripts/demo.sh", "--out", str(out), "--sft-epochs", "2", "--rft-epochs", "1", "--rft-samples", "1",
         "--grpo-steps", "1", "--grpo-tasks-per-step", "2", "--grpo-n", "2", "--eval-samples", "2",
         "--max-turns", "2", "--max-new-tokens", "24", "--hidden-size", "32"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == ["base", "sft", "rft", "grpo"]
    for numbers in report["stages"].values():
        assert numbers["pass@1"]["n_tasks"] == 9 and numbers["pass@1"]["n_episodes"] == 18
        assert 0.0 <= numbers["pass@1"]["value"] <= 1.0
    assert report["sft"]["demonstrations"] >= 5 and report["sft"]["loss_after"] < report["sft"]["loss_before"]
    assert len(report["grpo"]["history"]) == 1
    for chart in report["charts"]:
        assert Path(chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "pass rates per stage" in proc.stdout and "vs untrained pass@1" in proc.stdout
