"""The refusal of an uncorrected off-policy run in Python (issue 32): slime's argv alone, parsed by slime's real
parse_args and run by slime's real rollout functions, stops at the adapter's first call with one line when episodes
can cross a weight update and neither --mask-offpolicy-in-partial-rollout nor --use-tis (AWSFT: the mask) guards
the loss; the guarded runs go on. No episode is started by a refused run."""

from __future__ import annotations

import pytest
from slime_harness import flat, prompt_rows, reset_slime, rollout, slime_args

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
