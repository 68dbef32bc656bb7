"""The local pipeline's policy stage: --algorithm grpo|awsft, the difficulty filter, and the report showing both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tau2_rl_pipeline import local_pipeline
from tau2_rl_pipeline.config import config_from_args

SMALL = ["--domain", "mock", "--grpo-steps", "1", "--grpo-tasks-per-step", "2", "--grpo-n", "2",
         "--max-new-tokens", "12", "--max-turns", "2", "--micro-batch-size", "4", "--eval-samples", "1"]


def test_algorithm_takes_one_or_both():
    parse = local_pipeline.build_parser().parse_args
    assert parse([]).algorithm == ("grpo",)
    assert parse(["--algorithm", "awsft"]).algorithm == ("awsft",)
    assert parse(["--algorithm", "grpo,awsft"]).algorithm == ("grpo", "awsft")
    with pytest.raises(SystemExit):
        parse(["--algorithm", "ppo"])


def _episodes(out: Path, outcomes: dict[str, str]) -> None:
    (out / "eval").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"header": {"format": 1, "settings": {}}})]
    lines += [json.dumps({"domain": "mock", "task_id": tid, "sample": i, "status": "completed",
                          "reward": 1.0 if c == "s" else 0.0})
              for tid, results in outcomes.items() for i, c in enumerate(results)]
    (out / "eval" / "rft_samples.json.episodes.jsonl").write_text("\n".join(lines) + "\n")


def test_grpo_tasks_come_from_the_rft_pass_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("TAU2_GRPO_MAX_PASS_RATE", "0.9")
    args = local_pipeline.build_parser().parse_args(SMALL)
    cfg = config_from_args(args)
    assert local_pipeline.grpo_task_ids(args, tmp_path, cfg, "base")[1]["kept"] == 9  # no RFT episodes: all kept
    _episodes(tmp_path, {"create_task_1": "ssss", "update_task_1": "sf"})
    ids, stats = local_pipeline.grpo_task_ids(args, tmp_path, cfg, "base")
    assert "create_task_1" not in ids and "update_task_1" in ids and len(ids) == 8
    assert stats["dropped_above_max"] == 1 and stats["unsampled"] == 7
    _episodes(tmp_path, {tid: "ff" for tid in [*ids, "create_task_1"]})  # every task sampled, never solved
    monkeypatch.setenv("TAU2_GRPO_MIN_PASS_RATE", "0.5")
    with pytest.raises(SystemExit, match="no task left"):
        local_pipeline.grpo_task_ids(args, tmp_path, config_from_args(args), "base")


def test_demo_runs_awsft_and_reports_it_beside_grpo(tiny_small_dir, tmp_path, capsys):
    """Resume a demo whose earlier stages (and GRPO) are done: only the AWSFT stage trains and is evaluated, and
    the report, the table and the charts show it beside GRPO."""
    out = tmp_path / "demo"
    out.mkdir()
    shutil.copytree(tiny_small_dir, out / "sft")
    shutil.copytree(tiny_small_dir, out / "rft")
    shutil.copytree(tiny_small_dir, out / "grpo" / "model")
    metric = {"value": 0.5, "ci": [0.2, 0.8], "n_tasks": 9, "n_episodes": 9}
    numbers = {"k": 1, "pass@1": metric, "pass^1": metric, "mean_partial": metric}
    report = {"stages": {s: numbers for s in ("base", "sft", "rft", "grpo")},
              "grpo": {"history": [{"step": 1, "raw_reward_mean": 0.5, "shaped_reward_mean": 0.6}]}}
    (out / "report.json").write_text(json.dumps(report))
    _episodes(out, {"create_task_1": "ss"})
    code = local_pipeline.main([*SMALL, "--model", str(tiny_small_dir), "--out", str(out),
                                "--algorithm", "grpo,awsft"])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == ["base", "sft", "rft", "grpo", "awsft"]
    assert report["stages"]["awsft"]["pass@1"]["n_tasks"] == 9  # evaluated on the mock tasks like the others
    (step,) = report["awsft"]["history"]
    assert step["trained_sequences"] == 4 and step["train_awsft_weight"] > 0  # every sample, none skipped
    assert report["grpo_tasks"]["tasks"] == 9
    assert (out / "awsft" / "model" / "config.json").is_file()
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["awsft"] and logged[0]["awsft_weight"] > 0
    assert {Path(p).name for p in report["charts"]} == {"grpo_reward.png", "awsft_reward.png", "stages_passk.png"}
    table = capsys.readouterr().out
    assert "grpo" in table and "awsft" in table
