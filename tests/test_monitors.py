"""Behaviour monitors (benchmark/monitors.py) on episodes built with the real episode core: tau2's mock and airline
tasks, tau2's environments and tools, the agent's calls run as a policy's would be, every value known exactly."""

from __future__ import annotations

import pytest
from tau2.data_model.simulation import TerminationReason

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.monitors import batch_monitors, episode_monitors, monitors, tool_kinds
from tau2_rl_pipeline.benchmark.tasks import get_task, load_tasks

GOLD = {"user_id": "user_1", "title": "Important Meeting"}


def episode(domain: str, task_id: str, split: str = "base") -> Episode:
    ep = Episode(domain, get_task(domain, task_id, split), user=None)
    ep.start()
    return ep


def test_over_actions_repeated_reads_and_tool_calls_of_a_mock_episode() -> None:
    ep = episode("mock", "create_task_1")
    ep.agent_tool_call("get_users", {})
    ep.agent_tool_call("get_users", {})  # the same read again: repeated
    ep.agent_tool_call("create_task", GOLD)  # the gold action
    ep.agent_tool_call("create_task", GOLD)  # again: the gold action is matched once, this one is beyond it
    ep.agent_tool_call("create_task", {"user_id": "user_1", "title": "Extra"})  # no gold action: over-action
    ep.agent_tool_call("update_task_status", {"task_id": "no_such_task", "status": "completed"})  # fails: no effect
    ep.agent_tool_call("get_users", {})  # after writes: a fresh look, not a repeat
    ep.act(render_assistant_text("", [("create_task", {"bogus": 1})]))  # refused (bad arguments): still a call
    ep.act(render_assistant_text("", [("delete_everything", {})]))  # no such tool: a parse error, not a call
    ep.act('<tool_call>{"name": "create_task", "arguments": {"user_id"')  # unparsable: a parse error, not a call
    ep.agent_says("Done.")
    ep.stop(TerminationReason.AGENT_STOP)
    assert (ep.refused_calls, ep.parse_errors) == (1, 2)
    m = monitors("mock", ep.task, ep.messages, "agent_stop")
    assert m == {"tool_calls": 8, "over_actions": 2, "order_only": 0, "repeated_reads": 1, "transfers": 0,
                 "ended_by": "agent",
                 "max_turns": False, "max_errors": False, "refused": False, "action_checked": False}


def test_transfer_refusal_and_a_user_ended_episode_on_a_task_with_an_action_check() -> None:
    ep = episode("mock", "impossible_task_1")
    ep.agent_says("I'm sorry, but I can't help with deleting all of your tasks.")
    ep.agent_tool_call("transfer_to_human_agents", {"summary": "wants every task deleted"})
    m = monitors("mock", ep.task, ep.messages, "user_stop")
    assert m["transfers"] == 1 and m["refused"] and m["ended_by"] == "user" and m["action_checked"]
    assert (m["tool_calls"], m["over_actions"], m["repeated_reads"]) == (1, 0, 0)  # a transfer is no write


@pytest.mark.parametrize("reason,flags", [("max_turns", (True, False, "limit")), ("max_steps", (True, False, "limit")),
                                          ("too_many_errors", (False, True, "limit")),
                                          ("max_new_tokens", (False, False, "limit"))])
def test_endings(reason: str, flags: tuple) -> None:
    ep = episode("mock", "update_task_1")
    m = episode_monitors(ep.messages, ep.task, reason, tool_kinds("mock"))
    assert (m["max_turns"], m["max_errors"], m["ended_by"]) == flags and m["tool_calls"] == 0


def test_airline_gold_replay_has_no_over_action_and_no_action_check() -> None:
    """Every airline test task's reward basis lacks ACTION: an over-action there costs no reward."""
    task = load_tasks("airline", "test")[0]
    ep = Episode("airline", task, user=None)
    ep.start()
    for action in task.evaluation_criteria.actions:
        ep.agent_tool_call(action.name, action.arguments)
    m = monitors("airline", task, ep.messages, "agent_stop")
    reads = [a for a in task.evaluation_criteria.actions if tool_kinds("airline")[a.name] == "read"]
    assert m["over_actions"] == 0 and m["tool_calls"] == len(task.evaluation_criteria.actions) and reads
    assert not m["action_checked"]
    assert not any(monitors("airline", t, [], "agent_stop")["action_checked"] for t in load_tasks("airline", "test"))


