"""bench/long_tail.py runs end to end at tiny sizes (nothing timed) and its books add up: every policy call the
model server answered is an episode's turn, every episode run is trained, cut by slime's abort or finished outside
the batch, and each trained episode lasted its prompt row's drawn turns (or ran to the cap on a tail toss)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "contract"))

from contract_tier import MISSING  # noqa: E402

if MISSING is not None:
    pytest.skip(MISSING.replace("contract tier skipped", "bench/long_tail.py needs slime"), allow_module_level=True)

GROUPS, SAMPLES, STEPS, MAX_TURNS = 2, 2, 2, 12


def test_long_tail_bench_runs_and_its_books_add_up(tmp_path):
    out = tmp_path / "long_tail.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "long_tail.py"), "--groups", str(GROUPS), "--samples", str(SAMPLES),
         "--steps", str(STEPS), "--latency", "0.02", "--tail-rate", "0.3", "--max-turns", str(MAX_TURNS),
         "--json", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {r["mode"]: r for r in report["results"]}
    assert list(rows) == ["sync", "over-sampling", "partial-restart", "partial"]
    assert [line.split(" | ")[0] for line in proc.stdout.splitlines()[2:6]] == [
        "| sync", "| over-sampling", "| partial-restart", "| partial"]
    drawn = report["row_turns"]
    batch = GROUPS * SAMPLES
    for mode, r in rows.items():
        assert r["turns_run"] == r["generate_calls_served"] > 0, mode  # the server saw exactly these turns
        # every turn run is trained, thrown away, or still in slime's buffer at the end
        assert r["turns_run"] == r["turns_trained"] + r["turns_thrown_away"] + r["turns_in_buffer_at_end"], mode
        assert r["episodes_run"] == (r["episodes_trained"] - r["episodes_trained_from_earlier_steps"]
                                     + r["episodes_cut"] + r["episodes_finished_not_trained"]), mode
        assert [len(s["trained"]) for s in r["steps"]] == [batch] * STEPS, mode
        for task_id, turns, status in (t for s in r["steps"] for t in s["trained"]):
            row = int(task_id.removeprefix("long_tail_"))
            assert (turns, status) in ((drawn[row], "COMPLETED"), (MAX_TURNS, "TRUNCATED")), (mode, task_id)
        assert r["prompts_trained"] == GROUPS * STEPS
        for s in r["steps"]:  # what is not trained is dropped, or with --partial-rollout back in slime's buffer
            assert s["prompt_hand_outs"] == s["prompts_trained"] + s["prompts_dropped"] + s["prompts_in_buffer"]
            assert s["prompts_in_buffer"] == 0 or mode.startswith("partial")
    sync, over, restart, partial = rows["sync"], rows["over-sampling"], rows["partial-restart"], rows["partial"]
    assert sync["episodes_run"] == batch * STEPS and sync["turns_thrown_away"] == sync["episodes_cut"] == 0
    assert sync["turns_trained"] == sync["turns_run"] and sync["prompt_hand_outs"] == GROUPS * STEPS
    assert over["episodes_run"] == 2 * batch * STEPS  # twice the prompts handed out, all of them started
    assert over["prompts_dropped"] == over["prompt_hand_outs"] - over["prompts_trained"] == GROUPS * STEPS
    assert over["turns_thrown_away"] == over["turns_run"] - over["turns_trained"]
    assert over["episodes_finished_thrown_away"] == over["episodes_finished_not_trained"]
    assert sync["episodes_trained_from_earlier_steps"] == over["episodes_trained_from_earlier_steps"] == 0
    assert sync["turns_trained_from_earlier_steps"] == over["turns_trained_from_earlier_steps"] == 0
    assert 0 <= partial["turns_trained_from_earlier_steps"] <= partial["turns_trained"]
    # with --partial-rollout a sample trained in a later step finished earlier in a group sent back to the buffer
    kept = restart["episodes_finished_not_trained"] - restart["episodes_finished_thrown_away"]
    assert restart["episodes_trained_from_earlier_steps"] <= kept
    # resumed: a cut episode handed back is continued, never started again: only a group slime drops is lost
    assert restart["episodes_continued"] == 0
    assert partial["episodes_continued"] == partial["episodes_run_after_a_cut"]
    assert partial["turns_thrown_away"] == 0 or partial["prompts_dropped"] > 0


def test_long_tail_async_bench_runs_and_resumes_what_the_weight_update_cuts(tmp_path):
    """bench/long_tail_async.py at tiny sizes: slime's fully async worker, slime's weight update after each step.
    Resumed, no cut episode is started again; restarted, none goes on (nothing timed).

    slime's worker takes groups from the buffer once a second (AsyncRolloutWorker.poll_interval): each training
    window (--train-s 1.2) holds one of its wake-ups, so a group the update cut is taken again before the next
    update even when a loaded machine stretches every step; with a 0.3 s call and a 30 % tail, episodes are still in
    flight when the update comes (with 0.3 s windows, a busy CI machine once stopped the worker before it woke)."""
    out = tmp_path / "long_tail_async.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "long_tail_async.py"), "--groups", "2", "--samples", "2",
         "--over-sampling", "4", "--steps", "3", "--latency", "0.3", "--tail-rate", "0.3", "--train-s", "1.2",
         "--max-turns", "12", "--json", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["mode"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == ["async-restart", "async"]
    for r in rows.values():
        assert r["episodes_trained"] == 2 * 2 * 3 and 0 < r["turns_trained"] <= r["requests_served"]
        assert r["cut_resumed"] + r["cut_restarted"] <= r["cut_handed_back"]
    assert rows["async"]["cut_resumed"] > 0  # the update cut episodes in flight, and they went on
    assert rows["async"]["cut_restarted"] == rows["async"]["turns_thrown_away_by_restarts"] == 0
    assert rows["async-restart"]["cut_resumed"] == 0


def test_staleness_bench_runs_and_keeps_each_bound(tmp_path):
    """bench/staleness.py (P12) at tiny sizes, nothing timed: eta = 0 (the synchronous path) trains only tokens of
    the weights training them and leaves no finished sample behind, eta = 1 trains none more than one version
    behind, every row's books add up, and the summary over the runs follows."""
    out = tmp_path / "staleness.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "staleness.py"), "--groups", "2", "--samples", "2", "--steps", "3",
         "--latency", "0.05", "--tail-rate", "0.3", "--train-s", "0.5", "--max-turns", "8", "--etas", "0,1,-1",
         "--repeats", "1", "--json", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = json.loads(out.read_text())["runs"]
    rows = {r["eta"]: r for r in results}
    assert list(rows) == [0, 1, -1]
    assert rows[0]["max_lag_trained"] == 0 and rows[1]["max_lag_trained"] <= 1
    assert rows[0]["finished_never_trained"] == 0
    for r in rows.values():
        assert 0 < r["trained"] <= r["sampled"] and len(r["steps"]) == 3
        assert r["not_trained_share"] == pytest.approx(1 - r["trained"] / r["sampled"])
        assert r["max_lag_trained"] <= r["max_lag_sampled"]
        assert r["finished_never_trained"] >= 0 and len(r["load"]) == 2
    assert "over the 1 runs" in proc.stdout and "| unbounded | 1 |" in proc.stdout, proc.stdout


def test_the_staleness_summary_takes_each_ratio_within_its_own_run():
    """Median and range over runs of each eta's trained tokens/s over eta 0's of the same run (pure)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from staleness import summary

    def run(sync: float, eta2: float, left: int, load: float) -> list[dict]:
        books = {"not_trained_share": 0.0, "max_lag_trained": 0, "max_lag_sampled": 0, "load": [load, load]}
        return [{**books, "eta": 0, "trained_tokens_per_s": sync, "finished_never_trained": 0},
                {**books, "eta": 2, "trained_tokens_per_s": eta2, "finished_never_trained": left}]

    text = summary([run(100, 150, 3, 4.0), run(200, 200, 5, 9.5), run(50, 100, 4, 6.0)])
    assert "| 0 | 3 | 1.00x (1.00x-1.00x) | 100 (50-200) |" in text
    assert "| 2 | 3 | 1.50x (1.00x-2.00x) | 150 (100-200) | 0% (0%-0%) | 3 5 4 | 0 (0) | 4.0-9.5 |" in text
