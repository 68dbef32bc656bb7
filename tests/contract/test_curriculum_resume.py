"""A killed GRPO run resumed from its checkpoint counts each episode once in its curriculum, through slime's own code.

The curriculum state is written after every rollout (slime calls the reward post-process in
RolloutManager._convert_samples_to_train_data), the checkpoints only at slime's save cadence; a resumed run generates
again the rollouts after its checkpoint. Here a run of 5 rollouts, --save-interval 2, is killed once rollout 4 is
generated (in the order slime's train.py, or train_async.py, runs its loop), then resumed as the stage script
resumes it (--load SAVE_DIR, no --start-rollout-id): slime's start (hosts_job.start_rollout, Megatron's tracker + 1)
and its checkpoints (hosts_job.save_checkpoint, as Megatron writes them at slime's cadence); each rollout's samples go
through slime's conversion after slime's set_current_rollout_id (slime_harness.train_data). Each rollout's outcomes
are fixed by its id (no SGLang here), so both runs see the same episodes: the resumed run's state file must equal
the uninterrupted run's, with not one line about the counts being inexact.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import hosts_job
import pytest
from slime_harness import POST_PROCESS, prompt_rows, reset_slime, slime_args, train_data

ROLLOUTS, INTERVAL, KILLED_AFTER = 5, 2, 4
TASKS = ["create_task_1", "update_task_1", "create_task_2"]


def outcomes(args, rollout_id: int) -> list:
    """Rollout `rollout_id`'s episodes as the custom generate leaves them (slime Samples, groups of 2): which task
    and whether it was solved follow from the rollout id alone."""
    from slime.utils.types import Sample

    samples = []
    for group in range(args.rollout_batch_size):
        task = TASKS[(rollout_id + group) % len(TASKS)]
        for k in range(args.n_samples_per_prompt):
            reward = float((rollout_id * 3 + group + k) % 4 == 0)
            samples.append(Sample(index=len(samples), tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1],
                                  reward=reward, status=Sample.Status.COMPLETED,
                                  metadata={"domain": "mock", "task_id": task, "raw_reward": reward}))
    return samples


def schedule(first: int, num_rollout: int, asynchronous: bool):
    """("generate", r) and ("save", r) in the order slime's loop reaches them: train.py generates rollout r and trains
    on it; train_async.py asks for rollout r + 1 before it trains on r, so r + 1 is generated before r is saved."""
    if asynchronous:
        yield "generate", first
    for r in range(first, num_rollout):
        if not asynchronous:
            yield "generate", r
        elif r + 1 < num_rollout:
            yield "generate", r + 1
        yield "save", r


def run(args, asynchronous: bool, kill_after: int | None = None) -> int:
    """One run of the job (one RolloutManager process), from where slime starts it; returns that start."""
    reset_slime()
    first = hosts_job.start_rollout(args)
    for event, rollout_id in schedule(first, args.num_rollout, asynchronous):
        if event == "generate":
            train_data(args, outcomes(args, rollout_id), rollout_id)
            if rollout_id == kill_after:
                return first  # killed: nothing after this
        else:
            hosts_job.save_checkpoint(args, rollout_id)
    return first


@pytest.fixture
def fresh_slime():
    """No episodes here, so no user simulator: slime's and the adapter's process-wide state only, left clean."""
    yield
    reset_slime()


def argv(save: Path, *how: str) -> tuple[str, ...]:
    return ("--save", str(save), "--save-interval", str(INTERVAL), "--num-rollout", str(ROLLOUTS), *how)


@pytest.mark.parametrize("asynchronous,resumed_at", [(False, 4), (True, 2)])
def test_a_killed_run_resumed_at_its_checkpoint_counts_as_one_never_stopped(fresh_slime, tiny_small_dir, tmp_path,
                                                                           monkeypatch, caplog, asynchronous,
                                                                           resumed_at):
    rows = prompt_rows(tmp_path / "p.jsonl", TASKS)
    state: dict[str, str] = {}
    for name in ("uninterrupted", "resumed"):
        save = tmp_path / name
        monkeypatch.setenv("TAU2_CURRICULUM_STATE_PATH", str(save / "curriculum_state.json"))
        fresh = slime_args(tiny_small_dir, rows, "127.0.0.1:1", extra=argv(save, "--start-rollout-id", "0"))
        assert fresh.custom_reward_post_process_path == POST_PROCESS
        with caplog.at_level(logging.WARNING, logger="tau2_rl_pipeline.slime_plugins.adapter"):
            if name == "uninterrupted":
                assert run(fresh, asynchronous) == 0
            else:
                assert run(fresh, asynchronous, kill_after=KILLED_AFTER) == 0
                killed = json.loads((save / "curriculum_state.json").read_text())
                assert killed["rollout"] == KILLED_AFTER  # the file holds rollouts the resumed run generates again
                # the stage script's rerun: the run's own save as --load, slime's start from its tracker
                assert (save / "latest_checkpointed_iteration.txt").read_text() == str(resumed_at - 1)
                resume = slime_args(tiny_small_dir, rows, "127.0.0.1:1", extra=argv(save, "--load", str(save)))
                assert run(resume, asynchronous) == resumed_at
        assert (save / "latest_checkpointed_iteration.txt").read_text() == str(ROLLOUTS - 1)
        state[name] = (save / "curriculum_state.json").read_text()
    assert state["resumed"] == state["uninterrupted"]
    assert '"groups_seen": 10' in state["resumed"]  # 5 rollouts of 2 groups, each counted once
    assert [r.getMessage() for r in caplog.records if "curriculum state" in r.getMessage()] == []
