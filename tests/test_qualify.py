"""User-simulator qualification (tau2-rl-qualify-user, tau2_rl_pipeline/eval/qualify.py): the oracle agent against the scripted user
(it must pass, the one known task fault named) and against tau2's LLM user simulator served by the loopback server
(real HTTP, litellm or the asynchronous client), whose answers misbehave in each named way and are caught with
their cause; the one-line errors; the GRPO script's gate."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tau2.data_model.simulation import Results

from tau2_rl_pipeline.benchmark import user_monitors as um
from tau2_rl_pipeline.benchmark.actions import format_tool_call
from tau2_rl_pipeline.benchmark.oracle_play import (
    EVALUATOR_DISAGREED,
    USER_ACTION_NOT_PERFORMED,
    USER_TRANSFERRED_OR_ENDED,
)
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.eval.qualify import main
from tau2_rl_pipeline.eval.qualify_canned import qualify_user

MOCK_FAULT = "update_task_with_history_and_env_assertions"  # tau2 26.3's mock: even the gold replay scores 0
TELECOM_TASK = "[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]"  # 3 device steps
ASK = re.compile(r"^Please (?P<name>[\w ]+?) now(?:, with (?P<args>\{.*\}))?\.$")


def run(tmp_path: Path, *argv: str) -> tuple[int, dict | None]:
    output = tmp_path / "q.json"
    code = main([*argv, "--output", str(output)])
    return code, json.loads(output.read_text()) if output.exists() else None


def test_the_scripted_user_qualifies_apart_from_the_known_task_fault(tmp_path: Path, capsys) -> None:
    code, summary = run(tmp_path, "--user", "scripted", "--domains", "mock", "--task-split", "base",
                        "--num-samples", "2")
    out = capsys.readouterr().out
    assert code == 0 and summary["qualification"]["qualified"]
    mock = summary["qualification"]["domains"]["mock"]
    assert mock["task_faults"] == [MOCK_FAULT] and mock["causes"] == {}
    assert (mock["failure_rate"]["failed"], mock["failure_rate"]["n_episodes"]) == (0, 16)  # 8 tasks x 2
    assert f"task faults (fail under every simulator, gold replay included; not counted): {MOCK_FAULT}" in out
    assert out.splitlines()[-1].startswith("QUALIFIED: failure 0/16 episodes = 0.000")
    results = Results.load(tmp_path / "q.mock.tau2.json")  # tau2's own loader, as for the evaluator's runs
    assert len(results.simulations) == 18
    assert (tmp_path / "q.json.episodes.jsonl").is_file()


def test_the_scripted_user_qualifies_on_telecom_device_steps(tmp_path: Path) -> None:
    code, summary = run(tmp_path, "--user", "scripted", "--domains", "telecom", "--task-split", "test")
    telecom = summary["qualification"]["domains"]["telecom"]
    assert code == 0 and telecom["failure_rate"]["failed"] == 0 and telecom["task_faults"] == []
    assert telecom["failure_rate"]["n_tasks"] == 40


class LoopbackUser:
    """What the loopback server answers as tau2's LLM user (its `chat_answer`): the opening, each device step the
    oracle asks for as that tool call, then ###STOP### after the closing message; `mode` makes it misbehave."""

    def __init__(self, mode: str = "good"):
        self.mode = mode

    def __call__(self, body: dict) -> str:
        messages = body["messages"]
        last = messages[-1]
        if self.mode == "stops":
            return "###STOP###"
        if self.mode == "transfers":
            return "###TRANSFER###"
        if last["role"] == "tool":
            return "Done, what next?"
        if not any(m["role"] == "assistant" for m in messages):  # its first turn
            return "Hi, my phone has no service and I need help."
        asked = ASK.match(last.get("content") or "")
        if asked is None:
            return "Thanks, that is all. ###STOP###"
        if self.mode == "no_device":
            return "I'd rather not touch my phone."
        name, args = asked["name"].replace(" ", "_"), json.loads(asked["args"] or "{}")
        calls = [format_tool_call(name, args)]
        if self.mode == "extra" and name == "reboot_device":  # and one step nobody asked for
            calls.append(format_tool_call("toggle_airplane_mode", {}))
        return "\n".join(calls)


def llm_run(tmp_path: Path, loopback, mode: str, domain: str, task_id: str, split: str, client: str = "async"):
    loopback.chat_answer = LoopbackUser(mode)
    return run(tmp_path, "--user", "llm", "--domains", domain, "--task-split", split, "--task-ids", task_id,
               "--user-model", f"openai/{loopback.model_name}", "--user-api-base", f"{loopback.base_url}/v1",
               "--user-client", client, "--user-max-retries", "0", "--max-failure-rate", "0")


