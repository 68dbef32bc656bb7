"""User-simulator qualification (tau2-rl-qualify-user, tau2_rl_pipeline/eval/qualify.py): the oracle agent against the scripted user
(it must pass, the one known task fault named) and against tau2's LLM user simulator served by the loopback server
(real HTTP, litellm or the asynchronous client), whose answers misbehave in each named way and are caught with
their cause; the one-line errors; the GRPO script's gate."""

from __future__ import annotations

import asyncio
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
    USER_STOPPED_EARLY,
    USER_TRANSFERRED_OR_ENDED,
)
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.eval.plan import make_plan
from tau2_rl_pipeline.eval.qualify import main, qualification, reference_words, settled, verdict_lines
from tau2_rl_pipeline.eval.qualify_canned import qualify_user

# tau2 26.3's mock: it gives no gold actions, so even the gold replay scores 0, yet an agent that marks task_2
# completed scores 1.0: a task the oracle cannot play, not a task fault
MOCK_UNPLAYABLE = "update_task_with_history_and_env_assertions"
TELECOM_TASK = "[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]"  # 3 device steps
ASK = re.compile(r"^Please (?P<name>[\w ]+?) now(?:, with (?P<args>\{.*\}))?\.$")


def run(tmp_path: Path, *argv: str) -> tuple[int, dict | None]:
    output = tmp_path / "q.json"
    code = main([*argv, "--output", str(output)])
    return code, json.loads(output.read_text()) if output.exists() else None


def test_the_scripted_user_qualifies_apart_from_the_task_the_oracle_cannot_play(tmp_path: Path, capsys) -> None:
    code, summary = run(tmp_path, "--user", "scripted", "--domains", "mock", "--task-split", "base",
                        "--num-samples", "2")
    out = capsys.readouterr().out
    assert code == 0 and summary["qualification"]["qualified"]
    mock = summary["qualification"]["domains"]["mock"]
    assert mock["oracle_cannot_play"] == [MOCK_UNPLAYABLE] and mock["task_faults"] == [] and mock["causes"] == {}
    assert (mock["failure_rate"]["failed"], mock["failure_rate"]["n_episodes"]) == (0, 16)  # 8 tasks x 2
    assert ("the oracle cannot play (no gold actions to play; fail under every simulator; not counted): "
            f"{MOCK_UNPLAYABLE}") in out and "task faults (" not in out
    assert out.splitlines()[-1].startswith("QUALIFIED: failure 0/16 episodes = 0.000")
    results = Results.load(tmp_path / "q.mock.tau2.json")  # tau2's own loader, as for the evaluator's runs
    assert len(results.simulations) == 18
    assert (tmp_path / "q.json.episodes.jsonl").is_file()


def test_the_task_the_oracle_cannot_play_is_solvable() -> None:
    """mock's update_task_with_history_and_env_assertions gives no gold actions (so the gold replay scores 0), but an
    agent that marks task_2 completed scores 1.0 under tau2's evaluator: the task is sound, the oracle has nothing
    to play."""
    from tau2.orchestrator.orchestrator import TerminationReason

    from tau2_rl_pipeline.benchmark.episode import Episode
    from tau2_rl_pipeline.benchmark.tasks import load_tasks

    task = next(t for t in load_tasks("mock", "base") if t.id == MOCK_UNPLAYABLE)
    assert not task.evaluation_criteria.actions
    episode = Episode("mock", task, user=None)
    episode.start()
    episode.agent_tool_call("update_task_status", {"task_id": "task_2", "status": "completed"})
    episode.agent_says("Task task_2 is now marked completed.")
    episode.stop(TerminationReason.AGENT_STOP)
    assert episode.evaluate().reward == 1.0


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
        if self.mode == "transfers_later" and any(m["role"] == "assistant" for m in messages):  # it spoke
            return "###TRANSFER###"
        if last["role"] == "tool":
            return "Done, what next?"
        if not any(m["role"] == "assistant" for m in messages):  # its first turn (its own are "assistant" here)
            return "Hi, I need help with a task: my phone has no service."
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
    ("transfers", "mock", "create_task_1", "base", um.USER_STOPPED_AT_ONCE),  # before a word of its request
    ("transfers_later", "mock", "create_task_1", "base", USER_TRANSFERRED_OR_ENDED),
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


def test_another_simulators_run_decides_what_is_set_aside(tmp_path: Path, loopback) -> None:
    """A task the gold replay solves is never set aside; one failing under every simulator is, with --against."""
    scripted = tmp_path / "scripted"
    scripted.mkdir()
    run(scripted, "--user", "scripted", "--domains", "mock", "--task-split", "base", "--task-ids", MOCK_UNPLAYABLE)
    loopback.chat_answer = LoopbackUser("stops")
    code, summary = run(tmp_path, "--user", "llm", "--domains", "mock", "--task-split", "base", "--task-ids",
                        MOCK_UNPLAYABLE, "--user-model", "openai/tiny", "--user-api-base", f"{loopback.base_url}/v1",
                        "--against", str(scripted / "q.json"))
    assert summary["qualification"]["domains"]["mock"]["oracle_cannot_play"] == [MOCK_UNPLAYABLE]
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


