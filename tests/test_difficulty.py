"""Difficulty-filtered GRPO tasks: pass rates from the RFT stage's episode records, the band, the counts of each
bound's drops, and the CLI that scripts/pipeline.sh runs (its stage is run for real in test_scripts.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.selection.difficulty import filter_task_rows, filter_tasks, main, pass_rates

ROOT = Path(__file__).resolve().parents[1]
CFG = Tau2Config()


def _records(domain: str, task_id: str, outcomes: str) -> list[dict]:
    """One record per character: s = success, f = failure (scored), a = aborted."""
    status = {"s": "completed", "f": "completed", "a": "aborted"}
    return [{"domain": domain, "task_id": task_id, "sample": i, "status": status[c],
             "reward": 1.0 if c == "s" else 0.0} for i, c in enumerate(outcomes)]


RECORDS = (_records("airline", "0", "ssss") + _records("airline", "1", "ssfa") + _records("retail", "0", "ffff")
           + _records("retail", "1", "sfff") + _records("retail", "2", "aa"))
KEYS = [("airline", "0"), ("airline", "1"), ("retail", "0"), ("retail", "1"), ("retail", "2"), ("retail", "9")]


def test_pass_rates_count_scored_episodes_and_leave_aborted_ones_out():
    rates = pass_rates(RECORDS)
    assert rates[("airline", "0")] == (4, 4) and rates[("airline", "1")] == (2, 3)
    assert rates[("retail", "0")] == (0, 4) and rates[("retail", "1")] == (1, 4)
    assert ("retail", "2") not in rates  # only aborted: nothing is known


def test_the_default_band_keeps_every_task():
    kept, stats = filter_tasks(KEYS, pass_rates(RECORDS), CFG)
    assert kept == KEYS and stats.dropped_below_min == stats.dropped_above_max == 0 and stats.unsampled == 2


def test_each_bound_drops_its_side_and_says_how_many():
    rates = pass_rates(RECORDS)
    kept, stats = filter_tasks(KEYS, rates, replace(CFG, grpo_max_pass_rate=0.9))
    assert ("airline", "0") not in kept and stats.dropped_above_max == 1 and stats.dropped_below_min == 0
    kept, stats = filter_tasks(KEYS, rates, replace(CFG, grpo_min_pass_rate=0.25, grpo_max_pass_rate=0.9))
    assert kept == [("airline", "1"), ("retail", "1"), ("retail", "2"), ("retail", "9")]  # 0.25 is inside: inclusive
    assert (stats.dropped_below_min, stats.dropped_above_max, stats.unsampled, stats.kept) == (1, 1, 2, 4)
    assert "dropped 1 below the minimum pass rate and 1 above the maximum" in stats.line()


def test_rows_of_the_task_index_are_filtered_in_order():
    rows = [{"input": f"tau2 {d} task {t}", "metadata": {"domain": d, "split": "train", "task_id": t, "task_index": i}}
            for i, (d, t) in enumerate(KEYS)]
    kept, stats = filter_task_rows(rows, RECORDS, replace(CFG, grpo_max_pass_rate=0.5))
    assert [r["metadata"]["task_id"] for r in kept] == ["0", "1", "2", "9"]
    assert [r["metadata"]["domain"] for r in kept] == ["retail"] * 4 and stats.dropped_above_max == 2


def write_inputs(tmp_path: Path, keys: list[tuple[str, str]] = KEYS) -> tuple[Path, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    episodes = tmp_path / "rft.jsonl.eval.json.episodes.jsonl"
    lines = [json.dumps({"header": {"format": 1, "settings": {}}})] + [json.dumps(r) for r in RECORDS]
    episodes.write_text("\n".join(lines) + "\n")
    tasks = tmp_path / "tasks" / "tau2_train_all_tasks.jsonl"
    tasks.parent.mkdir(parents=True, exist_ok=True)
    tasks.write_text("".join(json.dumps({"input": "x", "metadata": {"domain": d, "split": "train", "task_id": t,
                                                                     "task_index": i}}) + "\n"
                             for i, (d, t) in enumerate(keys)))
    return episodes, tasks


def test_cli_writes_the_filtered_index_and_its_counts(tmp_path, capsys, monkeypatch):
    episodes, tasks = write_inputs(tmp_path)
    out = tmp_path / "grpo.jsonl"
    monkeypatch.setenv("TAU2_GRPO_MAX_PASS_RATE", "0.9")
    assert main(["--episodes", str(episodes), "--tasks", str(tasks), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    # each kept sampled task carries its pass rate, AWSFT's V* (slime copies row metadata onto its samples)
    assert {(r["metadata"]["domain"], r["metadata"]["task_id"]): r["metadata"].get("reference_pass_rate")
            for r in rows} == {("airline", "1"): 2 / 3, ("retail", "0"): 0.0, ("retail", "1"): 0.25,
                               ("retail", "2"): None, ("retail", "9"): None}  # 2 and 9: no scored episode
    stats = json.loads((tmp_path / "grpo.jsonl.stats.json").read_text())
    assert stats["dropped_above_max"] == 1 and stats["kept"] == 5
    assert "kept 5/6 tasks" in capsys.readouterr().out
    # a band that leaves nothing is an error that says why, and writes nothing
    episodes, tasks = write_inputs(tmp_path / "sampled", KEYS[:4])
    out2 = tmp_path / "none.jsonl"
    assert main(["--episodes", str(episodes), "--tasks", str(tasks), "--out", str(out2), "--grpo-min-pass-rate",
                 "0.95", "--grpo-max-pass-rate", "0.99"]) == 2
    err = capsys.readouterr().err
    assert "no task left for GRPO" in err and len(err.strip().splitlines()) == 1 and not out2.exists()


def test_a_bad_band_is_a_one_line_error(tmp_path, capsys):
    episodes, tasks = write_inputs(tmp_path)
    common = ["--episodes", str(episodes), "--tasks", str(tasks), "--out", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit) as exited:  # a rate out of [0, 1]: the flag's own check, before anything runs
        main([*common, "--grpo-max-pass-rate", "1.5"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "--grpo-max-pass-rate" in err and "\n" not in err, err
    assert main([*common, "--grpo-min-pass-rate", "0.8", "--grpo-max-pass-rate", "0.2"]) == 2  # a band upside down
    assert "TAU2_GRPO_" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
