"""Token bookkeeping shortcuts give exactly the ids of rendering and tokenizing the whole text (real Qwen3
tokenizer, real tau2 episodes)."""

import gc
import struct

import pytest

from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.prompting import render
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser
from tau2_rl_pipeline.rollout.tokens import ObservationTemplate, TokenBuffer, TopPSpans


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


def _list_books(prompt, turns):
    """The books as the list-based TokenBuffer kept them before they moved to arrays: the reference."""
    ids, mask, logprobs, top_ids, offsets = list(prompt), [], [], [], [0]
    for kind, turn_ids, turn_logprobs, spans in turns:
        ids += turn_ids
        mask += [1 if kind == "policy" else 0] * len(turn_ids)
        logprobs += turn_logprobs if kind == "policy" else [0.0] * len(turn_ids)
        if kind == "policy":
            top_ids += spans.ids
            offsets += [offsets[-1] + o for o in spans.offsets[1:]]
        else:
            offsets += [offsets[-1]] * len(turn_ids)
    return ids[len(prompt):], mask, logprobs, top_ids, offsets


def test_token_books_are_untracked_tuples_handed_out_as_the_same_lists():
    """The books are tuples the GC stops tracking at the first young pass (a list of N ids is N references every pass
    walks: P5) and come out as the lists they were:
    ids as ints (Qwen3's largest id too), log-probs bit for bit, top-p spans in slime's layout."""
    prompt = [151644, 8948, 198, 2610, 525]
    sampled = [9707, 11, 1879, 0, 151668, 151645]
    logprobs = [-0.1, -1e-300, -2.220446049250313e-16, 0.0, -123.456789012345678, -5e-324]
    spans = TopPSpans(ids=[9707, 1, 11, 1879, 0, 151668, 151645], offsets=[0, 2, 3, 4, 5, 6, 7])
    observation = [151644, 872, 198, 13048, 151645, 198]
    buf = TokenBuffer(prompt)
    buf.add_policy(sampled, logprobs, spans)
    buf.add_observation(observation)
    buf.add_policy(sampled[:2], logprobs[:2], TopPSpans(ids=[9707, 11], offsets=[0, 1, 2]))
    gc.collect(0)
    for book in (buf.prompt_ids, buf.response_ids, buf.loss_mask, buf.logprobs, buf.top_p_ids, buf.top_p_offsets):
        assert not gc.is_tracked(book)
    prompt_ids, response_ids, loss_mask, out_logprobs, top_p = buf.lists()
    turns = [("policy", sampled, logprobs, spans), ("observation", observation, None, None),
             ("policy", sampled[:2], logprobs[:2], TopPSpans(ids=[9707, 11], offsets=[0, 1, 2]))]
    want_ids, want_mask, want_logprobs, want_top_ids, want_offsets = _list_books(prompt, turns)
    assert (prompt_ids, response_ids, loss_mask) == (prompt, want_ids, want_mask)
    assert [struct.pack("<d", x) for x in out_logprobs] == [struct.pack("<d", x) for x in want_logprobs]
    assert (top_p.ids, top_p.offsets) == (want_top_ids, want_offsets)
    assert {type(x) for x in prompt_ids + response_ids + loss_mask} == {int}
    assert {type(x) for x in out_logprobs} == {float}
    assert all(type(book) is list for book in (prompt_ids, response_ids, loss_mask, out_logprobs, top_p.ids))
    assert buf.all_ids() == prompt + want_ids and type(buf.all_ids()) is list
    assert len(buf) == len(prompt) + len(want_ids)
    assert buf.policy_ids() == sampled + sampled[:2]


def test_token_books_refuse_what_they_refused_as_lists():
    buf = TokenBuffer([1, 2])
    with pytest.raises(ValueError, match="2 sampled ids but 1 log-probs"):
        buf.add_policy([3, 4], [-0.5])
    buf.add_policy([3], [-0.5])
    with pytest.raises(ValueError, match="top-p spans began after the first policy turn"):
        buf.add_policy([4], [-0.5], TopPSpans(ids=[4], offsets=[0, 1]))
    assert TokenBuffer().lists() == ([], [], [], [], None)
