"""Seed SFT data (the published format, bad rows included) and oracle demonstrations, against real tau2 domains and
the real Qwen3 chat template."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.actions import format_tool_call, parse_completion, render_assistant_text
from tau2_rl_pipeline.benchmark.episode import AGENT_STOP_TOKEN
from tau2_rl_pipeline.benchmark.oracle import gold_actions
from tau2_rl_pipeline.benchmark.prompting import render
from tau2_rl_pipeline.benchmark.tasks import get_task, load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import V1
from tau2_rl_pipeline.learning.oracle_demos import oracle_demo, oracle_demonstrations, play_turns
from tau2_rl_pipeline.learning.seed_data import (
    SEED_DATASET,
    SEED_FILE,
    RowError,
    SeedDataError,
    dataset_files,
    load_seed,
    normalize_row,
    read_rows,
)
from tau2_rl_pipeline.learning.sft_data import main
from tau2_rl_pipeline.learning.sft_rows import domain_spec, sft_chat

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "data" / "seed_fixture.jsonl"

# Line -> what is wrong with it (the fixture's bad rows; line 4 is blank, 1-3 are good).
BAD_LINES = {
    5: "unknown role 'moderator'",
    6: "arguments of get_customer_by_phone are not JSON",
    7: "unknown tool 'book_reservation' for retail",
    8: "no messages: expected a 'messages' or 'prompt' key",
    9: "not JSON",
    10: "'toggle_airplane_mode' is a user-side tool of telecom",
    11: "invalid JSON",
    12: "tool call get_order_details has no tool result",
}


def _calls(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]


# ---------------------------------------------------------------------------------------------------------------
# Seed data


@pytest.fixture(scope="module")
def seed_rows() -> list[dict]:
    rows, rejected = load_seed(str(FIXTURE))
    assert {r.line: r.reason for r in rejected}.keys() == BAD_LINES.keys()
    return rows


def test_fixture_bad_rows_are_reported_with_their_line_and_reason():
    rows, rejected = load_seed(str(FIXTURE))
    assert [r["metadata"]["source_line"] for r in rows] == [1, 2, 3]
    for r in rejected:
        assert r.file == FIXTURE.name
        assert BAD_LINES[r.line] in r.reason, (r.line, r.reason)
        assert "\n" not in r.reason


def test_published_protocol_is_rewritten_to_the_rollouts(seed_rows):
    row = seed_rows[0]  # retail, prompt key, <tool_call> text, respond/done, "Tool result for" user turns
    spec = domain_spec("retail")
    assert row["metadata"] == {"domain": "retail", "task_id": "0", "source": "seed",
                               "source_file": FIXTURE.name, "source_line": 1}
    assert row["tools"] == list(spec.tools)
    messages = row["messages"]
    assert messages[0] == {"role": "system", "content": spec.system_prompt}
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant",
                                             "user", "assistant"]
    assert _calls(messages[2]) == [("find_user_id_by_name_zip",
                                    {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"})]
    assert _calls(messages[4]) == [("get_order_details", {"order_id": "#W2378156"})]  # arguments given as a string
    assert messages[3]["content"] == "yusuf_rossi_9620"
    assert messages[6] == {"role": "assistant", "content": "Thanks, Yusuf. Order #W2378156 was delivered. Which "
                                                           "items would you like to exchange?"}
    assert messages[-1] == {"role": "assistant", "content": AGENT_STOP_TOKEN}


def test_domain_comes_from_the_tools_when_the_row_has_none(seed_rows):
    assert seed_rows[1]["metadata"]["domain"] == "airline"
    assert seed_rows[1]["metadata"]["task_id"] == "airline_0"
    shared = {"prompt": [{"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": format_tool_call("calculate", {"expression": "2+2"})},
                         {"role": "user", "content": "Tool result for calculate(expression='2+2'):\n4.0"},
                         {"role": "assistant", "content": "4"}]}
    with pytest.raises(RowError, match="fit airline and retail"):
        normalize_row(shared)
    assert normalize_row({**shared, "domain": "retail"})["metadata"]["domain"] == "retail"


def test_openai_chat_rows_keep_their_conversation(seed_rows):
    row = seed_rows[2]
    assert row["metadata"]["domain"] == "telecom"
    assert row["messages"][0]["content"] == domain_spec("telecom").system_prompt  # replaced the row's own
    assert _calls(row["messages"][2]) == [("get_customer_by_phone", {"phone_number": "555-123-2002"})]
    assert row["messages"][3] == {"role": "tool", "content": '{"customer_id": "C1001", "full_name": "John Smith"}'}
    assert row["messages"][-1] == {"role": "assistant", "content": "Great, your mobile data is back."}


@pytest.mark.parametrize("row,reason", [
    ({"domain": "retail", "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"},
                                       {"role": "assistant", "content": "hello"}]}, "only allowed first"),
    ({"domain": "retail", "messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "{}"},
                                       {"role": "assistant", "content": "hello"}]}, "no tool call before it"),
    ({"domain": "retail", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": format_tool_call("get_order_details", {"order_id": "#W1"})},
        {"role": "user", "content": "Tool result for get_user_details(user_id='x'):\n{}"}]}, "does not answer"),
    ({"domain": "retail", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Sure.\n" + format_tool_call("respond", {"content": "hello"})}]},
     "must be the turn's only content"),
    ({"domain": "retail", "messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "hello", "step_loss_mask": 2}]},
     "step_loss_mask"),
    ({"domain": "banking", "messages": [{"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "hello"}]}, "unknown domain 'banking'"),
    ({"domain": "retail", "tools": [{"type": "function", "function": {"name": "book_reservation"}}],
      "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
     "unknown tool 'book_reservation'"),
    ({"domain": "retail", "messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
    ({"domain": "retail", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
     "empty assistant message"),
    ([{"role": "user", "content": "hi"}], "not a JSON object"),
])
def test_bad_rows_say_what_is_wrong(row, reason):
    with pytest.raises(RowError, match=reason):
        normalize_row(row)


def test_step_loss_mask_is_kept():
    row = normalize_row({"domain": "mock", "messages": [
        {"role": "assistant", "content": "Hi! How can I help you today?", "step_loss_mask": 0},
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    assert row["messages"][1]["step_loss_mask"] == 0
    assert "step_loss_mask" not in row["messages"][3]


def test_rows_render_with_the_qwen3_template(seed_rows, qwen3_tokenizer):
    """The normalized calls render byte-identical to the policy's own format, and parse back to the same calls."""
    for row in seed_rows:
        text = render(qwen3_tokenizer, row["messages"], row["tools"], add_generation_prompt=False)
        assert text.count("<|im_start|>assistant\n") == sum(m["role"] == "assistant" for m in row["messages"])
        for message in row["messages"]:
            if message["role"] == "assistant":
                body = render_assistant_text(message["content"], _calls(message))
                assert f"<|im_start|>assistant\n{body}<|im_end|>" in text
                parsed = parse_completion(body)
                assert [(c.name, c.arguments) for c in parsed.tool_calls] == _calls(message)
            if message["role"] == "tool":
                assert f"<tool_response>\n{message['content']}\n</tool_response>" in text


