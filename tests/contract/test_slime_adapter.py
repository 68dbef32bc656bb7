"""The slime adapter's pieces on slime's real `Sample` (slime/utils/types.py at 624b824): what fill_sample writes,
the reward post-process and the curriculum, the dynamic filter, sampling params. The adapter driven by slime's own
rollout code is in test_slime_rollout.py."""

import argparse
import dataclasses
import json

import contract_tier  # noqa: F401  (slime on sys.path)
import pytest
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.sample_hooks import set_current_rollout_id
from slime.utils.types import Sample
from tau2.data_model.simulation import RewardInfo

from tau2_rl_pipeline.benchmark.oracle import last_write_index, replay_gold_actions
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, COMPLETED, TRUNCATED, Trajectory
from tau2_rl_pipeline.rollout.tokens import TopPSpans
from tau2_rl_pipeline.slime_plugins import adapter as slime_adapter
from tau2_rl_pipeline.slime_plugins import batch


def check_like_slime(samples):
    """slime's own checks of a returned sample's books (Sample._validate_response_metadata_lengths)."""
    for s in samples:
        assert isinstance(s.status, Sample.Status) and s.reward is not None
        assert s.tokens and 0 < s.response_length < len(s.tokens)
        s._validate_response_metadata_lengths()


@pytest.fixture
def env_for_adapter(monkeypatch, tmp_path):
    monkeypatch.setenv("TAU2_CURRICULUM_STATE_PATH", str(tmp_path / "curriculum.json"))
    slime_adapter._config.cache_clear()
    yield
    set_current_rollout_id(None)
    slime_adapter._config.cache_clear()
    slime_adapter._trackers.clear()


def _args(**kw):
    return argparse.Namespace(n_samples_per_prompt=2, grpo_std_normalization=True, save=None, **kw)


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
    if status == ABORTED:  # its books say it trains nothing (was the trajectory's mask of 1s)
        assert sample.reward == 0.0 and sample.metadata["error"] == "boom" and sample.loss_mask == [0, 0, 0]
    else:
        assert sample.loss_mask == [1, 1, 1]


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


def test_reward_post_process_normalizes_groups_and_persists_the_curriculum(env_for_adapter, tmp_path):
    def sample(task_id, reward, status=Sample.Status.COMPLETED):
        return Sample(reward=reward, status=status,
                      metadata={"domain": "airline", "task_id": task_id, "raw_reward": reward})

    samples = [sample("a", 1.0), sample("a", 0.0), sample("b", 0.0), sample("b", 0.0, Sample.Status.ABORTED)]
    set_current_rollout_id(0)  # what slime's RolloutManager.generate(0) does first
    raw, adv = slime_adapter.reward_post_process(_args(), samples)
    assert raw == [1.0, 0.0, 0.0, 0.0]
    assert adv[0] > 0 > adv[1] and adv[0] == pytest.approx(-adv[1])
    assert adv[2] == 0.0 and adv[3] == 0.0
    state = json.loads((tmp_path / "curriculum.json").read_text())
    assert {k: v["attempts"] for k, v in state["tasks"].items()} == {"airline/a": 2, "airline/b": 1}
    assert (state["rollout"], [r["rollout"] for r in state["recent"]]) == (0, [0])
    # a second process (a run resumed at rollout 1: checkpoint 0) continues the counts from the file
    slime_adapter._trackers.clear()
    set_current_rollout_id(1)
    slime_adapter.reward_post_process(_args(), [sample("a", 1.0), sample("a", 1.0)])
    assert json.loads((tmp_path / "curriculum.json").read_text())["tasks"]["airline/a"]["attempts"] == 4


