"""Clear errors: a missing model path, an unreachable server, an unknown domain / split / task id, a missing API key
for a remote user model each end in one line that says what to do, and a non-zero exit; never a traceback.

The evaluator's own checks (tau2_rl_pipeline/eval/eval_passk.py: --model, --sglang-url, --user llm) are tested in
tests/test_eval_passk.py; these cover the other entry points and the library errors they rest on.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, get_task
from tau2_rl_pipeline.benchmark.users import UserConfigError, make_user_factory
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.engines import EngineError, SamplingParams, SGLangEngine

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("OPENAI_API_KEY", "HF_TOKEN", "WANDB_API_KEY", "ANTHROPIC_API_KEY")


def run_cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in KEYS and not k.startswith("TAU2_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300, check=False)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a failed command."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0, proc.stdout[-500:]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    return lines[0]




@pytest.mark.parametrize("args,expected", [
    (["-m", "tau2_rl_pipeline.benchmark.tasks", "--local-dir", "out", "--splits", "nope"],
     ["unknown split 'nope'", "valid splits:"]),
    (["-m", "tau2_rl_pipeline.benchmark.oracle", "--domain", "nope"], ["unknown domain 'nope'", "valid domains:"]),
    (["-m", "tau2_rl_pipeline.selection.rft", "--episodes", "missing.jsonl", "--out", "rows.jsonl"],
     ["missing.jsonl", "No such file"]),
    (["-m", "tau2_rl_pipeline.local.pipeline", "--split", "nope", "--out", "demo"],
     ["unknown split 'nope'", "valid splits: base"]),
    (["-m", "tau2_rl_pipeline.local.pipeline", "--model", "no/such/model", "--out", "demo"], ["no/such/model"]),
    (["-m", "support.loopback_server", "--model", "no/such/model", "--port", "0"],
     ["no/such/model", "config.json"]),
    (["-m", "tau2_rl_pipeline.selection.rft", "--sglang-url", "http://127.0.0.1:9", "--domains", "mock", "--task-split", "base",
      "--num-samples", "1", "--out", "rows.jsonl", "--hf-checkpoint", "."],
     ["OPENAI_API_KEY", "TAU2_USER_API_BASE", "--user scripted"]),
])
def test_bad_input_to_an_entry_point_is_one_line_and_a_non_zero_exit(args: list[str], expected: list[str],
                                                                    tmp_path: Path) -> None:
    line = one_line(run_cli(*args, tmp_path=tmp_path))
    for text in expected:
        assert text in line, line


def test_an_unknown_task_id_names_the_valid_ones() -> None:
    with pytest.raises(TaskLookupError) as info:
        get_task("mock", "no_such_task")
    message = str(info.value)
    assert "\n" not in message and "unknown task id 'no_such_task'" in message and "create_task_1" in message


def test_a_remote_user_model_without_its_key_says_which_key_and_the_alternatives(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserConfigError) as info:
        make_user_factory("llm", Tau2Config.from_env({}, user_model="gpt-4.1"))
    message = str(info.value)
    assert "\n" not in message and "OPENAI_API_KEY" in message
    assert "TAU2_USER_API_BASE" in message and "scripted" in message


def _unreachable_error() -> str:
    async def go() -> None:
        engine = SGLangEngine("http://127.0.0.1:9", max_retries=1, backoff_base_s=0.01, timeout_s=1.0)
        try:
            await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=1))
        finally:
            await engine.aclose()

    with pytest.raises(EngineError) as info:
        asyncio.run(go())
    return str(info.value)


def test_an_unreachable_policy_server_is_named_in_one_line() -> None:
    message = _unreachable_error()
    assert "\n" not in message and "http://127.0.0.1:9/generate" in message and "2 attempts" in message


def test_an_unreachable_policy_server_error_says_what_to_do() -> None:
    message = _unreachable_error()
    assert "scripts/start_policy_server.sh" in message or "--sglang-url" in message


def test_a_demo_report_of_another_tau2_is_not_resumed(tmp_path, capsys):
    from tau2_rl_pipeline.local.pipeline import main

    other = {"tau2_version": "0.9", "task_set_hash": "x"}
    (tmp_path / "report.json").write_text(json.dumps({"benchmark": other, "stages": {"base": {}}}))
    (tmp_path / "stages.json").write_text(json.dumps({"base": {"settings": {}, "result": {}, "benchmark": other}}))
    assert main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "was produced with tau2 0.9, this run uses tau2" in err and "\n" not in err
    assert json.loads((tmp_path / "report.json").read_text())["benchmark"]["tau2_version"] == "0.9"  # untouched
    assert json.loads((tmp_path / "stages.json").read_text())["base"]["benchmark"] == other