# each misbehaving canned user's own causes: a first cause outside its set would name the wrong fault
OWN = {"empty": {um.USER_EMPTY}, "half-empty": {um.USER_EMPTY}, "echo": {um.USER_ECHOED},
       "paraphrases": {um.USER_ECHOED}, "never-ends": {um.USER_NEVER_ENDED}, "loops": {um.USER_LOOPED},
       "reveals": {um.USER_LEAKED}, "recites-persona": {um.USER_LEAKED}, "wrong-facts": {um.USER_WRONG_FACTS},
       "wrong-name": {um.USER_WRONG_FACTS}, "spanish": {um.USER_OTHER_LANGUAGE}, "ends-politely": {USER_STOPPED_EARLY},
       # on a task whose history already holds the request (mock's history tasks), an ending at once is early
       "stops-at-once": {um.USER_STOPPED_AT_ONCE, USER_STOPPED_EARLY},
       "small-talk": {um.USER_STOPPED_AT_ONCE, USER_STOPPED_EARLY},
       "transfers-at-once": {um.USER_STOPPED_AT_ONCE, USER_TRANSFERRED_OR_ENDED}}
# a misbehaviour with no occasion there: mock's requests carry their facts, so the oracle asks nothing and the user's
# second message answers its closing; airline and retail scenarios give no persona
NO_OCCASION = {("ends-politely", "mock"), ("recites-persona", "airline"), ("recites-persona", "retail")}
DOMAINS = [("mock", None), ("airline", ["8", "13"]), ("retail", ["5", "9"])]


@pytest.mark.parametrize("domain,task_ids", DOMAINS)
def test_each_misbehaving_canned_user_is_refused_under_its_own_first_cause(domain, task_ids) -> None:
    """Real tau2 environments and evaluator: the scripted, the well-behaved and the rambling canned user qualify
    with no cause; each misbehaving one is refused, and every bad episode's FIRST cause is its own (docs/evaluation.md's
    table, over all tasks)."""
    cfg = Tau2Config.from_env()
    for name in ("scripted", "canned", "rambles"):
        result = qualify_user(name, domain, task_ids, 0.0, cfg)
        assert result["qualified"] and result["overall"]["failed"] == 0 and not result["all_causes"], (name, result)
    for name, own in OWN.items():
        result = qualify_user(name, domain, task_ids, 0.0, cfg)
        firsts = {r["qualify_cause"] for r in result["records"]} - {None}
        if (name, domain) in NO_OCCASION:
            assert result["qualified"] and not firsts, (name, result["domains"])
        else:
            assert not result["qualified"] and firsts and firsts <= own, (name, firsts)
    if domain == "airline":  # airline 13 is a transfer: a user that hangs up at once still scores 1.0 there
        assert qualify_user("stops-at-once", domain, ["13"], 0.0, cfg)["flagged_successes"] == 1


def test_a_short_persona_recited_is_leakage() -> None:
    """A persona of four words ("You are shy, rigid.") recited: no 6-word run exists, the recital is caught."""
    from tau2_rl_pipeline.benchmark.tasks import load_tasks
    from tau2_rl_pipeline.eval.canned_users import PersonaReciterUser
    from tau2_rl_pipeline.eval.qualify import run_oracle

    task = next(t for t in load_tasks("mock", "base") if t.id == "create_task_1")
    shy = task.model_copy(update={"user_scenario": task.user_scenario.model_copy(
        update={"persona": "You are shy, rigid."})})
    (record,) = asyncio.run(run_oracle([("mock", shy, 0)], lambda task, environment: PersonaReciterUser(task),
                                       Tau2Config.from_env(), 300, 1))
    assert record["qualify_causes"] == [um.USER_LEAKED] and record["user_monitors"]["leakage"] == 1.0


def test_a_rambling_user_qualifies_and_the_report_shows_its_length_against_the_reference() -> None:
    """About 500 words a message: not refused (the oracle's episodes score 1.0, the rewards are right); the report
    sets its words per message beside the reference (scripted) user's on the same tasks and says so."""
    cfg = Tau2Config.from_env()
    result = qualify_user("rambles", "mock", None, 0.0, cfg)
    reference = reference_words(make_plan(["mock"], "base", None, 1).tasks, cfg)
    report = qualification(result["records"], {}, 0.0, (), reference)
    mock = report["domains"]["mock"]
    assert report["qualified"] and mock["user_words_per_message"] > 400 and 5 < mock["reference_words_per_message"] < 30
    lines = verdict_lines(report, "rambles")
    ratio = mock["user_words_per_message"] / mock["reference_words_per_message"]
    assert (f"    user words per message: {mock['user_words_per_message']:.1f} (the reference scripted user on these "
            f"tasks: {mock['reference_words_per_message']:.1f}; {ratio:.1f}x)") in lines
    assert any(line.startswith(f"    note: {ratio:.0f}x the reference user's length: not refused") for line in lines)
    assert not any("note:" in line for line in verdict_lines(qualification(
        qualify_user("canned", "mock", None, 0.0, cfg)["records"], {}, 0.0, (), reference), "canned"))