def test_dynamic_filter_drops_all_aborted_groups_always_and_groups_without_signal_when_asked(monkeypatch):
    def s(r, status=Sample.Status.COMPLETED):
        return Sample(reward=r, status=status)

    aborted = [s(0.0, Sample.Status.ABORTED), s(1.0, Sample.Status.ABORTED)]
    monkeypatch.setenv("TAU2_FILTER_KEEP_WHEN_INSUFFICIENT", "1")
    for zero_std in ("0", "1"):  # whatever the filter settings: never kept, not even when slime runs short
        monkeypatch.setenv("TAU2_FILTER_ZERO_STD", zero_std)
        assert batch.filter_groups(None, aborted) == DynamicFilterOutput(False, "all_aborted")
        assert batch.filter_groups(None, [s(1.0), s(0.0, Sample.Status.ABORTED)]).reason != "all_aborted"
    monkeypatch.setenv("TAU2_FILTER_ZERO_STD", "0")
    assert batch.filter_groups(None, [s(0.0), s(0.0)]) == DynamicFilterOutput(keep=True)
    monkeypatch.setenv("TAU2_FILTER_ZERO_STD", "1")
    assert batch.filter_groups(None, [s(1.0), s(0.0)]) == DynamicFilterOutput(keep=True)
    assert batch.filter_groups(None, [s(0.0), s(0.0)]) == DynamicFilterOutput(False, "zero_std", True)
    monkeypatch.setenv("TAU2_FILTER_KEEP_WHEN_INSUFFICIENT", "0")
    assert not batch.filter_groups(None, [s(0.0), s(0.0)]).keep_when_insufficient


def test_an_aborted_samples_logged_raw_reward_leaves_the_scored_mean_alone():
    def s(r, status=Sample.Status.COMPLETED):
        return Sample(reward=r, status=status, metadata={"raw_reward": r})

    samples = [s(1.0), s(0.0), s(1.0), s(0.0, Sample.Status.ABORTED)]
    batch.scored_raw_rewards(samples)
    logged = [x.metadata["raw_reward"] for x in samples]
    assert sum(logged) / len(logged) == pytest.approx(2 / 3)  # was 0.5: the abort counted as a failure
    assert batch.aborted_metrics(samples) == {"rollout/aborted_samples": 1, "rollout/aborted_fraction": 0.25}
    nothing_scored = [s(0.0, Sample.Status.ABORTED)]
    batch.scored_raw_rewards(nothing_scored)
    assert nothing_scored[0].metadata["raw_reward"] == 0.0


def test_sampling_params_from_slime_always_stop_at_end_of_turn(small_tokenizer):
    params = slime_adapter.sampling_from_slime({"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64,
                                                "stop_token_ids": [3], "sampling_seed": 11}, small_tokenizer)
    assert params.temperature == 0.7 and params.top_k == 20 and params.seed == 11
    assert set(params.stop_token_ids) == {3, small_tokenizer.eos_token_id}
    assert not params.return_top_p
    asked = slime_adapter.sampling_from_slime({"top_p": 0.9, "custom_params": {"return_top_p_token_ids": True}},
                                              small_tokenizer)  # what slime sends for --rollout-top-p 0.9
    assert asked.return_top_p


def test_fill_sample_writes_top_p_replay_and_what_sglang_reported(small_tokenizer):
    traj = dataclasses.replace(_trajectory(COMPLETED, reward=1.0), top_p=TopPSpans([5, 9, 6, 7], [0, 2, 3, 4]),
                               turn_meta=[{"prompt_tokens": 3, "cached_tokens": 1, "weight_version": "7"}])
    sample = Sample(metadata={"start_rollout_id": 3}, weight_versions=["stale"])
    slime_adapter.fill_sample(sample, traj, Tau2Config.from_env({}), small_tokenizer, top_p=True)
    check_like_slime([sample])
    assert sample.rollout_top_p_token_offsets == [0, 2, 3, 4] and sample.weight_versions == ["7"]
    assert (sample.prefix_cache_info.cached_tokens, sample.prefix_cache_info.total_prompt_tokens) == (1, 3)
    assert "start_rollout_id" not in sample.metadata  # a fresh episode: nothing of the earlier attempt is kept


def test_fill_sample_refuses_top_p_the_server_did_not_return(small_tokenizer):
    with pytest.raises(slime_adapter.TopPUnavailable, match="--rollout-top-p 1.0"):
        slime_adapter.fill_sample(Sample(), _trajectory(COMPLETED), Tau2Config.from_env({}), small_tokenizer,
                                  top_p=True)
    aborted = slime_adapter.fill_sample(Sample(prompt="x"), _trajectory(ABORTED, response=()),
                                        Tau2Config.from_env({}), small_tokenizer, top_p=True)
    check_like_slime([aborted])  # nothing sampled: empty spans, still trainable (masked)