def test_seed_cli_writes_rows_and_the_rejected_lines(tmp_path, capsys):
    out = tmp_path / "seed.jsonl"
    assert main(["seed", "--dataset", str(FIXTURE), "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == load_seed(str(FIXTURE))[0]
    rejected = [json.loads(line) for line in Path(f"{out}.rejected.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejected] == sorted(BAD_LINES)
    captured = capsys.readouterr()
    assert f"{FIXTURE.name} line 5: message 1: unknown role 'moderator'" in captured.err
    assert "wrote 3 rows (airline 1, retail 1, telecom 1)" in captured.out
    assert "rejected 8" in captured.out


def test_seed_cli_fails_when_no_row_is_valid(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(FIXTURE.read_text().splitlines()[4:]) + "\n")
    assert main(["seed", "--dataset", str(bad), "--out", str(tmp_path / "out.jsonl")]) == 1
    assert "no valid rows" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_directory_files_are_chosen_by_pattern(tmp_path):
    (tmp_path / SEED_FILE).write_text(FIXTURE.read_text())
    (tmp_path / "extra.jsonl").write_text(FIXTURE.read_text().splitlines()[0] + "\n")
    assert dataset_files(str(tmp_path)) == [tmp_path / SEED_FILE]
    assert len(load_seed(str(tmp_path), "*.jsonl")[0]) == 4
    with pytest.raises(SeedDataError, match=f"no data file matching 'nothing\\*'.*extra.jsonl, {SEED_FILE}"):
        dataset_files(str(tmp_path), "nothing*")


def test_json_array_rows_are_numbered(tmp_path):
    path = tmp_path / "rows.json"
    lines = FIXTURE.read_text().splitlines()
    path.write_text("[" + ",".join([lines[1], lines[0]]) + "]")
    assert [(n, row.get("domain")) for n, row in read_rows(path)] == [(1, None), (2, "retail")]


def test_parquet_without_pyarrow_says_what_to_do(tmp_path):
    if importlib.util.find_spec("pyarrow") is not None:
        pytest.skip("pyarrow is installed here, so parquet files are read")
    path = tmp_path / "seed.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(SeedDataError, match="needs pyarrow: pip install pyarrow"):
        list(read_rows(path))


def _run_seed_cli(tmp_path: Path, hf_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home), "PYTHONPATH": str(REPO)}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "tau2_rl_pipeline.learning.sft_data", "seed", "--out",
                           str(tmp_path / "seed.jsonl")], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_offline_without_a_cache_is_a_one_line_error(tmp_path):
    result = _run_seed_cli(tmp_path, tmp_path / "hf")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "HF_HUB_OFFLINE=1" in lines[0] and "local file or directory" in lines[0]


def test_offline_reads_the_hub_cache(tmp_path):
    """huggingface-hub's own cache layout: refs/main names the snapshot holding the files."""
    repo = tmp_path / "hf" / "hub" / f"datasets--{SEED_DATASET.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / SEED_FILE).write_text(FIXTURE.read_text())
    result = _run_seed_cli(tmp_path, tmp_path / "hf")
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "seed.jsonl").read_text().splitlines()) == 3


