"""Curriculum tracker: weight transitions at the thresholds, learning-value sampling, saved state that survives a
killed process, and the counts put back at a checkpoint's rollout on a resume."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.curriculum import STATE_FILE, CurriculumTracker, rollouts_kept, state_path

CFG = Tau2Config()
ROOT = Path(__file__).resolve().parents[1]


def _tracker(cfg=CFG, **outcomes: list[bool]) -> CurriculumTracker:
    tracker = CurriculumTracker(cfg)
    for key, results in outcomes.items():
        for ok in results:
            tracker.record(key, ok)
    return tracker


# ---------------------------------------------------------------------------------------------------
# weights


def test_weight_is_neutral_until_min_attempts():
    tracker = _tracker(a=[True] * 4, b=[False] * 4)
    assert (tracker.weight("a"), tracker.weight("b"), tracker.weight("unseen")) == (1.0, 1.0, 1.0)
    tracker.record("a", True)
    tracker.record("b", False)
    assert (tracker.weight("a"), tracker.weight("b")) == (0.1, 0.5)


@pytest.mark.parametrize("successes,attempts,weight", [
    (4, 5, 0.1),  # 0.8 > 0.75: solved
    (6, 8, 1.0),  # exactly 0.75: not solved
    (7, 9, 0.1),  # 0.78
    (2, 8, 1.0),  # exactly 0.25: not hard
    (1, 5, 0.5),  # 0.2 < 0.25: hard
    (0, 5, 0.5),
    (5, 10, 1.0),
])
def test_weight_transitions_at_the_thresholds(successes, attempts, weight):
    tracker = _tracker(t=[True] * successes + [False] * (attempts - successes))
    assert tracker.weight("t") == weight


def test_a_task_moves_from_hard_to_middle_to_solved_as_it_is_learned():
    tracker = _tracker(t=[False] * 5)
    seen = [tracker.weight("t")]
    for _ in range(15):
        tracker.record("t", True)
        seen.append(tracker.weight("t"))
    # 0/5 hard; 2/7 = 0.29 leaves hard; 13/18 = 0.72 still middle; 15/20 = 0.75 not yet; never solved here
    assert seen[0] == 0.5 and seen[1] == 0.5 and seen[2] == 1.0
    assert set(seen[2:]) == {1.0}
    tracker.record("t", True)  # 16/21 = 0.76
    assert tracker.weight("t") == 0.1


def test_each_curriculum_knob_changes_the_weight():
    solved = [True] * 4 + [False]  # 0.8
    hard = [False] * 4 + [True]  # 0.2
    assert _tracker(replace(CFG, curriculum_min_attempts=6), t=solved).weight("t") == 1.0
    assert _tracker(replace(CFG, curriculum_solved_weight=0.3), t=solved).weight("t") == 0.3
    assert _tracker(replace(CFG, curriculum_hard_weight=0.7), t=hard).weight("t") == 0.7
    assert _tracker(replace(CFG, curriculum_solved_threshold=0.85), t=solved).weight("t") == 1.0
    assert _tracker(replace(CFG, curriculum_hard_threshold=0.1), t=hard).weight("t") == 1.0


# ---------------------------------------------------------------------------------------------------
# sampling


def test_learning_value_weights_use_smoothed_p_with_a_floor():
    cfg = replace(CFG, task_sampler="learning_value")
    outcomes = {"half": [True, False], "good": [True] * 10, "solved": [True] * 100}
    keys = ["unseen", "half", "good", "solved"]
    # unseen: p = 1/2; half: 2/4; good: 11/12 -> 11/144; solved: 101/102 -> below the floor
    assert _tracker(cfg, **outcomes).sampling_weights(keys) == pytest.approx([0.25, 0.25, 11 / 144, 0.05])
    low_floor = _tracker(replace(cfg, sampler_floor=0.005), **outcomes)
    assert low_floor.sampling_weights(["solved"]) == pytest.approx([101 / 102 ** 2])
    assert _tracker(CFG, **outcomes).sampling_weights(keys) == [1.0] * 4  # uniform


def test_draw_gives_distinct_tasks_and_favours_learning_value():
    keys = ["open", "solved"]
    lv = _tracker(replace(CFG, task_sampler="learning_value"), solved=[True] * 100)
    uniform = _tracker(CFG, solved=[True] * 100)
    rng = random.Random(0)
    lv_counts = Counter(lv.draw(keys, 1, rng)[0] for _ in range(2000))
    uni_counts = Counter(uniform.draw(keys, 1, rng)[0] for _ in range(2000))
    # learning value 0.25 vs floor 0.05: "open" drawn 5/6 of the time; uniform about half
    assert 0.78 < lv_counts["open"] / 2000 < 0.88
    assert 0.45 < uni_counts["open"] / 2000 < 0.55
    assert sorted(lv.draw(keys, 2, rng)) == keys
    with pytest.raises(ValueError, match="cannot draw 3 distinct tasks from 2"):
        lv.draw(keys, 3, rng)


# ---------------------------------------------------------------------------------------------------
# persistence


def test_state_path_follows_the_config(tmp_path):
    assert state_path(CFG, tmp_path) == tmp_path / STATE_FILE
    assert state_path(CFG, None) is None
    assert state_path(replace(CFG, curriculum_state_path=str(tmp_path / "x.json")), None) == tmp_path / "x.json"
    assert state_path(replace(CFG, curriculum_persist=False), tmp_path) is None


def test_save_and_load_round_trip(tmp_path):
    tracker = _tracker(**{"airline/1": [True, False, True], "retail/0": [False]})
    tracker.count_groups(7, 3)
    path = tmp_path / "ckpt" / STATE_FILE
    tracker.save(path)
    back = CurriculumTracker.load(path, CFG)
    assert back.to_dict() == tracker.to_dict()
    assert (back.groups_seen, back.zero_signal_groups) == (7, 3)
    assert [p.name for p in path.parent.iterdir()] == [STATE_FILE]  # no temp file left behind


def test_restore_starts_fresh_without_a_file_and_refuses_a_bad_one(tmp_path):
    assert CurriculumTracker.restore(CFG, tmp_path / "missing.json").attempts == {}
    assert CurriculumTracker.restore(CFG, None).attempts == {}
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=f"curriculum state {bad} is unreadable"):
        CurriculumTracker.restore(CFG, bad)
    bad.write_text(json.dumps({"version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        CurriculumTracker.load(bad, CFG)


def test_a_state_of_another_tau2_is_refused_in_one_line_and_an_older_one_without_a_version_loads(tmp_path):
    from tau2_rl_pipeline.benchmark.tau2_version import VERSION, BenchmarkMismatch

    tracker = _tracker(**{"airline/1": [True, False]})
    path = tmp_path / STATE_FILE
    tracker.save(path)
    state = json.loads(path.read_text())
    assert state["tau2_version"] == VERSION
    path.write_text(json.dumps({**state, "tau2_version": "0.9"}))
    with pytest.raises(BenchmarkMismatch) as refused:  # a slime GRPO resume after switching tau2
        CurriculumTracker.restore(CFG, path)
    assert "produced with tau2 0.9" in str(refused.value) and "\n" not in str(refused.value)
    del state["tau2_version"]  # written before the version was recorded
    path.write_text(json.dumps(state))
    assert CurriculumTracker.restore(CFG, path).attempts == {"airline/1": 2}


_WRITER = textwrap.dedent("""
    import sys
    from tau2_rl_pipeline.config import Tau2Config
    from tau2_rl_pipeline.learning.curriculum import CurriculumTracker
    path = sys.argv[1]
    tracker = CurriculumTracker.restore(Tau2Config(), path)
    i = 0
    while True:  # record and save until killed; every save holds an even/odd-consistent count
        tracker.record("airline/3", i % 2 == 0)
        tracker.count_groups(1, i % 2)
        tracker.save(path)
        if i == 0:
            print("saved", flush=True)
        i += 1
