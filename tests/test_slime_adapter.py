"""The slime adapter against slime's documented contracts, with a loopback SGLang look-alike as router and as the
user simulator's OpenAI-compatible server (reached through litellm, as at scale)."""

import argparse
import asyncio
import dataclasses
import gc
import json

import pytest
from tau2.data_model.simulation import RewardInfo

from slime_sample import SLIME_SAMPLE_FIELDS, Sample, check_like_slime
from tau2_rl_pipeline import slime_adapter
from tau2_rl_pipeline.actions import render_assistant_text
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.oracle import gold_actions, last_write_index, replay_gold_actions
from tau2_rl_pipeline.rollout import ABORTED, COMPLETED, TRUNCATED, Trajectory
from tau2_rl_pipeline.tasks import get_task, load_tasks


def test_stand_in_has_exactly_slimes_sample_fields():
    assert [f.name for f in dataclasses.fields(Sample)] == SLIME_SAMPLE_FIELDS
    assert [m.name for m in Sample.Status] == ["PENDING", "COMPLETED", "TRUNCATED", "ABORTED", "FAILED"]


@pytest.fixture
def env_for_adapter(monkeypatch, loopback, tmp_path):
    monkeypatch.setenv("TAU2_USER_MODEL", "openai/tiny")
    monkeypatch.setenv("TAU2_USER_API_BASE", loopback.base_url + "/v1")
    monkeypatch.setenv("TAU2_MAX_TURNS", "2")
    monkeypatch.setenv("TAU2_CURRICULUM_STATE_PATH", str(tmp_path / "curriculum.json"))
    for cached in (slime_adapter._config, slime_adapter._user_factory, slime_adapter._engine):
        cached.cache_clear()
    yield
    for cached in (slime_adapter._config, slime_adapter._user_factory, slime_adapter._engine):
        cached.cache_clear()
    slime_adapter._trackers.clear()
    gc.unfreeze()  # the adapter's first episode freezes the heap: give it back to the collector


def _args(loopback, tiny_small_dir, **kw):
    host, port = loopback.base_url.removeprefix("http://").split(":")
    return argparse.Namespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=str(tiny_small_dir),
                              sglang_server_concurrency=8, rollout_max_context_len=None, n_samples_per_prompt=2,
                              grpo_std_normalization=True, save=None, **kw)


def _sampling(tokenizer, max_new_tokens=16):
    # what slime's sglang rollout builds from its --rollout-* flags
    return {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": max_new_tokens, "stop": None,
            "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
            "spaces_between_special_tokens": False}


def test_generate_runs_a_real_episode_with_an_llm_user_through_litellm(env_for_adapter, loopback, tiny_small_dir,
                                                                       small_tokenizer):
    task = get_task("mock", "create_task_1")
    (action,) = gold_actions(task)
    eos = small_tokenizer.eos_token
    loopback.script(small_tokenizer.encode(render_assistant_text("", [(action.name, action.arguments)]) + eos,
                                           add_special_tokens=False))
    sample = Sample(prompt="tau2 mock task create_task_1", index=0,
                    metadata={"domain": "mock", "split": "base", "task_id": "create_task_1", "task_index": 0})
    gc.unfreeze()
    out = asyncio.run(slime_adapter.generate(_args(loopback, tiny_small_dir), sample, _sampling(small_tokenizer),
                                             evaluation=False))
    assert gc.get_freeze_count() > 0  # what was loaded before the first episode is out of the GC's full passes
    check_like_slime([out])
    assert out.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    assert out.metadata["task_id"] == "create_task_1" and out.metadata["turns"] >= 1
    chat_calls = [body for path, body in loopback.requests if path == "/v1/chat/completions"]
    assert chat_calls, "the user simulator never reached the loopback server"
    assert chat_calls[0]["model"] == "tiny"  # litellm's openai/ route strips the provider prefix
    assert any(m["role"] == "system" for m in chat_calls[0]["messages"])  # tau2's user-simulator prompt
    generate_calls = [body for path, body in loopback.requests if path == "/generate"]
    assert generate_calls[0]["input_ids"] == out.tokens[: len(generate_calls[0]["input_ids"])]
    assert small_tokenizer.eos_token_id in generate_calls[0]["sampling_params"]["stop_token_ids"]
    json.dumps(out.metadata)  # metadata must be serializable (slime logs and ships it)


def _trajectory(status, reward_info=None, reward=0.0, domain="airline", task_id="0", response=(5, 6, 7)):
    if reward_info is None and status != ABORTED:
        reward_info = RewardInfo(reward=reward)
    return Trajectory(domain=domain, task_id=task_id, prompt_ids=[1, 2, 3], response_ids=list(response),
                      loss_mask=[1] * len(response), rollout_logprobs=[-0.5] * len(response), chat=[], tools=[],
                      messages=[], reward_info=reward_info, termination_reason="user_stop", status=status, turns=1,
                      error="boom" if status == ABORTED else None)


