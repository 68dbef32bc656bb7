"""The local pipeline's policy stage: --algorithm grpo|awsft, the difficulty filter, and the report showing both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.config import config_from_args
from tau2_rl_pipeline.local import pipeline as local_pipeline
from tau2_rl_pipeline.local.demo_report import grpo_summary
from tau2_rl_pipeline.local.grpo import difficulty_task_ids
from tau2_rl_pipeline.local.stage_book import StageBook

SMALL = ["--domain", "mock", "--grpo-steps", "1", "--grpo-tasks-per-step", "2", "--grpo-n", "2",
         "--max-new-tokens", "12", "--max-turns", "2", "--micro-batch-size", "4", "--eval-samples", "1"]


def test_algorithm_takes_one_or_both():
    parse = local_pipeline.build_parser().parse_args
    assert parse([]).algorithm == ("grpo",)
    assert parse(["--algorithm", "awsft"]).algorithm == ("awsft",)
    assert parse(["--algorithm", "grpo,awsft"]).algorithm == ("grpo", "awsft")
    with pytest.raises(SystemExit):
        parse(["--algorithm", "ppo"])


def _episodes(out: Path, outcomes: dict[str, str]) -> Path:
    (out / "eval").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"header": {"format": 1, "settings": {}}})]
    lines += [json.dumps({"domain": "mock", "task_id": tid, "sample": i, "status": "completed",
                          "reward": 1.0 if c == "s" else 0.0})
              for tid, results in outcomes.items() for i, c in enumerate(results)]
    path = out / "eval" / "rft_samples.json.episodes.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_grpo_tasks_come_from_the_rft_pass_rates(tmp_path, monkeypatch):
    monkeypatch.setenv("TAU2_GRPO_MAX_PASS_RATE", "0.9")
    args = local_pipeline.build_parser().parse_args(SMALL)
    cfg = config_from_args(args)
    episodes = tmp_path / "eval" / "rft_samples.json.episodes.jsonl"
    assert difficulty_task_ids("mock", "base", episodes, cfg)[1].kept == 9  # no RFT episodes: all kept
    _episodes(tmp_path, {"create_task_1": "ssss", "update_task_1": "sf"})
    ids, stats, baselines = difficulty_task_ids("mock", "base", episodes, cfg)
    assert "create_task_1" not in ids and "update_task_1" in ids and len(ids) == 8
    assert stats.dropped_above_max == 1 and stats.unsampled == 7
    assert baselines == {"update_task_1": 0.5}  # AWSFT's V* of each kept task the RFT stage sampled
    _episodes(tmp_path, {tid: "ff" for tid in [*ids, "create_task_1"]})  # every task sampled, never solved
    monkeypatch.setenv("TAU2_GRPO_MIN_PASS_RATE", "0.5")
    with pytest.raises(SystemExit, match="no task left"):
        difficulty_task_ids("mock", "base", episodes, config_from_args(args))


def test_the_band_and_the_algorithm_redo_only_the_policy_stages(monkeypatch):
    def settings(*argv: str) -> dict[str, dict]:
        args = local_pipeline.build_parser().parse_args([*SMALL, *argv])
        return local_pipeline.stage_settings(args, config_from_args(args), "base", "base")

    default = settings()
    assert "awsft" not in default and set(settings("--algorithm", "grpo,awsft")) - set(default) == {
        "awsft", "eval awsft"}
    monkeypatch.setenv("TAU2_GRPO_MAX_PASS_RATE", "0.9")
    banded = settings()
    assert {s for s in default if default[s] != banded[s]} == {"grpo", "eval grpo"}


def _recorded_demo(out: Path, tiny_small_dir: Path, argv: list[str]) -> None:
    """A demo whose stages up to GRPO are done and recorded in its stage book, as a finished run leaves them."""
    args = local_pipeline.build_parser().parse_args(argv)
    args.task_sampler = local_pipeline.DEMO_TASK_SAMPLER  # as main sets it when neither flag nor variable does
    cfg = config_from_args(args)
    args.max_turns = cfg.max_turns
    settings = local_pipeline.stage_settings(args, cfg, "base", "base")
    for name in ("sft", "rft", "grpo/model"):
        shutil.copytree(tiny_small_dir, out / name)
    metric = {"value": 0.5, "ci": [0.2, 0.8], "n_tasks": 9, "n_episodes": 9}
    numbers = {"k": 1, "pass@1": metric, "pass^1": metric, "mean_partial": metric}
    history = [{"step": 1, "tasks": [], "episodes": 4, "raw_reward_mean": 0.5, "shaped_reward_mean": 0.6,
                "success_rate": 0.5, "groups": 2, "groups_without_signal": 0, "trained_sequences": 4}]
    book = StageBook(out, local_pipeline.run_benchmark("mock", "base", "base", cfg.retrieval_variant))
    for name in ("base", "sft", "rft", "grpo"):
        local_pipeline.eval_output(out, name).write_text("{}")
        results = {"sft": {"demonstrations": 9}, "rft": {"kept": 2},
                   "grpo": grpo_summary(history)}
        if name in results:
            book.plan(name, settings[name], [])
            book.finish(name, results[name])
        book.plan(f"eval {name}", settings[f"eval {name}"], [])
        book.finish(f"eval {name}", numbers)


def test_demo_runs_awsft_and_reports_it_beside_grpo(tiny_small_dir, tmp_path, capsys):
    """Resume a demo whose earlier stages (and GRPO) are done: only the AWSFT stage trains and is evaluated, and
    the report, the table and the charts show it beside GRPO."""
    out = tmp_path / "demo"
    argv = [*SMALL, "--model", str(tiny_small_dir), "--out", str(out), "--algorithm", "grpo,awsft"]
    _episodes(out, {t.id: "sf" for t in load_tasks("mock", "base")})  # the RFT stage sampled every task
    _recorded_demo(out, tiny_small_dir, argv)
    code = local_pipeline.main(argv)
    assert code == 0
    captured = capsys.readouterr()
    err = captured.err
    assert "grpo: done with these settings, skipped" in err and "awsft: running" in err
    assert "kept 9/9 tasks" in err  # the difficulty filter's line: [0, 1] keeps every task
    report = json.loads((out / "report.json").read_text())
    assert list(report["stages"]) == ["base", "sft", "rft", "grpo", "awsft"]
    assert report["stages"]["awsft"]["pass@1"]["n_tasks"] == 9  # evaluated on the mock tasks like the others
    (step,) = report["awsft"]["history"]
    assert step["trained_sequences"] == 4 and step["train_awsft_weight"] > 0  # every sample, none skipped
    assert step["episodes_with_baseline"] == 4  # each episode carries its task's RFT pass rate: AWSFT's V*
    assert report["awsft"]["grpo_tasks"]["tasks"] == 9
    assert report["wall_s"] >= report["awsft"]["wall_s"] > 0  # the stages' times, this run's AWSFT among them
    assert (out / "awsft" / "model" / "config.json").is_file()
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in logged] == ["awsft"] and logged[0]["awsft_weight"] > 0
    assert {Path(p).name for p in report["charts"]} == {"grpo_reward.png", "awsft_reward.png", "stages_passk.png"}
    out_text = captured.out
    assert "grpo" in out_text and "awsft" in out_text and "AWSFT: 1/1 steps with signal" in out_text
    # the recorded stages' evaluations are placeholders here, not evaluator runs: no paired test, said in one line
    assert "AWSFT vs RFT: no paired comparison (" in out_text and "not an evaluator summary" in out_text