""")


def test_save_kill_restore_continues_the_counts(tmp_path):
    path = tmp_path / STATE_FILE
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "saved"
        while True:  # read while it writes: every read must see a whole, consistent file
            seen = CurriculumTracker.load(path, CFG)
            m = seen.attempts["airline/3"]
            assert seen.successes["airline/3"] == (m + 1) // 2
            if m >= 50:
                break
    finally:
        proc.send_signal(signal.SIGKILL)  # no clean shutdown: it may die mid-write
        proc.wait()
    restored = CurriculumTracker.restore(CFG, path)
    n = restored.attempts["airline/3"]
    assert n >= 2
    assert restored.successes["airline/3"] == (n + 1) // 2
    assert restored.groups_seen == n and restored.zero_signal_groups == n // 2
    # continue where the killed run stopped: the counts carry on, and so does the weight
    for _ in range(3):
        restored.record("airline/3", True)
    restored.save(path)
    again = CurriculumTracker.load(path, CFG)
    assert again.attempts["airline/3"] == n + 3
    assert again.successes["airline/3"] == (n + 1) // 2 + 3


def test_use_curriculum_off_means_no_curriculum_but_counts_are_kept():
    """TAU2_USE_CURRICULUM, the original cookbook's switch: off = weight 1.0 everywhere and uniform draws."""
    off = Tau2Config.from_env({"TAU2_USE_CURRICULUM": "0", "TAU2_TASK_SAMPLER": "learning_value"})
    on = replace(off, use_curriculum=True)
    outcomes = {"solved": [True] * 10, "hard": [False] * 10, "half": [True, False]}
    assert [_tracker(on, **outcomes).weight(k) for k in ("solved", "hard")] == [0.1, 0.5]
    tracker = _tracker(off, **outcomes)
    assert [tracker.weight(k) for k in ("solved", "hard")] == [1.0, 1.0]
    assert tracker.sampling_weights(["solved", "half"]) == [1.0, 1.0]
    assert _tracker(on, **outcomes).sampling_weights(["solved", "half"]) == pytest.approx([11 / 144, 0.25])
    assert tracker.attempts["solved"] == 10 and tracker.success_rate("hard") == 0.0