@pytest.mark.parametrize("client", ["async", "litellm"])
def test_a_well_behaved_llm_user_qualifies_over_either_client(client: str, loopback, tmp_path: Path) -> None:
    code, summary = llm_run(tmp_path, loopback, "good", "telecom", TELECOM_TASK, "test", client)
    assert code == 0, summary
    assert summary["qualification"]["overall"]["failed"] == 0 and summary["settings"]["user_model"] == "openai/tiny"
    assert sum(path == "/v1/chat/completions" for path, _ in loopback.requests) >= 5  # opening, 3 steps, closing


@pytest.mark.parametrize("mode,domain,task_id,split,cause", [
    ("stops", "mock", "create_task_1", "base", um.USER_STOPPED_AT_ONCE),
    ("transfers", "mock", "create_task_1", "base", USER_TRANSFERRED_OR_ENDED),
    ("no_device", "telecom", TELECOM_TASK, "test", USER_ACTION_NOT_PERFORMED),
    ("extra", "telecom", TELECOM_TASK, "test", EVALUATOR_DISAGREED)])
def test_each_misbehaving_user_is_caught_with_its_cause(mode, domain, task_id, split, cause, loopback, tmp_path,
                                                        capsys) -> None:
    code, summary = llm_run(tmp_path, loopback, mode, domain, task_id, split)
    out = capsys.readouterr().out
    assert code == 1 and not summary["qualification"]["qualified"]
    d = summary["qualification"]["domains"][domain]
    assert d["causes"] == {cause: {"episodes": 1, "example_task_ids": [task_id]}} and d["task_faults"] == []
    assert f"    {cause}: 1 episodes, e.g. {task_id}" in out and out.splitlines()[-1].startswith("NOT QUALIFIED")


def test_another_simulators_run_decides_what_is_a_task_fault(tmp_path: Path, loopback) -> None:
    """A task the gold replay solves is never a task fault; one failing under every simulator is, with --against."""
    scripted = tmp_path / "scripted"
    scripted.mkdir()
    run(scripted, "--user", "scripted", "--domains", "mock", "--task-split", "base", "--task-ids", MOCK_FAULT)
    loopback.chat_answer = LoopbackUser("stops")
    code, summary = run(tmp_path, "--user", "llm", "--domains", "mock", "--task-split", "base", "--task-ids",
                        MOCK_FAULT, "--user-model", "openai/tiny", "--user-api-base", f"{loopback.base_url}/v1",
                        "--against", str(scripted / "q.json"))
    assert summary["qualification"]["domains"]["mock"]["task_faults"] == [MOCK_FAULT]
    assert summary["qualification"]["overall"]["n_episodes"] == 0 and code == 1  # nothing left to qualify on


