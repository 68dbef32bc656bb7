"""Bounded staleness (GRPO_MAX_STALENESS, issue 32) through slime 624b824's real fully async worker: the project's
generate_rollout_fully_async over slime's AsyncRolloutWorker and data source, in train_async.py's order (rollout
r + 1 collected while step r trains, then the weight update: slime_harness.train_async_steps), slime's weight
updates through its own SGLangEngine calls with slime's own numbering (version 1 before the first rollout, one more
after each step), and slime's real log_rollout_data. With eta = 1 no trained token lags the weights training it by
more than one version and the rollout/staleness/* keys are in slime's logged row; unbounded, the worker runs ahead
and trains older ones; eta = 0 is refused there (it is the synchronous path's guarantee)."""

from __future__ import annotations

import pytest
from slime_harness import flat, prompt_rows, reset_slime, rollout, slime_args, train_async_steps
from test_slime_rollout import ASYNC_ROLLOUT, ROLLOUT_LOG, Script

from tau2_rl_pipeline.rollout.staleness import version_number

STEPS = 4


def _trained_lags(samples, trained: int) -> list[int]:
    """The staleness of every trained token, read from the sample's own books: its mask and each request's span
    and the weight version the server reported for it."""
    lags = []
    for s in samples:
        for (start, end), version in zip(s.metadata["turn_spans"], s.metadata["turn_versions"]):
            lags += [trained - version_number(version)] * sum(s.loss_mask[start:end])
    return lags


def _run(monkeypatch, loopback, tiny_small_dir, small_tokenizer, tmp_path, eta: str) -> list[dict]:
    from slime.observability import logging_utils
    from slime.observability.rollout_metrics import log_rollout_data

    reset_slime()
    monkeypatch.setenv("TAU2_MAX_STALENESS", eta)
    loopback.responder = Script(small_tokenizer)
    loopback.latency_s = 0.05
    # 4 groups of 2 may run at once (slime's worker takes up to 8 groups a wake-up, its semaphore 8 samples)
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1", "update_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--rollout-function-path", ASYNC_ROLLOUT, "--sglang-server-concurrency", "8",
                             "--use-tis", "--custom-rollout-log-function-path", ROLLOUT_LOG))
    rows: list[dict] = []
    monkeypatch.setattr(logging_utils, "log", lambda args, metrics, step_key: rows.append(dict(metrics)))
    steps = []
    for step, output in train_async_steps(args, STEPS, loopback, train_s=0.3):
        samples = flat(output.samples)
        log_rollout_data(step, args, samples, output.metrics, 1.0)
        steps.append({"lags": _trained_lags(samples, step + 1), "row": rows[-1], "samples": samples})
    reset_slime()
    return steps


@pytest.mark.parametrize("eta", [1, 2])
def test_eta_bounds_how_far_behind_a_trained_token_is(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                      small_tokenizer, tmp_path, eta):
    steps = _run(monkeypatch, loopback, tiny_small_dir, small_tokenizer, tmp_path, str(eta))
    for i, step in enumerate(steps):
        assert step["lags"] and max(step["lags"]) <= eta, (i, step["lags"])
        row = step["row"]
        assert row["rollout/step"] == i and row["rollout/staleness/bound"] == eta
        assert row["rollout/staleness/trained_version"] == i + 1
        assert row["rollout/staleness/max"] == max(step["lags"])
        histogram = {int(k.rsplit("_", 1)[1]): v for k, v in row.items() if k.startswith("rollout/staleness/tokens_at_")}
        assert histogram == {lag: float(step["lags"].count(lag)) for lag in set(step["lags"])}
        assert row["rollout/staleness/trained_tokens"] == len(step["lags"])
        assert "rollout/monitor/episodes" in row  # the same row as the project's monitors
        masked = sum(s.metadata["staleness"]["masked_tokens"] for s in step["samples"])
        assert row["rollout/staleness/masked_tokens"] == masked  # every token the bound took out is counted


def test_unbounded_the_worker_runs_ahead_and_trains_older_tokens(slime_env, monkeypatch, loopback, tiny_small_dir,
                                                                 small_tokenizer, tmp_path):
    """The contrast: with no bound slime's worker starts every group it has room for at its first wake-up, all with
    version 1, and the later rollouts train them: the bound above is what kept them out."""
    steps = _run(monkeypatch, loopback, tiny_small_dir, small_tokenizer, tmp_path, "-1")
    assert max(max(step["lags"]) for step in steps) >= 2
    assert steps[-1]["row"]["rollout/staleness/masked_tokens"] == 0.0  # unbounded: nothing masked, only measured


def test_eta_0_is_refused_in_the_fully_async_rollout(slime_env, monkeypatch, loopback, tiny_small_dir, tmp_path):
    """train_async.py collects every rollout after the first before the previous step's update, so eta = 0 could
    never admit the next rollout's groups; refused in one line before the worker starts. eta = 0 is the synchronous
    path's guarantee: train.py's rollout samples each episode with the weights that train it, and under
    --partial-rollout the mask takes out every older turn (test_partial_rollout.py)."""
    from tau2_rl_pipeline.slime_plugins.staleness import StalenessRefused

    monkeypatch.setenv("TAU2_MAX_STALENESS", "0")
    args = slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2,
                      extra=("--rollout-function-path", ASYNC_ROLLOUT, "--use-tis"))
    with pytest.raises(StalenessRefused, match=r"^TAU2_MAX_STALENESS=0 .*GRPO_ASYNC=0") as refused:
        rollout(args)
    assert "\n" not in str(refused.value) and loopback.count("/generate") == 0
