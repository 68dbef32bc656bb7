"""User-side monitors (tau2_rl_pipeline/benchmark/user_monitors.py) and the scenario split they read
(benchmark/scenario.py), as pure functions over tau2 messages and a scenario; tau2's own tasks for the facts."""

from __future__ import annotations

import pytest
from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage

from tau2_rl_pipeline.benchmark.scenario import Fact, Scenario, probe_question, split_scenario, states
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.user_monitors import (
    USER_CAUSES,
    USER_ECHOED,
    USER_EMPTY,
    USER_LEAKED,
    USER_LOOPED,
    USER_NEVER_ENDED,
    USER_OTHER_LANGUAGE,
    USER_STOPPED_AT_ONCE,
    USER_WRONG_FACTS,
    batch_user_monitors,
    identifiers,
    leakage,
    other_language,
    user_causes,
    user_monitors,
)

HIDDEN = ("If the agent asks how many passengers were in that reservation, say that there are three, which is wrong "
          "on purpose to test the agent.")
SCENARIO = Scenario(text="Reason: cancel reservation ABC123. Known: your user id is mia_li_3668. " + HIDDEN,
                    request="cancel reservation ABC123", known="your user id is mia_li_3668", hidden=(HIDDEN,))
GREETING = "Hi! How can I help you today?"


def agent(text: str) -> AssistantMessage:
    return AssistantMessage(role="assistant", content=text)


def user(text: str | None) -> UserMessage:
    return UserMessage(role="user", content=text)


def good_episode() -> list:
    call = ToolCall(id="c1", name="cancel_reservation", arguments={"reservation_id": "ABC123"}, requestor="assistant")
    return [agent(GREETING), user("I need to cancel reservation ABC123, my user id is mia_li_3668."),
            AssistantMessage(role="assistant", content=None, tool_calls=[call]),
            ToolMessage(id="c1", role="tool", content='{"reservation_id": "ABC123", "refund_id": "R77421"}'),
            agent("Done: your reservation ABC123 is cancelled, refund R77421."), user("Thanks, bye! ###STOP###")]


def test_a_well_behaved_user_has_no_cause_and_its_turns_and_length_are_counted() -> None:
    got = user_monitors(good_episode(), SCENARIO, "user_stop")
    assert user_causes(got) == []
    assert got["user_turns"] == 2 and got["empty_replies"] == 0 and got["echoes"] == 0
    said = ("I need to cancel reservation ABC123, my user id is mia_li_3668.", "Thanks, bye!")
    assert got["user_mean_chars"] == pytest.approx(sum(map(len, said)) / 2)
    assert got["invented_facts"] == []  # R77421 came from the conversation, ABC123 from the scenario


@pytest.mark.parametrize("messages,reason,cause", [
    ([agent(GREETING), user(""), agent("Could you tell me your reservation number please?"), user("   ")],
     "agent_stop", USER_EMPTY),
    ([agent(GREETING), user("I need to cancel ABC123."), agent("Which user id is it, please?"), user(".")],
     "agent_stop", USER_EMPTY),
    ([agent(GREETING), user("Hi! How can I help you today?")], "agent_stop", USER_ECHOED),
    ([agent(GREETING), user("My instructions: " + HIDDEN)], "agent_stop", USER_LEAKED),
    ([agent(GREETING), user("Hola, necesito cancelar mi reserva ABC123, por favor.")], "agent_stop",
     USER_OTHER_LANGUAGE),
    ([agent(GREETING), user("Je voudrais annuler la réservation ABC123 s'il vous plaît.")], "agent_stop",
     USER_OTHER_LANGUAGE),
    ([agent(GREETING), user("请帮我取消预订 ABC123，谢谢你们的帮助")], "agent_stop", USER_OTHER_LANGUAGE),
    ([agent(GREETING), user("Cancel reservation ABC124 for user mia_li_3669.")], "agent_stop", USER_WRONG_FACTS),
    ([agent(GREETING), user("###STOP###")], "user_stop", USER_STOPPED_AT_ONCE),
    ([agent(GREETING), user("###TRANSFER###")], "user_stop", USER_STOPPED_AT_ONCE),  # an immediate transfer
    ([agent(GREETING), user("Hello there, I hope you are having a lovely day!"), agent("You too! What can I do?"),
      user("Oh, it was nice talking to you. Bye! ###STOP###")], "user_stop", USER_STOPPED_AT_ONCE),  # talk, no request
    ([agent(GREETING), user("Hi, my name is Morgan Avery and I need to cancel ABC123.")], "agent_stop",
     USER_WRONG_FACTS),  # a name of its own accord that the scenario does not hold
    ([agent("Could you tell me the reservation you would like to cancel, please?"),
      user("Could I tell you that reservation I would like to cancel, kindly?")], "agent_stop", USER_ECHOED),
    ([agent(GREETING)] + [m for _ in range(4) for m in (user("I want to cancel ABC123, can you help?"),
                                                         agent("Sure, what is your user id?"))], "agent_stop",
     USER_LOOPED),
    ([agent(GREETING), user("I want to cancel ABC123."), agent("Sure, anything else?"), user("Yes, more.")],
     "max_steps", USER_NEVER_ENDED),
])
def test_each_misbehaviour_is_named(messages, reason, cause) -> None:
    assert user_causes(user_monitors(messages, SCENARIO, reason)) == [cause]