# ---------------------------------------------------------------------------------------------------
# rollouts: a resumed run's counts are those of its checkpoint


def _rollout(tracker: CurriculumTracker, rollout: int, keep: int = 6) -> str | None:
    """What reward_post_process does for one rollout: its outcomes (fixed by the rollout id) on the counts as of
    the rollout before."""
    note = tracker.begin_rollout(rollout, keep)
    _outcomes(tracker, rollout)
    return note


def _outcomes(tracker: CurriculumTracker, rollout: int) -> None:
    for i in range(4):
        tracker.record(f"airline/{(rollout + i) % 3}", (rollout * i) % 3 == 0)
    tracker.count_groups(2, rollout % 2)


def _reference(rollouts) -> tuple:
    """The counts of these rollouts' outcomes, counted once each (no rollouts kept)."""
    tracker = CurriculumTracker(CFG)
    for r in rollouts:
        _outcomes(tracker, r)
    return _counts(tracker)


def _run(rollouts, tracker: CurriculumTracker | None = None, keep: int = 6) -> CurriculumTracker:
    tracker = tracker or CurriculumTracker(CFG)
    for r in rollouts:
        assert _rollout(tracker, r, keep) is None
    return tracker


def _counts(tracker: CurriculumTracker) -> tuple:
    return tracker.attempts, tracker.successes, tracker.groups_seen, tracker.zero_signal_groups


def test_each_rollouts_counts_are_kept_apart_up_to_keep_and_saved(tmp_path):
    tracker = _run(range(9), keep=4)
    assert tracker.rollout == 8 and [r.rollout for r in tracker.recent] == [5, 6, 7, 8]  # pruned to the newest 4
    assert tracker.recent[-1].attempts == {"airline/2": 2, "airline/0": 1, "airline/1": 1}
    assert sum(tracker.attempts.values()) == 36 and tracker.groups_seen == 18
    path = tmp_path / STATE_FILE
    tracker.save(path)
    back = CurriculumTracker.load(path, CFG)
    assert back.to_dict() == tracker.to_dict()
    assert back.rollout == 8 and [_counts(r) for r in back.recent] == [_counts(r) for r in tracker.recent]


@pytest.mark.parametrize("checkpoint", [-1, 3, 4, 6])
def test_a_run_resumed_after_its_checkpoint_counts_as_one_never_stopped(tmp_path, checkpoint):
    """Saved after rollout 6, resumed at checkpoint + 1 (-1: killed before its first checkpoint, restarted fresh):
    the rollouts after the checkpoint are taken away and counted once when generated again."""
    path = tmp_path / STATE_FILE
    _run(range(7)).save(path)
    resumed = CurriculumTracker.load(path, CFG)
    fresh = "a fresh start (rollout 0): the 28 attempts counted before are not used"
    assert _rollout(resumed, checkpoint + 1) == (fresh if checkpoint == -1 else None)
    assert _counts(resumed) == _reference(range(checkpoint + 2))  # the checkpoint's counts, then its rollout
    _run(range(checkpoint + 2, 10), resumed)
    assert resumed.to_dict() == _run(range(10)).to_dict()


