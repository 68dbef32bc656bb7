"""Token bookkeeping shortcuts give exactly the ids of rendering and tokenizing the whole text (real Qwen3
tokenizer, real tau2 episodes)."""

import pytest

from tau2_rl_pipeline.env import Episode
from tau2_rl_pipeline.prompting import render
from tau2_rl_pipeline.tasks import load_tasks
from tau2_rl_pipeline.tokens import ObservationTemplate
from tau2_rl_pipeline.users import ScriptedUser


def _first_chat(domain, task):
    episode = Episode(domain, task, ScriptedUser(task), fast=True)
    return [{"role": "system", "content": episode.system_prompt}, *episode.start()], episode.tools


def _whole(tokenizer, chat, tools):
    return tokenizer.encode(render(tokenizer, chat, tools, add_generation_prompt=True), add_special_tokens=False)


@pytest.mark.parametrize("encoder", ["rust", "transformers"])
@pytest.mark.parametrize("domain", ["airline", "retail", "telecom", "mock"])
def test_first_prompts_with_a_cached_system_turn_equal_whole_tokenization(qwen3_tokenizer, domain, encoder):
    template = ObservationTemplate(qwen3_tokenizer)
    assert template._backend is not None
    if encoder == "transformers":  # what a tokenizer without a Rust backend goes through
        template._backend = None
    tasks = [t for t in load_tasks(domain, "base" if domain == "mock" else "test")
             if not (t.initial_state and t.initial_state.message_history)][:4]
    prompts = [_first_chat(domain, t) for t in tasks]
    if domain != "telecom":  # telecom's users all open with the same words
        assert len({str(chat[1:]) for chat, _ in prompts}) > 1  # different conversations behind one system turn
    for chat, tools in prompts:
        assert template.first_prompt_ids(chat, tools) == _whole(qwen3_tokenizer, chat, tools)
    (head,) = template._system_turns.values()  # one system turn for the domain, kept as ids
    assert head is not None and head == tuple(_whole(qwen3_tokenizer, prompts[0][0][:1], prompts[0][1])[:len(head)])


def test_a_changed_system_prompt_or_tool_set_is_a_new_system_turn(qwen3_tokenizer):
    template = ObservationTemplate(qwen3_tokenizer)
    chat, tools = _first_chat("mock", load_tasks("mock", "base")[0])
    other_system = [{"role": "system", "content": chat[0]["content"] + " Be brief."}, *chat[1:]]
    for c, t in [(chat, tools), (other_system, tools), (chat, tools[:1]), (chat, tools)]:
        assert template.first_prompt_ids(c, t) == _whole(qwen3_tokenizer, c, t)
    assert len(template._system_turns) == 3


def test_a_template_the_shortcut_does_not_fit_renders_whole_prompts(qwen3_tokenizer):
    """A template that marks each turn with the number of tools renders the conversation differently after the
    tool-less anchor turn: the first prompt's check sees it and every prompt is rendered whole."""
    template = ObservationTemplate(qwen3_tokenizer)
    chat, tools = _first_chat("mock", load_tasks("mock", "base")[0])
    original = qwen3_tokenizer.chat_template
    qwen3_tokenizer.chat_template = original.replace("<|im_start|>' + message.role",
                                                     "<|im_start|>' + (tools|length if tools else 0)|string + message.role")
    try:
        assert qwen3_tokenizer.chat_template != original
        for _ in range(2):
            assert template.first_prompt_ids(chat, tools) == _whole(qwen3_tokenizer, chat, tools)
        assert list(template._system_turns.values()) == [None]
    finally:
        qwen3_tokenizer.chat_template = original


@pytest.mark.parametrize("encoder", ["rust", "transformers"])
def test_an_observation_with_a_lone_surrogate_is_tokenized_as_the_replacement_character(qwen3_tokenizer, encoder):
    """Text from outside the policy (a user simulator's JSON reply, a tool result) can hold a lone surrogate that
    no tokenizer accepts; the policy sees U+FFFD in its place instead of the episode failing."""
    template = ObservationTemplate(qwen3_tokenizer)
    if encoder == "transformers":
        template._backend = None
    observation = [{"role": "tool", "content": '{"user_id": "\ud800x\udfff"}'}]
    clean = [{"role": "tool", "content": '{"user_id": "\ufffdx\ufffd"}'}]
    assert template.delta_ids(observation) == template.delta_ids(clean)
    chat, tools = _first_chat("mock", load_tasks("mock", "base")[0])
    chat[-1] = {**chat[-1], "content": chat[-1]["content"] + "\udc00"}
    assert template.first_prompt_ids(chat, tools)[-8:] == template.first_prompt_ids(
        [*chat[:-1], {**chat[-1], "content": chat[-1]["content"][:-1] + "\ufffd"}], tools)[-8:]