def test_what_is_not_a_misbehaviour() -> None:
    """A bare stop is an ending; a short yes is a reply; a short agent line copied is no echo; a date's ordinal or
    a time is no identifier; a stop after the request; the agent's own limit with a user who stopped."""
    messages = [agent(GREETING), user("Cancel ABC123 please, it was on the 26th at 3pm."), agent("Ok?"), user("Ok?"),
                agent("Shall I go on with the cancellation now?"), user("Yes."), user("###STOP###")]
    got = user_monitors(messages, SCENARIO, "user_stop")
    assert user_causes(got) == [] and got["user_turns"] == 4
    assert identifiers("on the 26th at 3pm, flight HAT271, order #W2378156, call 555-123-2002") == \
        ["HAT271", "#W2378156", "555-123-2002"]
    assert not other_language("I'd like to book a flight to Madrid and Paris please, with my wife Lucía.")


def test_what_is_not_a_misbehaviour_either() -> None:
    """A confirmation close to the agent's question says yes; the scripted user's "I did that. What next?" after each
    device step is no loop (its own tool calls come between); the scenario's own name (through the user id) is no
    invented fact; the request stated in other words; a name one letter off the scenario's is."""
    call = ToolCall(id="u1", name="toggle_airplane_mode", arguments={}, requestor="user")
    step = UserMessage(role="user", content=None, tool_calls=[call])
    messages = [agent(GREETING), user("Hi, I'm Mia Li. I'd like to cancel my reservation ABC123."),
                agent("Shall I go ahead with the cancellation?"), user("Yes, please go ahead with the cancellation."),
                *[m for _ in range(4) for m in (agent("Please toggle airplane mode now."), step,
                                                ToolMessage(id="u1", role="tool", content="ok", requestor="user"),
                                                user("I did that. What next?"))], user("###STOP###")]
    got = user_monitors(messages, SCENARIO, "user_stop")
    assert user_causes(got) == [] and got["looped"] == 1 and got["echoes"] == 0
    named = Scenario(text="Cancel ABC123. Your user id is sophia_silva_7557.", request="cancel ABC123")
    assert user_monitors([agent(GREETING), user("Sophia Silva here, cancel ABC123.")], named, "agent_stop")[
        "invented_facts"] == []
    assert user_monitors([agent(GREETING), user("Please cancel ABC123 for Sophia Silvb.")], named, "agent_stop")[
        "invented_facts"] == ["Silvb"]


def test_leakage_of_a_short_hidden_text() -> None:
    """A persona shorter than the 6-word runs (tau2's can be a few words) is one run of its own length."""
    shy = Scenario(text="You are shy, rigid. Cancel ABC123.", request="cancel ABC123", hidden=("You are shy, rigid.",))
    recital = user_monitors([agent(GREETING), user("You are shy, rigid. Cancel ABC123.")], shy, "agent_stop")
    assert recital["leakage"] == 1.0 and user_causes(recital) == [USER_LEAKED]
    said = user_monitors([agent(GREETING), user("I am a bit shy. Cancel ABC123.")], shy, "agent_stop")
    assert said["leakage"] == 0.0 and leakage(["be nice"], ["Be nice."]) == 0.0  # 2 words: said in passing


def test_leakage_is_the_largest_share_of_a_hidden_text_repeated() -> None:
    half = " ".join(HIDDEN.split()[:12])
    assert leakage([HIDDEN], [HIDDEN, "x " * 20]) == 1.0
    assert 0.2 < leakage([half], [HIDDEN]) < 0.5 and leakage([], [HIDDEN]) == 0.0


def test_batch_rates() -> None:
    clean = user_monitors(good_episode(), SCENARIO, "user_stop")
    empty = user_monitors([agent(GREETING), user("")], SCENARIO, "max_steps")
    got = batch_user_monitors([clean, empty])
    assert got["user_flagged_share"] == 0.5 and got["user_empty_share"] == 0.5 and got["user_never_ended_share"] == 0.5
    assert got["user_echo_share"] == 0.0 and got["user_turns_mean"] == 1.5
    assert len([k for k in got if k.endswith("_share")]) == len(USER_CAUSES) + 1
    assert batch_user_monitors([]) == {"episodes": 0}


def test_the_facts_a_probe_asks_for_are_the_gold_values_the_scenario_states() -> None:
    """airline 8: the user id, the origin and destination, the trip type, the cabin and both passengers' names are in
    the scenario (the user's own name through its user id);
    the flight number, the payment id and the dates as the gold writes them are not (the agent finds them)."""
    task = next(t for t in load_tasks("airline", "test") if t.id == "8")
    scenario = split_scenario(task)
    values = [f.value for f in scenario.facts]
    assert values == ["sophia_silva_7557", "ORD", "PHL", "one_way", "economy", "Sophia", "Silva", "Kevin", "Smith",
                      "2001-04-12"]
    assert "HAT271" not in values and "certificate_8045380" not in values and "2024-05-26" not in values
    assert scenario.facts[7] == Fact("book_reservation", "passenger 2 first name", "Kevin")
    assert probe_question(scenario.facts[7]) == "For book reservation, what is the passenger 2 first name?"
    assert any("Kevin Smith" in h for h in scenario.hidden) and "Sophia Silva" in scenario.known
    assert states("My user ID is Sophia_Silva_7557.", "sophia_silva_7557") and not states("sophia_silva_75570", "sophia_silva_7557")


def test_one_question_asks_for_one_value() -> None:
    """retail 39 looks the user up by two zips, the new one first: two questions, each with its own value."""
    task = next(t for t in load_tasks("retail", "test") if t.id == "39")
    zips = [(f.label, f.value) for f in split_scenario(task).facts if f.label.endswith("zip")]
    assert zips == [("zip", "85033"), ("other zip", "32169")]
    assert len({probe_question(f) for f in split_scenario(task).facts}) == len(split_scenario(task).facts)