def test_a_checkpoint_older_than_the_rollouts_kept_starts_from_nothing_and_says_so(tmp_path):
    path = tmp_path / STATE_FILE
    _run(range(9), keep=4).save(path)  # keeps rollouts 5..8
    resumed = CurriculumTracker.load(path, CFG)
    note = _rollout(resumed, 4)  # checkpoint 3: rollouts 4..8 would count twice
    assert note == ("it keeps rollouts 5..8 apart, not all of 4..8, which this run generates again after its "
                    "checkpoint at rollout 3: the counts start again from nothing rather than count those rollouts "
                    "twice")
    assert _counts(resumed) == _reference([4])
    assert [r.rollout for r in resumed.recent] == [4]
    ok = CurriculumTracker.load(path, CFG)  # checkpoint 4: exactly what rollouts 5..8 added is taken away
    assert _rollout(ok, 5) is None and _counts(ok) == _reference(range(6))


def test_a_file_behind_the_checkpoint_is_used_and_the_missing_rollouts_named(tmp_path):
    path = tmp_path / STATE_FILE
    _run(range(3)).save(path)
    resumed = CurriculumTracker.load(path, CFG)
    assert _rollout(resumed, 6) == ("its counts end at rollout 2 and this run goes on after rollout 5: rollouts 3..5 "
                                    "are not in them")
    assert _counts(resumed) == _reference([0, 1, 2, 6])
    assert [r.rollout for r in resumed.recent] == [6]  # nothing before the gap to take away later
    missing = CurriculumTracker.restore(CFG, tmp_path / "none.json")
    assert _rollout(missing, 2) == "no counts were saved: rollouts 0..1 are not in them"


def test_a_fresh_start_uses_no_counts_of_before(tmp_path):
    path = tmp_path / STATE_FILE
    _run(range(20), keep=4).save(path)  # a run killed before its first checkpoint, or an earlier run
    again = CurriculumTracker.load(path, CFG)
    assert _rollout(again, 0) == "a fresh start (rollout 0): the 80 attempts counted before are not used"
    assert again.to_dict() == _run([0]).to_dict()


def test_an_older_file_without_rollouts_loads_and_is_used_as_saved_said_once(tmp_path):
    path = tmp_path / STATE_FILE
    old = _tracker(**{"airline/1": [True, False]})
    old.count_groups(1, 0)
    state = old.to_dict()
    for key in ("rollout", "recent"):
        del state[key]
    path.write_text(json.dumps({**state, "version": 1}))  # as version 1 wrote it
    resumed = CurriculumTracker.load(path, CFG)
    assert resumed.rollout is None and resumed.recent == [] and resumed.attempts == {"airline/1": 2}
    assert _rollout(resumed, 5) == ("its counts are of no known rollout (a file written before rollouts were kept): "
                                    "they are used as saved, so the rollouts after the checkpoint that it already "
                                    "counted count twice")
    assert resumed.attempts["airline/1"] == 2 + 1 and _rollout(resumed, 6) is None  # said once; kept from here on
    assert [r.rollout for r in resumed.recent] == [5, 6]


def test_no_rollout_id_counts_on_without_rollouts_kept():
    tracker = _run(range(3))
    assert tracker.begin_rollout(None, 6) is None
    tracker.record("airline/9", True)
    assert tracker.rollout is None and tracker.recent == [] and tracker.attempts["airline/9"] == 1


def test_a_file_whose_rollouts_do_not_end_at_its_rollout_is_refused(tmp_path):
    path = tmp_path / STATE_FILE
    state = _run(range(4)).to_dict()
    path.write_text(json.dumps({**state, "rollout": 7}))
    with pytest.raises(ValueError, match=r"is unreadable: its rollouts \[0, 1, 2, 3\] are not the ones up to its "
                                         r"rollout 7"):
        CurriculumTracker.load(path, CFG)


def test_the_rollouts_kept_cover_two_save_intervals_and_the_rollout_generated_ahead():
    assert [rollouts_kept(i) for i in (None, 1, 2, 50)] == [4, 4, 6, 102]
