"""The refusal of an uncorrected off-policy run in Python (issue 32): slime's argv alone, parsed by slime's real
parse_args and run by slime's real rollout functions, stops at the adapter's first call with one line when episodes
can cross a weight update and neither --mask-offpolicy-in-partial-rollout nor --use-tis (AWSFT: the mask) guards
the loss; the guarded runs go on. No episode is started by a refused run.

slime's own fully async rollout function runs our generate inside its worker, which drops a group whose generate
raised: there the refusal stops the worker and slime's rollout raises it (issue 39), whatever guards the loss (the
staleness bound and the abort-storm stop do not hold under it). A rollout function the guard does not know is
refused unguarded and named in one line guarded."""

from __future__ import annotations

import logging
import threading

import pytest
from slime_harness import flat, prompt_rows, reset_slime, rollout, slime_args

from tau2_rl_pipeline.rollout.offpolicy import PROJECT_ASYNC_ROLLOUT, SLIME_ASYNC_ROLLOUT
from tau2_rl_pipeline.slime_plugins.awsft import LOSS_FUNCTION_PATH
from tau2_rl_pipeline.slime_plugins.offpolicy_guard import UnguardedOffPolicy

ASYNC_ROLLOUT = "tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async"
ASYNC = ("--rollout-function-path", ASYNC_ROLLOUT, "--sglang-server-concurrency", "1")
AWSFT = ("--loss-type", "custom_loss", "--custom-loss-function-path", LOSS_FUNCTION_PATH)


def _args(tiny_small_dir, loopback, tmp_path, extra):
    return slime_args(tiny_small_dir, prompt_rows(tmp_path / "p.jsonl", ["create_task_1"]),
                      loopback.base_url.removeprefix("http://"), batch=1, n=2, extra=extra)


@pytest.mark.parametrize("extra,says", [
    (("--partial-rollout",), "--partial-rollout without --mask-offpolicy-in-partial-rollout or --use-tis"),
    (ASYNC, "the fully async rollout without --mask-offpolicy-in-partial-rollout or --use-tis"),
    (("--partial-rollout", "--use-tis", *AWSFT), "the AWSFT custom loss never applies TIS"),
    ((*ASYNC, *AWSFT), "the AWSFT custom loss never applies TIS"),
], ids=["grpo-partial", "grpo-async", "awsft-partial-tis", "awsft-async"])
def test_an_unguarded_off_policy_argv_is_refused_in_one_line_at_the_first_call(
        slime_env, loopback, tiny_small_dir, tmp_path, extra, says):
    args = _args(tiny_small_dir, loopback, tmp_path, extra)
    with pytest.raises(UnguardedOffPolicy) as refused:
        rollout(args)
    reset_slime()
    message = str(refused.value)
    assert "\n" not in message and says in message, message
    assert loopback.count("/generate") == 0  # refused before any episode ran


@pytest.mark.parametrize("extra", [
    ("--partial-rollout", "--use-tis"),
    ("--partial-rollout", "--mask-offpolicy-in-partial-rollout"),
    (*ASYNC, "--use-tis"),
    (*ASYNC, "--partial-rollout", "--mask-offpolicy-in-partial-rollout", *AWSFT),
    (),  # synchronous, no partial rollout: every episode is sampled by the weights it trains
], ids=["partial-tis", "partial-mask", "async-tis", "awsft-async-mask", "sync"])
def test_guarded_or_on_policy_runs_go_on(slime_env, loopback, tiny_small_dir, tmp_path, extra):
    args = _args(tiny_small_dir, loopback, tmp_path, extra)
    samples = flat(rollout(args)[0])
    assert len(samples) == 2 and loopback.count("/generate") > 0


@pytest.mark.parametrize("guards", [
    (),
    ("--partial-rollout", "--mask-offpolicy-in-partial-rollout", "--use-tis"),  # the stage script's guards
], ids=["unguarded", "guarded"])
def test_slime_own_fully_async_rollout_stops_the_run_in_one_line(slime_env, loopback, tiny_small_dir, tmp_path,
                                                                  guards):
    """Before, slime's worker logged each refusal, dropped the group and started another: 312 refusals and 156 groups
    in 40 s, and the rollout never returned. Now slime's own rollout call raises the refusal, the worker stops having
    started only the groups of its first wake-up (its pool: 1 here), and no episode reaches the policy server."""
    from slime.rollout import fully_async_rollout
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    args = _args(tiny_small_dir, loopback, tmp_path,
                 ("--rollout-function-path", SLIME_ASYNC_ROLLOUT, "--sglang-server-concurrency", "1", *guards))
    source = RolloutDataSourceWithBuffer(args)
    outcome: list[BaseException | object] = []

    def call() -> None:
        try:
            outcome.append(rollout(args, 0, source))
        except BaseException as e:  # noqa: BLE001 - the outcome is what the test reads
            outcome.append(e)

    caller = threading.Thread(target=call, daemon=True)  # daemon: a rollout that never returns cannot hang pytest
    caller.start()
    caller.join(120)
    worker = fully_async_rollout._global_worker
    returned = not caller.is_alive()
    if worker is not None:
        worker.worker_thread.join(60)
    stopped = worker is not None and not worker.worker_thread.is_alive()
    reset_slime()
    assert returned, "slime's rollout did not return: the refusal was dropped with its group"
    assert isinstance(outcome[0], UnguardedOffPolicy), outcome[0]
    message = str(outcome[0])
    assert "\n" not in message and message.startswith(f"--rollout-function-path {SLIME_ASYNC_ROLLOUT} runs")
    assert f"pass --rollout-function-path {PROJECT_ASYNC_ROLLOUT}" in message
    assert stopped  # the worker took no further group
    assert source.sample_group_index == 1  # the one group of its first wake-up, none after
    assert loopback.count("/generate") == 0  # refused before any episode ran


def test_a_rollout_function_the_guard_does_not_know_is_refused_unguarded(slime_env, loopback, tiny_small_dir,
                                                                         tmp_path):
    args = _args(tiny_small_dir, loopback, tmp_path, ("--rollout-function-path", "slime_harness.own_rollout"))
    with pytest.raises(UnguardedOffPolicy) as refused:
        rollout(args)
    reset_slime()
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        "--rollout-function-path slime_harness.own_rollout (a rollout function this project does not know: its "
        "episodes may cross a weight update) without --mask-offpolicy-in-partial-rollout or --use-tis"), message
    assert loopback.count("/generate") == 0


def test_a_guarded_rollout_function_the_guard_does_not_know_runs_and_is_named_once(slime_env, loopback,
                                                                                   tiny_small_dir, tmp_path, caplog):
    args = _args(tiny_small_dir, loopback, tmp_path,
                 ("--rollout-function-path", "slime_harness.own_rollout", "--mask-offpolicy-in-partial-rollout"))
    with caplog.at_level(logging.WARNING, logger="tau2_rl_pipeline.slime_plugins.adapter"):
        samples = flat(rollout(args)[0])
    reset_slime()
    assert len(samples) == 2 and loopback.count("/generate") > 0
    lines = [r.getMessage() for r in caplog.records if "is not a rollout function this project knows" in r.getMessage()]
    assert lines == [
        "--rollout-function-path slime_harness.own_rollout is not a rollout function this project knows: if its "
        "episodes run across weight updates, TAU2_MAX_STALENESS is not held and an abort storm may not stop the run "
        f"({PROJECT_ASYNC_ROLLOUT} holds both)"]  # one line for the run, not one per episode
