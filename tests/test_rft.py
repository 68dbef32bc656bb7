"""RFT selection and merge on recorded episodes: real tau2 episodes (scripted agent turns against the scripted user,
scored by tau2's evaluator), recorded as the Pass@K evaluator records them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.tasks import get_task, write_jsonl
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.oracle_demos import demo_turns, oracle_demonstrations, play_turns
from tau2_rl_pipeline.learning.reward import partial_score
from tau2_rl_pipeline.selection.rft import dedupe, domain_stats, main, merge_rows, select_rft

TELECOM_ID = "[mobile_data_issue]bad_vpn|data_saver_mode_on|user_abroad_roaming_disabled_on[PERSONA:None]"


def record(domain: str, task, turns: list[str], sample: int, status: str = "completed") -> dict:
    """An episode record with the fields the evaluator writes (tau2_rl_pipeline/eval/eval_passk.py episode_record)."""
    episode: Episode = play_turns(domain, task, turns)
    info = episode.evaluate()
    return {"domain": domain, "task_id": task.id, "sample": sample, "seed": sample, "status": status,
            "reward": float(info.reward), "partial": partial_score(info, domain, Tau2Config())[0],
            "termination_reason": episode.termination_reason.value, "turns": len(turns), "parse_errors": 0,
            "refused_calls": 0, "unknown_tool_calls": 0, "user_tool_calls_by_agent": 0, "refused_call_ids": [],
            "error": None, "reward_info": info.model_dump(mode="json"),
            "messages": [m.model_dump(mode="json") for m in episode.messages]}


@pytest.fixture(scope="module")
def telecom():
    """One telecom task (a device step and two agent calls): two successes, and failures with partial 0.36 and 0."""
    task = get_task("telecom", TELECOM_ID, "train")
    turns = demo_turns(task)  # ask the user, refuel, enable roaming, final message
    recs = {
        "win": record("telecom", task, turns, 0),
        "win_again": record("telecom", task, turns, 1),
        "partial": record("telecom", task, turns[:1] + turns[-1:], 2),
        "zero": record("telecom", task, turns[-1:] * 4, 3),  # the user runs out of patience and stops
    }
    assert [recs[k]["reward"] for k in recs] == [1.0, 1.0, 0.0, 0.0]
    assert 0.3 < recs["partial"]["partial"] < 0.6 and recs["zero"]["partial"] == 0.0
    return task, turns, recs


def test_successes_are_kept_once_and_failures_of_that_task_dropped(telecom):
    task, _, recs = telecom
    rows = select_rft([recs["zero"], recs["win"], recs["partial"], recs["win_again"]])
    assert len(rows) == 1  # the two successes are the same conversation
    assert rows[0]["metadata"] == {"domain": "telecom", "task_id": task.id, "source": "rft", "selected": "success",
                                   "sample": 0, "reward": 1.0, "partial": 1.0}


def test_row_is_the_episodes_exact_conversation(telecom):
    task, turns, recs = telecom
    row = select_rft([recs["win"]])[0]
    episode = play_turns("telecom", task, turns)
    view = episode.agent_view()
    assert view[-1] == {"role": "user", "content": "###STOP###"}
    assert row["messages"][0] == {"role": "system", "content": episode.system_prompt}
    assert row["messages"][1] == {**view[0], "step_loss_mask": 0}  # the greeting: prompt, not policy output
    assert row["messages"][2:] == view[1:-1]  # without the user's closing stop
    assert row["tools"] == episode.tools


def test_best_partial_episode_only_when_allowed_and_above_the_threshold(telecom):
    _, _, recs = telecom
    failures = [recs["zero"], recs["partial"]]
    assert select_rft(failures) == []  # default threshold 0.6
    rows = select_rft(failures, min_partial=0.3)
    assert [(r["metadata"]["selected"], r["metadata"]["sample"]) for r in rows] == [("partial", 2)]
    assert select_rft(failures, min_partial=0.3, allow_partial=False) == []


def test_aborted_and_truncated_episodes_are_never_selected(telecom):
    _, _, recs = telecom
    assert select_rft([{**recs["win"], "status": "aborted"}, {**recs["partial"], "status": "truncated"}],
                      min_partial=0.0) == []


def test_a_rejected_completion_stays_as_context_but_is_not_trained_on():
    task = get_task("mock", "create_task_1")
    bad = "<tool_call>\n{\"name\": \"create_task\", \"arguments\": {\"user_id\": \"user_1\"\n</tool_call>"
    rec = record("mock", task, [bad, *demo_turns(task)], 0)
    assert rec["reward"] == 1.0
    row = select_rft([rec])[0]
    assert {"role": "assistant", "content": bad, "step_loss_mask": 0} in row["messages"]
    trained = [m for m in row["messages"] if m["role"] == "assistant" and m.get("step_loss_mask", 1)]
    assert [m["tool_calls"][0]["function"]["name"] for m in trained if "tool_calls" in m] == ["create_task"]


def test_merge_keeps_seed_rows_first_and_drops_repeated_conversations():
    seed = oracle_demonstrations("mock", "base")
    by_task = {r["metadata"]["task_id"]: r for r in seed}
    # Two mock tasks share their scenario and gold action, so their demonstrations are one conversation.
    assert by_task["create_task_1"]["messages"] == by_task["create_task_1_with_env_assertions"]["messages"]
    unique = [r for r in seed if r["metadata"]["task_id"] != "create_task_1_with_env_assertions"]
    assert dedupe(seed) == (unique, 1)
    task = get_task("mock", "create_task_1")
    rows = select_rft([record("mock", task, demo_turns(task), 0)])
    merged, dropped = merge_rows(seed, rows)
    assert merged == unique and dropped == 2  # the RFT success repeats the oracle demonstration too


def test_rows_are_ordered_by_task_and_sample_whatever_order_episodes_finished_in():
    """The evaluator records episodes as they finish; selection must not depend on that order (bit-reproducible
    reruns): the same rows, the same sample kept among identical conversations, tasks in id order."""
    import random

    tasks = [get_task("mock", tid) for tid in ("update_task_1", "create_task_1", "update_task_with_initialization_data")]
    records = [record("mock", t, demo_turns(t), s) for t in tasks for s in (0, 1)]
    expected = select_rft(records)
    assert [r["metadata"]["task_id"] for r in expected] == ["create_task_1", "update_task_1",
                                                        "update_task_with_initialization_data"]
    assert all(r["metadata"]["sample"] == 0 for r in expected)  # sample 1 repeats sample 0's conversation
    rng = random.Random(0)
    for _ in range(5):
        shuffled = rng.sample(records, len(records))
        assert select_rft(shuffled) == expected


def test_domain_stats_count_episodes_successes_and_rows(telecom):
    _, _, recs = telecom
    records = [recs["win"], recs["partial"], {**recs["zero"], "status": "aborted"}]
    stats = domain_stats(records, select_rft(records))
    assert stats == {"telecom": {"tasks": 1, "episodes": 2, "successes": 1, "tasks_solved": 1, "aborted": 1,
                                 "rows_success": 1}}


def _episode_file(path: Path, records: list[dict], version: str | None = None) -> None:
    from tau2_rl_pipeline.benchmark.tau2_version import VERSION
    from tau2_rl_pipeline.eval.episodes_file import EpisodesFile

    log = EpisodesFile(path, {"task_split": "train"},
                       benchmark={"tau2_version": version or VERSION, "task_set_hash": "0" * 16})
    log.open_for_append()
    for rec in records:
        log.append(rec)
    log.close()


def test_cli_selects_from_recorded_episodes_and_merges(tmp_path, telecom, capsys):
    _, _, recs = telecom
    episodes = tmp_path / "rft.eval.json.episodes.jsonl"
    _episode_file(episodes, list(recs.values()))
    seed = tmp_path / "seed.jsonl"
    write_jsonl(seed, oracle_demonstrations("mock", "base"))
    out = tmp_path / "rft.jsonl"
    assert main(["--episodes", str(episodes), "--merge-with", str(seed), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["metadata"]["source"] for r in rows] == ["oracle"] * 7 + ["rft"]  # two mock demos are one
    printed = capsys.readouterr().out
    assert re.search(r"telecom\W+1/1\W+2/4\W+0\.500\W+1\W+0\W+0\W", printed)  # tasks ... aborted
    assert "wrote 8 rows" in printed and "8 seed rows, 1 duplicates dropped" in printed


def test_cli_refuses_a_broken_seed_file(tmp_path, telecom, capsys):
    _, _, recs = telecom
    episodes = tmp_path / "e.jsonl"
    _episode_file(episodes, [recs["win"]])
    seed = tmp_path / "seed.jsonl"
    seed.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert main(["--episodes", str(episodes), "--merge-with", str(seed), "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "seed.jsonl line 1: no assistant message" in capsys.readouterr().err


@pytest.mark.parametrize("flags,selected", [([], []), (["--min-partial", "0.3"], [2]),
                                             (["--min-partial", "0.3", "--no-partial"], [])])
def test_cli_partial_settings(tmp_path, telecom, flags, selected):
    _, _, recs = telecom
    episodes = tmp_path / "e.jsonl"
    _episode_file(episodes, [recs["zero"], recs["partial"]])
    out = tmp_path / "rft.jsonl"
    assert main(["--episodes", str(episodes), "--out", str(out), *flags]) == 0
    assert [json.loads(line)["metadata"]["sample"] for line in out.read_text().splitlines()] == selected


def test_cli_samples_through_the_evaluator(tmp_path, loopback, small_tokenizer, tiny_small_dir, capsys):
    """The sampling path end to end: the Pass@K evaluator against an SGLang look-alike on loopback replaying the
    oracle's completions, the scripted user, tau2's evaluator; two samples of one task give one row."""
    from tau2_rl_pipeline.eval.episodes_file import parse_lines

    task = get_task("mock", "create_task_1")
    completions = [small_tokenizer.encode(text, add_special_tokens=False)
                   + [small_tokenizer.convert_tokens_to_ids("<|im_end|>")] for text in demo_turns(task)]
    loopback.script(*completions, *completions)
    out, eval_output = tmp_path / "rft.jsonl", tmp_path / "eval" / "rft.json"
    code = main(["--sglang-url", loopback.base_url, "--hf-checkpoint", str(tiny_small_dir), "--user", "scripted",
                 "--domains", "mock", "--task-split", "base", "--task-ids", task.id, "--num-samples", "2",
                 "--concurrency", "1", "--eval-output", str(eval_output), "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["metadata"]["task_id"], r["metadata"]["selected"]) for r in rows] == [(task.id, "success")]
    header, records, _ = parse_lines(Path(f"{eval_output}.episodes.jsonl").read_bytes())
    assert header["settings"]["sampling"]["temperature"] == 0.8  # RFT's default, not the evaluator's
    assert [(r["sample"], r["reward"]) for r in records] == [(0, 1.0), (1, 1.0)]
    assert re.search(r"mock\W+1/1\W+2/2\W+1\.000\W+1\W+0\W+0\W", capsys.readouterr().out)


def test_cli_refuses_episodes_graded_by_another_tau2(tmp_path, telecom, capsys):
    _, _, recs = telecom
    episodes = tmp_path / "old.episodes.jsonl"
    _episode_file(episodes, list(recs.values()), version="0.9")
    assert main(["--episodes", str(episodes), "--out", str(tmp_path / "rft.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert "graded by tau2 0.9, this run uses tau2" in err and "\n" not in err and not (tmp_path / "rft.jsonl").exists()
