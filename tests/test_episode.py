"""The episode core: tool boundary, user side (telecom device tools), termination, prompt, gym."""

import pytest
from tau2.data_model.simulation import TerminationReason

from tau2_rl_pipeline.benchmark.actions import format_tool_call, render_assistant_text
from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.gym_env import Tau2GymEnv
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions
from tau2_rl_pipeline.benchmark.prompting import render
from tau2_rl_pipeline.benchmark.tasks import get_task, load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser


def _episode(domain, split, index=0, **kw):
    task = load_tasks(domain, split)[index]
    return Episode(domain, task, ScriptedUser(task), **kw)


@pytest.mark.parametrize("completion,why", [
    (format_tool_call("__class__", {}), "unknown tool `__class__`"),
    (format_tool_call("_get_db", {}), "unknown tool `_get_db`"),
    (format_tool_call("toggle_airplane_mode", {}), "unknown tool `toggle_airplane_mode`"),  # a user tool
    ('<tool_call>{"name": "get_customer_by_phone", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ("<tool_call>{oops</tool_call>", "Error in tool call #1"),
])
def test_refused_agent_calls_are_error_observations_and_never_run(completion, why):
    ep = _episode("telecom", "test")
    ep.start()
    before = (ep.env.get_db_hash(), ep.env.get_user_db_hash())
    result = ep.act(completion)
    assert len(result.observations) == 1 and result.observations[0].error
    assert why in result.observations[0].content
    assert (ep.env.get_db_hash(), ep.env.get_user_db_hash()) == before
    assert ep.num_errors == 1 and not ep.done
    assert ep.user_tool_calls_by_agent == (1 if "toggle_airplane_mode" in completion else 0)
    assert ep.unknown_tool_calls == (1 if "unknown tool" in why else 0)


@pytest.mark.parametrize("arguments,why", [
    ({"phone_number": 5}, "Input should be a valid string"),
    ({"phone": "555"}, "unexpected arguments: phone"),
    ({}, "Field required"),
])
def test_wrong_argument_types_are_refused_before_execution(arguments, why):
    ep = _episode("telecom", "test")
    ep.start()
    obs = ep.act(format_tool_call("get_customer_by_phone", arguments)).observations[0]
    assert obs.error and why in obs.content and ep.refused_calls == 1


def test_agent_tool_call_runs_and_tau2_errors_count():
    ep = _episode("airline", "test")
    ep.start()
    ok = ep.act(format_tool_call("get_user_details", {"user_id": "no_such_user"})).observations[0]
    assert ok.error and "not found" in ok.content.lower()
    assert ep.refused_calls == 0 and ep.num_errors == 1


def test_max_errors_ends_the_episode():
    ep = _episode("mock", "base", max_errors=3)
    ep.start()
    for _ in range(3):
        result = ep.act("<tool_call>{bad</tool_call>")
    assert result.done and ep.termination_reason == TerminationReason.TOO_MANY_ERRORS
    assert ep.evaluate().reward == 0.0


def test_max_steps_ends_the_episode():
    ep = _episode("mock", "base", max_steps=4)
    ep.start()  # user's opening = step 1
    result = ep.act("<tool_call>{bad</tool_call>")
    assert not result.done  # steps 2, 3
    result = ep.act("<tool_call>{bad</tool_call>")
    assert result.done and ep.termination_reason == TerminationReason.MAX_STEPS


def test_agent_stop_token_ends_the_episode():
    ep = _episode("mock", "base")
    ep.start()
    result = ep.act("All done. ###STOP###")
    assert result.done and ep.termination_reason == TerminationReason.AGENT_STOP


def test_telecom_user_side_tool_calls_run_on_the_device_and_the_evaluator_sees_them():
    task = load_tasks("telecom", "test")[0]
    ep = Episode("telecom", task, ScriptedUser(task))
    ep.start()
    user_actions = [a for a in gold_actions(task) if a.requestor == "user"]
    assert user_actions, "this task needs user-side actions"
    before = ep.env.get_user_db_hash()
    for action in user_actions:
        words = " ".join(action.name.split("_")[1:])
        assert ep.act(f"Please {words} on your phone.").observations
    assert ep.env.get_user_db_hash() != before
    device_calls = [c for m in ep.messages if m.role == "user" and m.tool_calls for c in m.tool_calls]
    assert [c.name for c in device_calls] == [a.name for a in user_actions]
    assert all(c.requestor == "user" for c in device_calls)
    # the agent never sees the user's device calls
    assert all(m["role"] != "tool" for m in ep.agent_view())
    ep.act("Thank you.")
    assert ep.termination_reason == TerminationReason.USER_STOP
    info = ep.evaluate()
    assert info.reward == 1.0 and all(check.met for check in info.env_assertions)


def test_scripted_user_stops_without_the_device_steps_and_the_task_fails():
    task = load_tasks("telecom", "test")[0]
    ep = Episode("telecom", task, ScriptedUser(task, patience=1))
    ep.start()
    assert ep.act("Have you tried turning it off and on?").observations[0].content.startswith("I'm not sure")
    assert ep.act("Goodbye.").done
    assert ep.evaluate().reward == 0.0


def test_message_history_tasks_start_where_the_history_ends():
    task = get_task("mock", "update_task_with_message_history")
    ep = Episode("mock", task, ScriptedUser(task))
    view = ep.start()
    assert [m["role"] for m in view[:4]] == ["user", "assistant", "tool", "assistant"]
    assert view[-1]["role"] == "user"  # the user answered the history's last assistant message


def test_full_episode_with_policy_text_scores_like_the_oracle():
    task = get_task("mock", "create_task_1")
    ep = Episode("mock", task, ScriptedUser(task))
    ep.start()
    (action,) = gold_actions(task)
    obs = ep.act(render_assistant_text("", [(action.name, action.arguments)])).observations
    assert not obs[0].error
    ep.act(final_message(task))
    assert ep.termination_reason == TerminationReason.USER_STOP
    assert ep.evaluate().reward == 1.0


def test_prompt_holds_the_policy_and_every_tool_in_the_tools_block(qwen3_tokenizer):
    for domain, split in (("airline", "test"), ("retail", "test"), ("telecom", "test")):
        ep = _episode(domain, split)
        text = render(qwen3_tokenizer, [{"role": "system", "content": ep.system_prompt}, *ep.start()], ep.tools,
                      add_generation_prompt=True)
        tools_block = text[text.index("<tools>\n"):text.index("\n</tools>")]
        assert ep.policy in text
        for tool in ep.tools:
            assert f'"name": "{tool["function"]["name"]}"' in tools_block
        assert text.endswith("<|im_start|>assistant\n")
    telecom = _episode("telecom", "test")
    assert "<main_policy>" in telecom.policy and "<tech_support_policy>" in telecom.policy


def test_gym_env_runs_an_episode():
    tasks = load_tasks("mock", "base")
    env = Tau2GymEnv("mock", tasks, lambda task, environment: ScriptedUser(task))
    obs, info = env.reset(seed=0, options={"task_id": "create_task_1"})
    assert "user:" in obs and info["task_id"] == "create_task_1" and info["tools"]
    obs, reward, terminated, truncated, info = env.step(format_tool_call(
        "create_task", {"user_id": "user_1", "title": "Important Meeting"}))
    assert "tool:" in obs and not terminated and reward == 0.0
    obs, reward, terminated, truncated, info = env.step("Done, the task is created.")
    assert terminated and reward == 1.0 and info["termination_reason"] == "user_stop"


def test_an_evaluator_exception_on_the_episodes_outcome_scores_zero_with_the_reason_kept():
    task = get_task("mock", "create_task_1_with_env_assertions")  # asserts on task_2, which the agent never made
    ep = Episode("mock", task, ScriptedUser(task))
    ep.start()
    ep.act("Goodbye.")
    info = ep.evaluate()
    assert info.reward == 0.0 and info.info["evaluation_error"] == "ValueError: Task task_2 not found"