# ---------------------------------------------------------------------------------------------------------------
# Oracle demonstrations


def test_every_train_task_of_the_three_domains_has_a_demonstration_at_reward_one():
    """Each row comes from an episode the evaluator scored 1.0; none may be missing, and each is a valid seed row."""
    domains = ("airline", "retail", "telecom")
    workers = min(len(domains), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = dict(zip(domains, pool.map(oracle_demonstrations, domains, ["train"] * len(domains))))
    for domain, rows in results.items():
        tasks = load_tasks(domain, "train")
        missing = sorted({t.id for t in tasks} - {r["metadata"]["task_id"] for r in rows})
        assert not missing, f"{domain}: no demonstration at reward 1.0 for {missing}"
        assert len(rows) == len(tasks)
        for row in rows:
            assert normalize_row(row)["messages"] == row["messages"]
    telecom = {r["metadata"]["task_id"]: r for r in results["telecom"]}
    for task in load_tasks("telecom", "train"):
        asked = [m["content"] for m in telecom[task.id]["messages"] if m["role"] == "assistant"
                 and m["content"].startswith("Please do this on your phone")]
        user_actions = [a for a in gold_actions(task) if a.requestor == "user"]
        assert bool(asked) == bool(user_actions)
        assert all(a.name.replace("_", " ") in " ".join(asked) for a in user_actions)


def test_mock_demonstrations_leave_out_the_tasks_below_one():
    rows = oracle_demonstrations("mock", "base")
    kept = {r["metadata"]["task_id"] for r in rows}
    assert kept == {t.id for t in load_tasks("mock", "base")} - {
        "update_task_with_message_history",  # its history already ends the request: the user stops at once
        "update_task_with_history_and_env_assertions",  # no gold action reaches its env assertion
        *(["update_task_with_user_tools"] if V1 else [])}  # 1.0.1's new task: its user-side step is not asked for
    for row in rows:
        assert row["messages"][1] == {"role": "assistant", "content": "Hi! How can I help you today?",
                                      "step_loss_mask": 0}
        assert row["messages"][-1]["role"] == "assistant"  # the user's ###STOP### is not part of the row
        assert row["metadata"]["source"] == "oracle"


@pytest.mark.parametrize("domain,task_id", [
    ("telecom", "[mobile_data_issue]bad_vpn|data_saver_mode_on|user_abroad_roaming_disabled_on[PERSONA:None]"),
    ("mock", "update_task_with_initialization_actions"),
])
def test_a_demonstration_replays_to_itself_at_reward_one(domain, task_id):
    """Playing a row's assistant turns against the scripted user gives the row's conversation and reward 1.0."""
    task = get_task(domain, task_id, "train" if domain != "mock" else "base")
    row = oracle_demo(domain, task, "train").row
    assert row is not None
    turns = [render_assistant_text(m["content"], _calls(m)) for m in row["messages"][2:] if m["role"] == "assistant"]
    episode = play_turns(domain, task, turns)
    assert episode.evaluate().reward == 1.0
    assert [{"role": "system", "content": episode.system_prompt}, *sft_chat(episode.messages)] == row["messages"]


def test_demonstrations_render_with_the_qwen3_template(qwen3_tokenizer):
    task = get_task("telecom", "[mobile_data_issue]bad_vpn|data_saver_mode_on|user_abroad_roaming_disabled_on"
                    "[PERSONA:None]", "train")
    row = oracle_demo("telecom", task, "train").row
    text = render(qwen3_tokenizer, row["messages"], row["tools"], add_generation_prompt=False)
    for name, args in [(a.name, a.arguments) for a in gold_actions(task) if a.requestor == "assistant"]:
        assert format_tool_call(name, args) in text
    assert "toggle_data_saver_mode" not in text.split("</tools>")[1]  # device steps are asked for, never called


def test_oracle_cli_writes_rows_and_lists_what_it_left_out(tmp_path, capsys):
    out = tmp_path / "oracle.jsonl"
    assert main(["oracle", "--domains", "mock", "--split", "base", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 7
    printed = capsys.readouterr().out
    assert "update_task_with_message_history" in printed and "wrote 7 rows (mock 7)" in printed


def test_oracle_cli_rejects_a_split_the_domain_lacks(tmp_path, capsys):
    assert main(["oracle", "--domains", "mock", "--split", "train", "--out", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown split 'train' for domain 'mock'") and "\n" not in err
