"""Secrets: API key values planted in OPENAI_API_KEY, HF_TOKEN and WANDB_API_KEY never reach a log, an episode,
a result, a chart's metadata or an error message, even when the user simulator's server fails mid-run and its
errors are recorded. Every output is scanned: files byte for byte (PNG text chunks decompressed), logs, stdout
and stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.loopback_server import LoopbackServer

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.config import Tau2Config

ROOT = Path(__file__).resolve().parents[1]
PLANTED = {"OPENAI_API_KEY": "sk-planted-OPENAI-1234", "HF_TOKEN": "hf_planted_5678",
           "WANDB_API_KEY": "planted-wandb-9012"}


from bench_faults import faults  # noqa: E402  (bench/faults.py, shared by the hardening tests)


def needles(value: str) -> list[bytes]:
    """The value, and its middle third on its own: a key cut or partly masked ("sk-pl...1234") still shows."""
    third = len(value) // 3
    return [value.encode(), value[third: 2 * third + 1].encode()]


def leaks(data: bytes, where: str) -> list[str]:
    return [f"{name} in {where}" for name, value in PLANTED.items() if any(n in data for n in needles(value))]


def png_texts(data: bytes) -> Iterator[bytes]:
    """The text chunks of a PNG (tEXt as is, zTXt and compressed iTXt inflated): where charts keep metadata."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos: pos + 4])
        kind, body = data[pos + 4: pos + 8], data[pos + 8: pos + 8 + length]
        if kind == b"tEXt":
            yield body
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            yield key + b"\0" + zlib.decompress(rest[1:])
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            compressed = rest[0] == 1
            text = rest[2:].split(b"\0", 2)[-1]
            yield key + b"\0" + (zlib.decompress(text) if compressed else text)
        pos += 12 + length


def scan_tree(root: Path) -> tuple[list[str], int]:
    """Leaks in every file under `root`, and how many files were read."""
    found, files = [], 0
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files += 1
        found += leaks(data, str(path))
        if path.suffix == ".png":
            for text in png_texts(data):
                found += leaks(text, f"{path} (text chunk)")
    return found, files


def test_the_scanner_finds_a_planted_value_in_each_place_it_looks(tmp_path: Path) -> None:
    assert leaks(b'{"error": "bad key sk-planted-OPENAI-1234"}', "x") == ["OPENAI_API_KEY in x"]
    assert leaks(b"Incorrect API key: ****ted-OPENAI****", "x") == ["OPENAI_API_KEY in x"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    fig.savefig(tmp_path / "chart.png", metadata={"Description": "hf_planted_5678"})
    plt.close(fig)
    assert scan_tree(tmp_path) == ([f"HF_TOKEN in {tmp_path / 'chart.png'}",
                                    f"HF_TOKEN in {tmp_path / 'chart.png'} (text chunk)"], 1)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in PLANTED.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("client", ["litellm", "async"])
def test_user_simulator_failures_record_no_key(planted: None, tiny_engine: Any, caplog: pytest.LogCaptureFixture,
                                               capfd: pytest.CaptureFixture, client: str) -> None:
    """tau2's user simulator (litellm, or the async client; both read OPENAI_API_KEY) against a server that fails
    half its requests."""
    from tau2_rl_pipeline.eval.runner import episode_record

    caplog.set_level("DEBUG")
    with LoopbackServer(tiny_engine) as policy, LoopbackServer(tiny_engine, hang_s=5.0) as user_server, \
            faults.FaultProxy(user_server, rate=0.5, seed=5) as proxy:
        trajectories = asyncio.run(faults.user_fault_episodes(
            # no user-simulator retries: the failures end episodes, so their error messages are recorded
            policy, user_server, proxy.base_url, load_tasks("mock", "base"), 12,
            Tau2Config.from_env({"TAU2_USER_MAX_RETRIES": "0"}),
            engine_kwargs={"timeout_s": 3.0, "backoff_base_s": 0.02}, client=client))
    assert proxy.authorizations == {"Bearer " + PLANTED["OPENAI_API_KEY"]}  # the key was sent on every call
    assert any(t.error for t in trajectories)  # failures were recorded, error messages included
    records = [episode_record(t, sample=i, seed=0, started_at="", ended_at="", cfg=Tau2Config())
               for i, t in enumerate(trajectories)]
    out, err = capfd.readouterr()
    found = leaks(json.dumps(records).encode(), "episode records") + leaks(caplog.text.encode(), "logs")
    found += leaks(out.encode(), "stdout") + leaks(err.encode(), "stderr")
    assert found == []


def test_the_evaluator_writes_no_key_in_any_output(tiny_small_dir: Path, tiny_engine: Any, tmp_path: Path) -> None:
    """The Pass@K CLI with an LLM user whose server fails (errors recorded in the episodes): summary, episodes,
    tau2 results, chart, stdout and stderr all scanned."""
    out = tmp_path / "eval"
    # no user-simulator retries, so the user server's failures end episodes and their messages are recorded
    env = {**os.environ, **PLANTED, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TAU2_USER_MAX_RETRIES": "0"}
    with LoopbackServer(tiny_engine) as policy, LoopbackServer(tiny_engine, default_max_tokens=8) as user_server, \
            faults.FaultProxy(user_server, rate=0.3, seed=6, kinds=[k for k in faults.FAULT_KINDS if k != "slow"]) \
            as proxy:
        proc = subprocess.run(
            [sys.executable, "-m", "tau2_rl_pipeline.eval.eval_passk", "--backend", "sglang", "--sglang-url", policy.base_url,
             "--hf-checkpoint", str(tiny_small_dir), "--user", "llm", "--user-model", "openai/tiny",
             "--user-api-base", proxy.base_url + "/v1", "--domains", "mock", "--task-split", "base",
             "--task-ids", "create_task_1,update_task_1,create_task_1_nl_eval,impossible_task_1",
             "--num-samples", "1", "--max-new-tokens", "8", "--output", str(out / "run.json")],
            env=env, capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "Bearer " + PLANTED["OPENAI_API_KEY"] in proxy.authorizations and proxy.injected
    records = [json.loads(line) for line in (out / "run.json.episodes.jsonl").read_text().splitlines()[1:]]
    assert any(r["error"] for r in records)  # the user server's failures are in the episodes, messages and all
    found, files = scan_tree(out)
    assert files >= 4 and any(p.suffix == ".png" for p in out.iterdir())
    assert found + leaks(proc.stdout.encode(), "stdout") + leaks(proc.stderr.encode(), "stderr") == []
