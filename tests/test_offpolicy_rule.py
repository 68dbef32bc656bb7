"""The off-policy rule as a pure function of slime's args (slime_plugins/offpolicy_guard.py), over plain Namespaces:
which rollout function may let an episode cross a weight update, what guards the loss, and the one line each
refusal or notice gives. tests/contract/test_offpolicy_guard.py runs the same rule through slime's parser and rollout
code."""

from __future__ import annotations

from argparse import Namespace

import pytest

from tau2_rl_pipeline.rollout.offpolicy import PROJECT_ASYNC_ROLLOUT, SLIME_ASYNC_ROLLOUT, SLIME_ROLLOUT
from tau2_rl_pipeline.slime_plugins.awsft import LOSS_FUNCTION_PATH
from tau2_rl_pipeline.slime_plugins.offpolicy_guard import (
    UnguardedOffPolicy,
    notice,
    refusal,
    refuse_unguarded,
)

SFT_ROLLOUT = "tau2_rl_pipeline.slime_plugins.sft.generate_rollout"
OWN = "my_pkg.rollout.run"
MASK, TIS = {"mask_offpolicy_in_partial_rollout": True}, {"use_tis": True}
AWSFT = {"loss_type": "custom_loss", "custom_loss_function_path": LOSS_FUNCTION_PATH}


def _args(function: str | None = None, **flags) -> Namespace:
    """slime's args as they matter here: its defaults, then `flags`."""
    return Namespace(**{"rollout_function_path": function, "partial_rollout": False,
                        "mask_offpolicy_in_partial_rollout": False, "use_tis": False, "loss_type": "policy_loss",
                        "custom_loss_function_path": None, **flags})


@pytest.mark.parametrize("function", [None, SLIME_ROLLOUT, SFT_ROLLOUT])
def test_a_synchronous_rollout_without_partial_rollout_needs_no_guard(function):
    assert refusal(_args(function)) is None and notice(_args(function)) is None
    refuse_unguarded(_args(function))  # raises nothing


@pytest.mark.parametrize("flags", [{}, TIS, MASK, {**MASK, **TIS, "partial_rollout": True}, AWSFT])
def test_slime_own_fully_async_rollout_is_refused_whatever_guards_the_loss(flags):
    line = refusal(_args(SLIME_ASYNC_ROLLOUT, **flags))
    assert line == (
        f"--rollout-function-path {SLIME_ASYNC_ROLLOUT} runs this project's generate without the staleness bound "
        "(TAU2_MAX_STALENESS) and without the abort-storm stop (slime's worker drops every group whose generate "
        f"raised and waits for ever): pass --rollout-function-path {PROJECT_ASYNC_ROLLOUT}, the same worker with both "
        "(GRPO_ASYNC_ROLLOUT_FUNCTION's default)")
    with pytest.raises(UnguardedOffPolicy, match="^--rollout-function-path slime.rollout.fully_async_rollout"):
        refuse_unguarded(_args(SLIME_ASYNC_ROLLOUT, **flags))


@pytest.mark.parametrize("function,flags,says", [
    (PROJECT_ASYNC_ROLLOUT, {}, "the fully async rollout without --mask-offpolicy-in-partial-rollout or --use-tis"),
    (None, {"partial_rollout": True}, "--partial-rollout without --mask-offpolicy-in-partial-rollout or --use-tis"),
    (OWN, {}, f"--rollout-function-path {OWN} (a rollout function this project does not know: its episodes may cross "
              "a weight update) without --mask-offpolicy-in-partial-rollout or --use-tis"),
    (OWN, {**TIS, **AWSFT}, f"--rollout-function-path {OWN} (a rollout function this project does not know"),
    (PROJECT_ASYNC_ROLLOUT, {**TIS, **AWSFT}, "the AWSFT custom loss never applies TIS"),
], ids=["project-async", "partial", "unknown", "unknown-awsft-tis", "project-async-awsft-tis"])
def test_episodes_that_may_cross_an_update_need_a_guard(function, flags, says):
    line = refusal(_args(function, **flags))
    assert line is not None and says in line and "\n" not in line, line


@pytest.mark.parametrize("function,flags", [
    (PROJECT_ASYNC_ROLLOUT, MASK), (PROJECT_ASYNC_ROLLOUT, TIS), (None, {"partial_rollout": True, **TIS}),
    (PROJECT_ASYNC_ROLLOUT, {**MASK, **AWSFT}), (OWN, MASK), (OWN, TIS)])
def test_guarded_runs_go_on(function, flags):
    assert refusal(_args(function, **flags)) is None


def test_a_guarded_rollout_function_the_project_does_not_know_is_named_in_one_line():
    assert notice(_args(OWN, **TIS)) == (
        f"--rollout-function-path {OWN} is not a rollout function this project knows: if its episodes run across "
        "weight updates, TAU2_MAX_STALENESS is not held and an abort storm may not stop the run "
        f"({PROJECT_ASYNC_ROLLOUT} holds both)")
    assert notice(_args(OWN)) is None  # refused instead: the refusal is the one line
    assert notice(_args(PROJECT_ASYNC_ROLLOUT, **TIS)) is None