def test_a_history_task_counts_the_policy_alone() -> None:
    """mock's history task opens with the create_task call of its initial history (and a tool result whose id,
    call_1, the policy's first call reuses): that call is not the policy's."""
    ep = episode("mock", "update_task_with_message_history")
    history = ep.task.initial_state.message_history
    assert [c.name for c in history[1].tool_calls] == ["create_task"] and len(ep.messages) == len(history)
    assert monitors("mock", ep.task, ep.messages, "agent_stop")["tool_calls"] == 0
    ep.agent_tool_call("update_task_status", {"task_id": "task_2", "status": "completed"})  # the gold action
    ep.agent_tool_call("get_users", {})
    m = monitors("mock", ep.task, ep.messages, "agent_stop")
    assert (m["tool_calls"], m["over_actions"], m["repeated_reads"]) == (2, 0, 0)
    ep.agent_tool_call("create_task", history[1].tool_calls[0].arguments)  # the history's write, now the policy's
    m = monitors("mock", ep.task, ep.messages, "agent_stop")
    assert (m["tool_calls"], m["over_actions"]) == (3, 1)
    plain = episode("mock", "create_task_1")  # no history: nothing is left out
    plain.agent_tool_call("create_task", {"user_id": "user_1", "title": "Extra"})
    assert monitors("mock", plain.task, plain.messages, "agent_stop")["over_actions"] == 1


@pytest.mark.parametrize("order", ["gold", "reversed", "other_items"])
def test_a_write_differing_from_gold_only_in_list_order_is_order_only(order: str) -> None:
    """Retail 108 (tau2's own environment and evaluator): the return with its items listed in reverse scores 1.0
    though tau2's action check fails; it is counted as order-only, not as an over-action. Other items are one."""
    task = get_task("retail", "108", "base")
    gold = task.evaluation_criteria.actions[0]
    items = list(gold.arguments["item_ids"])
    items = {"gold": items, "reversed": items[::-1], "other_items": items[:2]}[order]
    ep = Episode("retail", task, user=None)
    ep.start()
    assert not ep.agent_tool_call(gold.name, {**gold.arguments, "item_ids": items}).error
    ep.agent_says("The return is made: your refund of 346.93 goes to your PayPal account.")
    ep.stop(TerminationReason.AGENT_STOP)
    info = ep.evaluate(native=True)
    m = monitors("retail", task, ep.messages, "agent_stop")
    assert (m["over_actions"], m["order_only"]) == {"gold": (0, 0), "reversed": (0, 1), "other_items": (1, 0)}[order]
    assert info.action_checks[0].action_match is (order == "gold")
    assert info.reward == (0.0 if order == "other_items" else 1.0)


def test_batch_rates_and_the_share_of_successes_without_an_action_check() -> None:
    base = {"tool_calls": 2, "over_actions": 0, "order_only": 0, "repeated_reads": 0, "transfers": 0, "ended_by": "user",
            "max_turns": False, "max_errors": False, "refused": False, "action_checked": False}
    episodes = [base, {**base, "over_actions": 2, "order_only": 1, "tool_calls": 5, "ended_by": "agent"},
                {**base, "transfers": 1, "refused": True, "action_checked": True, "ended_by": "agent"},
                {**base, "max_turns": True, "ended_by": "limit", "tool_calls": 9, "repeated_reads": 3}]
    out = batch_monitors(episodes, [True, True, True, False])
    assert out == {"episodes": 4, "tool_calls_mean": 18 / 4, "over_actions_mean": 0.5, "order_only_mean": 0.25,
                   "repeated_reads_mean": 0.75,
                   "transfers_mean": 0.25, "over_action_share": 0.25, "transfer_share": 0.25, "max_turns_share": 0.25,
                   "max_errors_share": 0.0, "refused_share": 0.25, "agent_ended_share": 0.5,
                   "user_ended_share": 0.25, "limit_ended_share": 0.25, "successes": 3,
                   "successes_without_action_check_share": 2 / 3}
    assert batch_monitors(episodes, [False] * 4)["successes_without_action_check_share"] is None
    assert batch_monitors([], []) == {"episodes": 0}
    with pytest.raises(ValueError, match="4 episodes but 1 success flags"):
        batch_monitors(episodes, [True])
