"""Task loading and the task index JSONL slime reads as prompt data."""

import json
import subprocess
import sys

import pytest

from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, get_task, load_tasks, write_task_index
from tau2_rl_pipeline.benchmark.tau2_version import V1, VERSION, task_set_hash


def test_task_index_rows_and_metadata(tmp_path):
    counts = write_task_index(tmp_path, ["airline", "retail", "telecom"], ["train", "test"])
    expected = {"train": {"airline": 30, "retail": 74, "telecom": 74}, "test": {"airline": 20, "retail": 40, "telecom": 40}}
    for split, per_domain in expected.items():
        for domain, n in per_domain.items():
            rows = [json.loads(line) for line in (tmp_path / f"{domain}_{split}_tasks.jsonl").read_text().splitlines()]
            assert len(rows) == n == counts[f"{domain}_{split}_tasks.jsonl"]
            ids = [t.id for t in load_tasks(domain, split)]
            benchmark = {"tau2_version": VERSION, "task_set_hash": task_set_hash({domain: load_tasks(domain, split)})}
            for i, row in enumerate(rows):
                assert row["metadata"] == {"domain": domain, "split": split, "task_id": ids[i], "task_index": i,
                                           "benchmark": benchmark}
                assert isinstance(row["input"], str) and row["input"]
        all_rows = (tmp_path / f"tau2_{split}_all_tasks.jsonl").read_text().splitlines()
        assert len(all_rows) == sum(per_domain.values())


def test_telecom_small_and_full_and_mock_base():
    assert len(load_tasks("telecom", "small")) == 20
    assert len(load_tasks("telecom", "full")) == 2285
    assert len(load_tasks("mock", "base")) == (10 if V1 else 9)  # 1.0.1 added a mock task
    if V1:  # 1.0.1's fourth domain: one set, no split file (tests/test_banking.py runs it)
        assert len(load_tasks("banking_knowledge", "base")) == 97
    else:  # 26.3 has no such domain: refused in one line, saying where it is
        with pytest.raises(TaskLookupError, match="^banking_knowledge is a tau2-bench 1.0.1 domain; the installed "
                                                  "tau2 26.3 has none: ") as e:
            load_tasks("banking_knowledge", "base")
        assert "\n" not in str(e.value)
    task = load_tasks("airline", "test")[3]
    assert get_task("airline", task.id, "test") is task


@pytest.mark.parametrize("domain,split,needle", [
    ("hotel", "train", "valid domains: airline, retail, telecom, mock"),
    ("airline", "small", "valid splits: train, test, base"),
    ("mock", "train", "valid splits: base"),
])
def test_unknown_domain_or_split_lists_the_valid_ones(domain, split, needle):
    with pytest.raises(TaskLookupError, match=needle):
        load_tasks(domain, split)


def test_unknown_task_id():
    with pytest.raises(TaskLookupError, match="unknown task id 'nope'"):
        get_task("retail", "nope", "test")


def test_cli_is_compatible_with_the_original(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "tau2_rl_pipeline.benchmark.tasks", "--local_dir", str(tmp_path),
                         "--domains", "airline,retail", "--splits", "test"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "airline_test_tasks.jsonl", "retail_test_tasks.jsonl", "tau2_test_all_tasks.jsonl"]
    bad = subprocess.run([sys.executable, "-m", "tau2_rl_pipeline.benchmark.tasks", "--local_dir", str(tmp_path),
                          "--domains", "hotel"], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == ("error: unknown domain 'hotel'; valid domains: airline, retail, "
                                                   "telecom, mock")


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_an_unwritable_local_dir_is_one_line(tmp_path, capsys, where):
    from tau2_rl_pipeline.benchmark.tasks import main

    (tmp_path / "file").write_text("x")
    local_dir = {"under_a_file": tmp_path / "file" / "tasks", "proc": "/proc/tau2-tasks-test"}[where]
    assert main(["--local-dir", str(local_dir), "--domains", "mock", "--splits", "base"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --local-dir {local_dir}: cannot write") and err.count("\n") == 1, err