@pytest.mark.parametrize("status,expected", [(COMPLETED, "COMPLETED"), (TRUNCATED, "TRUNCATED"), (ABORTED, "ABORTED")])
def test_fill_sample_maps_status_and_keeps_lengths(status, expected, small_tokenizer):
    cfg = Tau2Config.from_env({})
    sample = slime_adapter.fill_sample(Sample(metadata={"domain": "airline", "task_id": "0"}),
                                       _trajectory(status, reward=1.0 if status == COMPLETED else 0.0), cfg,
                                       small_tokenizer)
    check_like_slime([sample])
    assert sample.status == Sample.Status[expected]
    assert sample.remove_sample == (status == ABORTED)
    assert sample.metadata["raw_reward"] == (1.0 if status == COMPLETED else 0.0)
    if status == ABORTED:
        assert sample.reward == 0.0 and sample.metadata["error"] == "boom"


def test_fill_sample_of_an_episode_aborted_before_any_turn_is_still_trainable(small_tokenizer):
    sample = slime_adapter.fill_sample(Sample(prompt="tau2 airline task 0"), _trajectory(ABORTED, response=()),
                                       Tau2Config.from_env({}), small_tokenizer)
    check_like_slime([sample])
    assert sample.loss_mask == [0] and sample.remove_sample


def test_shaped_reward_lands_in_sample_reward_and_task_reward_in_metadata(small_tokenizer):
    task = next(t for t in load_tasks("retail", "test") if last_write_index("retail", t))
    last = last_write_index("retail", task)
    info = replay_gold_actions("retail", task, keep=lambda i, a: i != last)  # fails, with partial credit
    cfg = Tau2Config.from_env({})
    sample = slime_adapter.fill_sample(Sample(), _trajectory(COMPLETED, info, domain="retail"), cfg, small_tokenizer)
    assert sample.metadata["raw_reward"] == info.reward == 0.0
    assert sample.reward == pytest.approx(cfg.reward_alpha * cfg.alpha_mult_retail * sample.metadata["partial_score"])
    assert 0.0 < sample.metadata["partial_score"] < 1.0
    off = dataclasses.replace(cfg, use_partial_credit=False)
    assert slime_adapter.fill_sample(Sample(), _trajectory(COMPLETED, info, domain="retail"), off,
                                     small_tokenizer).reward == 0.0


def test_format_penalty_lowers_the_reward_and_is_recorded_beside_the_partial_score(small_tokenizer):
    traj = dataclasses.replace(_trajectory(COMPLETED, reward=1.0, domain="mock"), parse_errors=2, refused_calls=1)
    off = slime_adapter.fill_sample(Sample(), traj, Tau2Config.from_env({}), small_tokenizer)
    assert off.reward == pytest.approx(1.0) and off.metadata["format_penalty"] == 0.0
    assert off.metadata["format_errors"] == 3
    on = Tau2Config.from_env({"TAU2_FORMAT_PENALTY": "0.1", "TAU2_FORMAT_PENALTY_MAX": "0.25"})
    sample = slime_adapter.fill_sample(Sample(), traj, on, small_tokenizer)
    assert sample.reward == pytest.approx(1.0 - 0.25) and sample.metadata["format_penalty"] == pytest.approx(0.25)
    assert sample.metadata["raw_reward"] == 1.0  # success stays tau2's rule on the task reward


def test_reward_post_process_normalizes_groups_and_persists_the_curriculum(env_for_adapter, loopback,
                                                                          tiny_small_dir, tmp_path):
    def sample(task_id, reward, status=Sample.Status.COMPLETED):
        return Sample(reward=reward, status=status,
                      metadata={"domain": "airline", "task_id": task_id, "raw_reward": reward})

    samples = [sample("a", 1.0), sample("a", 0.0), sample("b", 0.0), sample("b", 0.0, Sample.Status.ABORTED)]
    raw, adv = slime_adapter.reward_post_process(_args(loopback, tiny_small_dir), samples)
    assert raw == [1.0, 0.0, 0.0, 0.0]
    assert adv[0] > 0 > adv[1] and adv[0] == pytest.approx(-adv[1])
    assert adv[2] == 0.0 and adv[3] == 0.0
    state = json.loads((tmp_path / "curriculum.json").read_text())
    assert {k: v["attempts"] for k, v in state["tasks"].items()} == {"airline/a": 2, "airline/b": 1}
    # a second process (a resumed run) continues the counts from the file
    slime_adapter._trackers.clear()
    slime_adapter.reward_post_process(_args(loopback, tiny_small_dir), [sample("a", 1.0), sample("a", 1.0)])
    assert json.loads((tmp_path / "curriculum.json").read_text())["tasks"]["airline/a"]["attempts"] == 4


def test_dynamic_filter_drops_groups_without_signal():
    def s(r, status=Sample.Status.COMPLETED):
        return Sample(reward=r, status=status)

    assert slime_adapter.filter_zero_std_groups(None, [s(1.0), s(0.0)])
    assert not slime_adapter.filter_zero_std_groups(None, [s(0.0), s(0.0)])
    assert not slime_adapter.filter_zero_std_groups(None, [s(0.0), s(1.0, Sample.Status.ABORTED)])


def test_sampling_params_from_slime_always_stop_at_end_of_turn(small_tokenizer):
    params = slime_adapter.sampling_from_slime({"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64,
                                                "stop_token_ids": [3], "sampling_seed": 11}, small_tokenizer)
    assert params.temperature == 0.7 and params.top_k == 20 and params.seed == 11
    assert set(params.stop_token_ids) == {3, small_tokenizer.eos_token_id}
