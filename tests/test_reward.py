"""Reward shaping and GRPO advantages: partial scores from real tau2 RewardInfo (oracle replays through the
episode core, scored by tau2's evaluator), group normalization against hand-computed groups and slime's
torch formula, and the post-process step over slime-shaped samples."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

import pytest
import torch
from tau2.data_model.simulation import CommunicateCheck, DBCheck, RewardInfo

from tau2_rl_pipeline.benchmark.oracle import gold_actions, replay_gold_actions
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.curriculum import CurriculumTracker
from tau2_rl_pipeline.learning.reward import (
    domain_alpha,
    filter_equal_reward_groups,
    format_penalty,
    group_normalize,
    partial_score,
    post_process,
    shaped_reward,
)

CFG = Tau2Config()
TELECOM_TASK = ("[mobile_data_issue]bad_vpn|data_mode_off|data_usage_exceeded|user_abroad_roaming_disabled_off"
                "[PERSONA:None]")


def _task(domain: str, task_id: str):
    return next(t for t in load_tasks(domain, "test") if t.id == task_id)


# ---------------------------------------------------------------------------------------------------
# partial score on real RewardInfo


@pytest.mark.parametrize("domain,task_id", [
    ("airline", "18"),  # action + communicate + db
    ("retail", "5"),  # action + db
    # telecom: env assertions; its oracle leaves db_match False (db is not in telecom's reward basis)
    ("telecom", TELECOM_TASK),
])
def test_full_oracle_replay_scores_partial_one(domain, task_id):
    info = replay_gold_actions(domain, _task(domain, task_id))
    assert info.reward == 1.0
    score, parts = partial_score(info, domain, CFG)
    assert score == pytest.approx(1.0)
    for name in ("action", "communicate", "env_assertion"):
        assert parts.get(name, 1.0) == 1.0
    assert "action" in parts


@pytest.mark.parametrize("k", [0, 2, 4])
def test_replay_with_k_of_n_gold_actions_gives_action_fraction_k_over_n(k):
    task = _task("retail", "5")
    actions = gold_actions(task)
    n = len(actions)
    assert n == 5 and len({(a.name, str(a.arguments)) for a in actions}) == n  # no twin can stand in
    info = replay_gold_actions("retail", task, keep=lambda i, _: i < k)
    score, parts = partial_score(info, "retail", CFG)
    assert parts["action"] == pytest.approx(k / n)
    assert set(parts) == {"action", "db"}
    # db is present but weighs 0 by default, so the score is the action fraction alone
    assert score == pytest.approx(k / n)
    assert info.reward == 0.0


def test_telecom_task_uses_the_telecom_weights():
    domain = "telecom"
    task = _task(domain, TELECOM_TASK)
    names = [a.name for a in gold_actions(task)]
    info = replay_gold_actions(domain, task, keep=lambda i, a: a.name != "toggle_data")
    score, parts = partial_score(info, domain, CFG)
    action = (len(names) - names.count("toggle_data")) / len(names)
    env = sum(c.met for c in info.env_assertions) / len(info.env_assertions)
    assert parts["action"] == pytest.approx(action)
    assert 0 < env < 1  # data stays off: some assertion fails, so the weights matter
    assert score == pytest.approx((0.35 * action + 0.30 * env) / 0.65)
    default_score, _ = partial_score(info, domain, replace(CFG, use_telecom_weights=False))
    assert default_score == pytest.approx((0.5 * action + 0.35 * env) / 0.85)
    custom, _ = partial_score(info, domain, replace(CFG, telecom_partial_weights=(0.0, 0.0, 1.0, 0.0)))
    assert custom == pytest.approx(env)
    # the same RewardInfo scored as another domain ignores the telecom weights
    assert partial_score(info, "airline", CFG)[0] == pytest.approx(default_score)


def test_partial_weights_average_over_present_components_only():
    info = RewardInfo(reward=0.0, db_check=DBCheck(db_match=True, db_reward=1.0), communicate_checks=[
        CommunicateCheck(info="a", met=True, justification=""),
        CommunicateCheck(info="b", met=False, justification="")])
    assert partial_score(info, "retail", CFG) == (pytest.approx(0.5), {"communicate": 0.5, "db": 1.0})
    cfg = replace(CFG, partial_weights=(0.5, 0.15, 0.35, 0.15))
    assert partial_score(info, "retail", cfg)[0] == pytest.approx((0.15 * 0.5 + 0.15 * 1.0) / 0.3)
    only_db = RewardInfo(reward=0.0, db_check=DBCheck(db_match=True, db_reward=1.0))
    assert partial_score(only_db, "retail", CFG) == (0.0, {"db": 1.0})  # present, but weighs 0


def test_premature_termination_has_no_components_and_scores_zero():
    info = RewardInfo(reward=0.0, reward_basis=None, info={"note": "Simulation terminated prematurely."})
    assert partial_score(info, "airline", CFG) == (0.0, {})


# ---------------------------------------------------------------------------------------------------
# shaped reward


def test_alpha_is_base_times_domain_multiplier_and_each_knob_moves_it():
    assert [domain_alpha(d, CFG) for d in ("retail", "airline", "telecom", "mock")] == \
        pytest.approx([0.2, 0.25, 0.4, 0.25])
    assert domain_alpha("telecom", replace(CFG, use_domain_alpha=False)) == 0.25
    assert domain_alpha("retail", replace(CFG, reward_alpha=0.5)) == pytest.approx(0.4)
    assert domain_alpha("retail", replace(CFG, alpha_mult_retail=2.0)) == pytest.approx(0.5)
    assert domain_alpha("airline", replace(CFG, alpha_mult_airline=3.0)) == pytest.approx(0.75)
    assert domain_alpha("telecom", replace(CFG, alpha_mult_telecom=1.0)) == pytest.approx(0.25)


def test_shaped_reward_adds_alpha_times_partial_unless_partial_credit_is_off():
    assert shaped_reward(0.0, 0.5, "telecom", CFG) == pytest.approx(0.2)
    assert shaped_reward(1.0, 1.0, "retail", CFG) == pytest.approx(1.2)
    assert shaped_reward(0.0, 0.5, "telecom", replace(CFG, use_partial_credit=False)) == 0.0
    assert shaped_reward(1.0, 0.5, "telecom", replace(CFG, use_partial_credit=False)) == 1.0


def test_format_penalty_is_off_by_default_per_error_and_bounded():
    assert format_penalty(7, CFG) == 0.0  # default off
    on = Tau2Config.from_env({"TAU2_FORMAT_PENALTY": "0.05"})
    assert [format_penalty(n, on) for n in (0, 1, 4)] == pytest.approx([0.0, 0.05, 0.2])
    assert format_penalty(100, on) == pytest.approx(0.5)  # TAU2_FORMAT_PENALTY_MAX
    assert format_penalty(100, replace(on, format_penalty_max=0.3)) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="format_errors"):
        format_penalty(-1, on)
    assert shaped_reward(1.0, 1.0, "retail", on, format_penalty(2, on)) == pytest.approx(1.2 - 0.1)
    assert shaped_reward(1.0, 0.5, "retail", replace(on, use_partial_credit=False), 0.1) == pytest.approx(0.9)


def test_a_judge_score_is_one_more_weighted_partial_component():
    info = RewardInfo(reward=0.0, communicate_checks=[  # communicate 0.5, weight 0.15
        CommunicateCheck(info="a", met=True, justification=""),
        CommunicateCheck(info="b", met=False, justification="")])
    assert partial_score(info, "retail", CFG, judge=None) == (0.5, {"communicate": 0.5})
    score, parts = partial_score(info, "retail", CFG, judge=1.0)
    assert parts == {"communicate": 0.5, "judge": 1.0}
    assert score == pytest.approx((0.15 * 0.5 + 0.2 * 1.0) / (0.15 + 0.2))
    assert partial_score(info, "retail", replace(CFG, judge_weight=0.15), judge=1.0)[0] == pytest.approx(0.75)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        partial_score(info, "retail", CFG, judge=1.5)


# ---------------------------------------------------------------------------------------------------
# group normalization


def test_group_normalize_matches_hand_computed_groups():
    # one success in four: mean 0.25, unbiased std sqrt(0.75 / 3) = 0.5
    assert group_normalize([1, 0, 0, 0], [True] * 4, 4, True) == pytest.approx(
        [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001])
    # equal rewards: no signal, all zero (0 / (0 + eps))
    assert group_normalize([0.3] * 4, [True] * 4, 4, True) == [0.0] * 4
    # std normalization off: mean-centred only
    assert group_normalize([1, 0, 0, 0], [True] * 4, 4, False) == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_removed_samples_get_zero_and_do_not_move_their_group():
    # second group: 1, 0, [removed 5.0], 0 -> valid mean 1/3, unbiased std sqrt(1/3)
    rewards = [1, 0, 0, 0, 1, 0, 5.0, 0]
    valid = [True] * 6 + [False, True]
    out = group_normalize(rewards, valid, 4, True)
    std = math.sqrt(1 / 3) + 1e-6
    assert out[4:] == pytest.approx([(2 / 3) / std, (-1 / 3) / std, 0.0, (-1 / 3) / std])
    assert out[:4] == group_normalize([1, 0, 0, 0], [True] * 4, 4, True)  # groups are independent
    # the removed value does not matter
    assert group_normalize(rewards[:6] + [-9.0, 0], valid, 4, True) == out
    # one valid sample: centred to 0; no valid sample: all 0
    assert group_normalize([0.7, 3, 3, 3], [True, False, False, False], 4, True) == [0.0] * 4
    assert group_normalize([0.7, 3], [False, False], 2, True) == [0.0, 0.0]


def test_group_normalize_equals_slimes_torch_formula_when_all_samples_are_valid():
    rewards = [1.2, 0.0, 0.05, 0.3, 0.0, 0.0, 1.0, 1.25, 0.1, 0.1, 0.1, 0.1]
    t = torch.tensor(rewards, dtype=torch.float64).reshape(-1, 4)
    centred = t - t.mean(dim=-1, keepdim=True)
    expected = (centred / (centred.std(dim=-1, keepdim=True) + 1e-6)).flatten().tolist()
    assert group_normalize(rewards, [True] * 12, 4, True) == pytest.approx(expected)
    assert group_normalize(rewards, [True] * 12, 4, False) == pytest.approx(centred.flatten().tolist())


def test_group_normalize_rejects_ragged_batches():
    with pytest.raises(ValueError, match="groups of n_samples_per_prompt=4"):
        group_normalize([1, 0, 0], [True] * 3, 4, True)
    with pytest.raises(ValueError, match="validity flags"):
        group_normalize([1, 0], [True], 2, True)


def test_filter_drops_and_counts_groups_of_equal_rewards():
    rewards = [0.0, 0.0, 0.0, 0.0, 1.0, 0.2, 0.0, 0.0, 0.3, 9.0, 0.3, 0.3, 5.0, 5.0, 1.0, 2.0]
    valid = [True] * 8 + [True, False, True, True] + [False] * 4
    keep, dropped = filter_equal_reward_groups(rewards, valid, 4)
    # group 3 is equal once its removed sample is ignored; group 4 has nothing valid (not counted)
    assert dropped == 2
    assert keep == [False] * 4 + [True] * 4 + [False] * 4 + [False] * 4


# ---------------------------------------------------------------------------------------------------
# post-process over slime-shaped samples


class Status(enum.Enum):
    """slime's Sample.Status members (slime/utils/types.py)."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """The fields of slime's Sample that the reward post-process reads and writes."""

    reward: float | None
    metadata: dict = field(default_factory=dict)
    status: Status = Status.COMPLETED
    remove_sample: bool = False


def _sample(task_id: str, raw: float, shaped: float, **kw) -> Sample:
    return Sample(reward=shaped, metadata={"raw_reward": raw, "domain": "retail", "task_id": task_id}, **kw)


def _run(samples, cfg=CFG, tracker=None, group_size=4):
    tracker = tracker or CurriculumTracker(cfg)
    raw, adv = post_process(samples, group_size, cfg, tracker)
    return raw, adv, tracker


def test_post_process_normalizes_shaped_rewards_and_zeroes_aborted_and_removed():
    samples = [_sample("1", 1.0, 1.2), _sample("1", 0.0, 0.1),
               Sample(reward=None, metadata={"domain": "retail", "task_id": "1"}, status=Status.ABORTED),
               _sample("1", 0.0, 0.2, remove_sample=True)]
    raw, adv, tracker = _run(samples)
    assert raw == [1.0, 0.0, 0.0, 0.0]
    expected = group_normalize([1.2, 0.1], [True, True], 2, True)
    assert adv == pytest.approx(expected + [0.0, 0.0])
    # the removed sample finished its episode and counts as an attempt; the aborted one does not
    assert tracker.attempts == {"retail/1": 3} and tracker.successes == {"retail/1": 1}
    assert not samples[0].remove_sample


def test_success_follows_the_task_reward_not_the_shaped_one():
    samples = [_sample("7", 1.0, 1.25), _sample("7", 0.0, 0.999999), _sample("7", 0.0, 1.0), _sample("7", 1.0, 1.0)]
    _, _, tracker = _run(samples)
    assert tracker.successes == {"retail/7": 2}


def test_task_keys_keep_domains_apart():
    samples = [_sample("0", 1.0, 1.0), _sample("0", 1.0, 1.0)]
    samples[1].metadata["domain"] = "airline"
    _, _, tracker = _run(samples, group_size=1)
    assert tracker.attempts == {"retail/0": 1, "airline/0": 1}


def test_post_process_requires_the_task_reward_on_finished_samples():
    samples = [_sample("3", 1.0, 1.0), Sample(reward=0.0, metadata={"domain": "retail", "task_id": "3"})]
    tracker = CurriculumTracker(CFG)
    with pytest.raises(ValueError, match="raw_reward"):
        post_process(samples, 2, CFG, tracker)
    assert tracker.attempts == {}  # nothing half-recorded


def test_std_normalization_switch_reaches_post_process():
    samples = [_sample("1", 1.0, 1.0)] + [_sample("1", 0.0, 0.0) for _ in range(3)]
    _, on, _ = _run(samples)
    _, off, _ = _run(samples, replace(CFG, grpo_std_normalization=False))
    assert on == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    assert off == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_zero_signal_filter_marks_samples_removed_only_when_on():
    def batch():
        return [_sample("1", 0.0, 0.0) for _ in range(4)] + [_sample("2", 1.0, 1.0)] + \
            [_sample("2", 0.0, 0.0) for _ in range(3)]

    off = batch()
    _, _, tracker = _run(off)
    assert not any(s.remove_sample for s in off)
    assert (tracker.groups_seen, tracker.zero_signal_groups) == (2, 1)
    on = batch()
    _, adv, tracker = _run(on, replace(CFG, filter_zero_std=True))
    assert [s.remove_sample for s in on] == [True] * 4 + [False] * 4
    assert adv[:4] == [0.0] * 4 and adv[4] > 0
    assert (tracker.groups_seen, tracker.zero_signal_groups) == (2, 1)


def test_curriculum_weights_scale_advantages_only_when_applied():
    cfg = replace(CFG, curriculum_min_attempts=4)
    # task 1 succeeds 3 of 4 (0.75 is not above the solved threshold) -> 1.0; task 2 fails 4 of 4 -> hard, 0.5
    batch = [_sample("1", 1.0, 1.0)] * 3 + [_sample("1", 0.0, 0.0)] + \
        [_sample("2", 0.0, 0.0)] * 3 + [_sample("2", 0.0, 0.1)]
    _, plain, _ = _run(batch, replace(cfg, apply_curriculum_weights=False))
    _, weighted, tracker = _run(batch, cfg)
    assert (tracker.weight("retail/1"), tracker.weight("retail/2")) == (1.0, 0.5)
    assert plain[4:] != [0.0] * 4
    assert weighted == pytest.approx(plain[:4] + [0.5 * a for a in plain[4:]])


def test_a_batch_is_recorded_before_weights_are_read():
    """4 earlier successes + this group's 3 of 4 = 7 of 8 > 0.75: every sample of the group gets the solved
    weight, the first as much as the last."""
    cfg = replace(CFG, curriculum_min_attempts=5)
    tracker = CurriculumTracker(cfg)
    for _ in range(4):
        tracker.record("retail/1", True)
    assert tracker.weight("retail/1") == 1.0
    _, adv, _ = _run([_sample("1", 1.0, 1.0)] * 3 + [_sample("1", 0.0, 0.0)], cfg, tracker)
    assert adv == pytest.approx([0.1 * a for a in group_normalize([1, 1, 1, 0], [True] * 4, 4, True)])