def test_replays_stop_once_the_verdict_is_settled(tmp_path: Path, loopback, capsys) -> None:
    """A failing task is replayed without a user only while the verdict could still turn on it: a user that stops at
    once on airline 8 and 13 (13 scores 1.0 but is flagged, so the rate is over 0 whatever 8 is): 8 is never
    replayed and counts as a failure; the canned table's run replays it (no task fault)."""
    code, summary = llm_run(tmp_path, loopback, "stops", "airline", "8,13", "test")
    airline = summary["qualification"]["domains"]["airline"]
    assert code == 1 and airline["not_replayed"] == ["8"] and summary["qualification"]["overall"]["failed"] == 2
    assert ("    failing tasks not replayed (the verdict was settled without them; counted as the user's failures): 1"
            in capsys.readouterr().out)
    every = qualify_user("stops-at-once", "airline", ["8", "13"], 0.0, Tau2Config.from_env())["domains"]["airline"]
    assert every["not_replayed"] == [] and every["task_faults"] == [] and every["failure_rate"]["failed"] == 2


def test_settled_is_over_the_bound_whatever_the_unsure_tasks_are() -> None:
    def rec(task: str, reward: float) -> dict:
        return {"domain": "d", "task_id": task, "status": "completed", "reward": reward, "qualify_cause": None}

    records = [rec("a", 0.0), rec("b", 0.0), rec("c", 1.0), rec("d", 0.0)]
    assert settled(records, {("d", "a"), ("d", "b")}, 0.4)  # c and d left: 1 of 2 fail
    assert not settled(records, {("d", "a"), ("d", "b"), ("d", "d")}, 0.4)  # only c left: none fail
    assert not settled(records, {("d", t) for t in "abcd"}, 0.0)  # nothing left to decide on


@pytest.mark.parametrize("recorded,run_with,same", [
    ("http://127.0.0.1:30001/v1", "http://localhost:30001/v1/", True),
    ("http://127.0.0.1:30001/v1", "HTTP://LOCALHOST:30001/v1", True),
    ("http://10.0.0.1:80/v1", "http://10.0.0.1/v1", True),
    ("http://127.0.0.1:30001/v1,http://127.0.0.1:30002/v1", "http://localhost:30002/v1,http://127.0.0.1:30001/v1",
     True),
    ("http://127.0.0.1:30001/v1", "http://127.0.0.1:30002/v1", False),
    ("http://127.0.0.1:30001/v1", "http://10.0.0.1:30001/v1", False)])
def test_the_gate_takes_one_server_however_it_is_spelt(recorded: str, run_with: str, same: bool,
                                                       tmp_path: Path) -> None:
    """A qualification that recorded 127.0.0.1 covers a run that says localhost for the same server."""
    from tau2_rl_pipeline.benchmark.tau2_version import VERSION
    from tau2_rl_pipeline.eval.qualify_gate import FORMAT, QualificationError, check

    summary = tmp_path / "q.json"
    summary.write_text(json.dumps({"format": FORMAT, "settings": {
        "user": "llm", "user_model": "openai/q", "user_api_base": recorded, "user_temperature": 0.0,
        "user_strategy": "llm", "user_strategy_max_checks": None, "benchmark": {"tau2_version": VERSION},
        "domains": ["mock"], "task_split": "base"},
        "qualification": {"overall": {"value": 0.0, "failed": 0, "n_episodes": 8}}}))
    cfg = Tau2Config(user_model="openai/q", user_api_base=run_with)
    if same:
        assert "qualified" in check(summary, 0.05, cfg, {("mock", "base")})
    else:
        with pytest.raises(QualificationError, match="TAU2_USER_API_BASE"):
            check(summary, 0.05, cfg, {("mock", "base")})


def test_the_tool_and_the_scripts_share_one_user_temperature(tmp_path: Path) -> None:
    """What tau2-rl-qualify-user records when TAU2_USER_TEMPERATURE is unset is what a run's gate wants when it is
    unset: the stage scripts no longer export a default of their own (scripts/common.sh only checks a value set)."""
    from tau2_rl_pipeline.config import DEFAULT_USER_TEMPERATURE
    from tau2_rl_pipeline.eval.qualify_gate import user_settings

    assert user_settings("llm", Tau2Config.from_env({}))["user_temperature"] == DEFAULT_USER_TEMPERATURE
    common = (Path(__file__).parents[1] / "scripts" / "common.sh").read_text()
    assert not re.search(r"TAU2_USER_TEMPERATURE:-[^}]", common) and "export TAU2_USER_TEMPERATURE" not in common