def test_the_grpo_gate_and_one_line_errors(tmp_path: Path, capsys, monkeypatch) -> None:
    code, _ = run(tmp_path, "--user", "scripted", "--domains", "mock", "--task-split", "base")
    assert code == 0
    llm = json.loads((tmp_path / "q.json").read_text())  # as a run of tau2's LLM user would have written it
    llm["settings"].update(user="llm", user_model="openai/qwen", user_api_base="", user_temperature=0.0,
                           user_strategy="llm")
    (tmp_path / "llm.json").write_text(json.dumps(llm))
    monkeypatch.setenv("TAU2_USER_MODEL", "openai/qwen")
    mock = ["--domains", "mock", "--task-split", "base"]
    assert main(["--check", str(tmp_path / "llm.json"), "--max-failure-rate", "0", *mock]) == 0
    assert "user simulator 'openai/qwen' qualified: failure 0.000 <= 0.0" in capsys.readouterr().out
    llm["qualification"]["overall"].update(value=0.2, failed=2, n_episodes=10)
    (tmp_path / "bad.json").write_text(json.dumps(llm))
    for argv, words in ((["--check", str(tmp_path / "bad.json"), "--max-failure-rate", "0.1", *mock],
                         "above the allowed 0.1"),
                        (["--check", str(tmp_path / "q.json")], "qualified the scripted user"),
                        (["--check", str(tmp_path / "llm.json"), "--user-model", "gpt-4.1"],
                         "this run has TAU2_USER_MODEL='gpt-4.1'"),
                        (["--check", str(tmp_path / "llm.json"), "--user-strategy", "verify"],
                         "this run has TAU2_USER_STRATEGY='verify'"),
                        (["--check", str(tmp_path / "llm.json"), "--domains", "mock,airline", "--task-split", "base"],
                         "this run trains on airline (base split)"),
                        (["--check", str(tmp_path / "none.json")], "not a user-simulator qualification"),
                        (["--domains", "nope", "--user", "scripted"], "nope")):
        code = main(argv)
        err = capsys.readouterr().err.strip()
        assert code in (1, 2) and err.startswith("error: ") and "\n" not in err and words in err, err


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("client", ["async", "litellm"])
def test_no_user_server_is_one_line_up_front_and_keeps_the_earlier_result(client: str, tmp_path: Path,
                                                                          capsys) -> None:
    """--user llm with nothing listening at the API base: one line before any episode (not every request's
    retries), exit 2, and the earlier summary at --output untouched."""
    earlier = tmp_path / "q.json"
    earlier.write_text('{"earlier": true}\n')
    base = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: refused, for real
    code = main(["--user", "llm", "--domains", "mock", "--task-split", "base", "--user-model", "openai/qwen",
                 "--user-api-base", base, "--user-client", client, "--output", str(earlier)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip().splitlines() == [
        (f"error: no user simulator answers at {base} (Connection refused): start it (scripts/start_user_sim.sh) "
         "or point TAU2_USER_API_BASE at one; nothing written")]
    assert earlier.read_text() == '{"earlier": true}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["q.json"]


def test_a_second_run_says_it_replaces_the_earlier_result(tmp_path: Path, capsys) -> None:
    assert run(tmp_path, "--user", "scripted", "--domains", "mock", "--task-split", "base", "--task-ids",
               "create_task_1")[0] == 0
    assert "earlier" not in capsys.readouterr().err
    assert run(tmp_path, "--user", "scripted", "--domains", "mock", "--task-split", "base", "--task-ids",
               "create_task_1")[0] == 0
    assert (f"note: {tmp_path / 'q.json'} holds an earlier qualification; this run replaces it when it finishes"
            in capsys.readouterr().err)


@pytest.mark.parametrize("where", ["under_a_file", "unwritable", "a_folder"])
def test_an_output_path_that_cannot_be_written_is_one_line_before_the_run(where: str, tmp_path: Path,
                                                                          capsys) -> None:
    (tmp_path / "file").write_text("x")
    output = {"under_a_file": tmp_path / "file" / "q.json", "unwritable": Path("/sys/tau2-qualify/q.json"),
              "a_folder": tmp_path}[where]
    code = main(["--user", "scripted", "--domains", "mock", "--task-split", "base", "--output", str(output)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"error: --output {output}: ") and {
        "under_a_file": f"{tmp_path / 'file'} is a file, not a folder", "unwritable": "cannot write in /sys",
        "a_folder": "is a folder"}[where] in line


CAUGHT = {"empty": um.USER_EMPTY, "half-empty": um.USER_EMPTY, "echo": um.USER_ECHOED,
          "never-ends": um.USER_NEVER_ENDED, "stops-at-once": um.USER_STOPPED_AT_ONCE, "reveals": um.USER_LEAKED,
          "wrong-facts": um.USER_WRONG_FACTS, "spanish": um.USER_OTHER_LANGUAGE}


@pytest.mark.parametrize("domain,task_ids", [("mock", None), ("airline", ["8", "13"])])
def test_the_probing_oracle_catches_each_misbehaving_canned_user_with_its_cause(domain, task_ids) -> None:
    """Real tau2 environments and evaluator: the scripted and the well-behaved canned user qualify with no cause;
    each misbehaving one is refused, its own cause the first named (docs/evaluation.md's table, over all tasks)."""
    cfg = Tau2Config.from_env()
    for name in ("scripted", "canned"):
        result = qualify_user(name, domain, task_ids, 0.0, cfg)
        assert result["qualified"] and result["overall"]["failed"] == 0 and not result["all_causes"], (name, result)
    for name, cause in CAUGHT.items():
        result = qualify_user(name, domain, task_ids, 0.0, cfg)
        causes = result["domains"][domain]["causes"]
        assert not result["qualified"] and max(causes, key=lambda c: causes[c]["episodes"]) == cause, (name, causes)
    if domain == "airline":  # airline 13 is a transfer: a user that hangs up at once still scores 1.0 there
        assert qualify_user("stops-at-once", domain, ["13"], 0.0, cfg)["flagged_successes"] == 1
