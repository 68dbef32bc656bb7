"""The refusal of a run that would train turns sampled by older weights as if on-policy, read from slime's own args.

The stage planner (tau2_rl_pipeline/launch) refuses such a run before it starts, by the same rule
(rollout/offpolicy.py's `unguarded_refusal`); a user who launches slime with their own argv never meets that check. The adapter's generate (and its fully async
rollout, before slime's worker starts) calls `refuse_unguarded` first, so the same argv given to slime directly
stops at its first episode with the same one line.

Turns sampled by weights older than the ones being trained reach the loss only where an episode can cross a
weight update: under `--partial-rollout` (a cut episode goes on in a later rollout) or in a fully asynchronous
rollout (`--rollout-function-path` naming slime's or this project's `generate_rollout_fully_async`, whose episodes
run on across updates). slime's PPO ratio uses log-probs the actor recomputes, so such turns are trained as if
on-policy unless `--mask-offpolicy-in-partial-rollout` takes them out of the loss (rollout/offpolicy.py) or
`--use-tis` weights them by the rollout log-probs. The AWSFT custom loss has no importance ratio: it needs the mask.
A synchronous run without partial rollout samples every episode with the weights it trains, and needs neither.
"""

from __future__ import annotations

from argparse import Namespace

from tau2_rl_pipeline.rollout.offpolicy import unguarded_refusal
from tau2_rl_pipeline.slime_plugins.awsft import is_awsft

ASYNC_ROLLOUT_NAME = "generate_rollout_fully_async"  # slime.rollout.fully_async_rollout's and adapter's


class UnguardedOffPolicy(ValueError):
    """slime's args would train turns sampled by older weights with nothing to correct them."""


def crosses_updates(args: Namespace) -> bool:
    """Whether an episode of this run can be sampled across a weight update (module docstring)."""
    rollout_fn = str(getattr(args, "rollout_function_path", None) or "")
    return bool(getattr(args, "partial_rollout", False)) or rollout_fn.rsplit(".", 1)[-1] == ASYNC_ROLLOUT_NAME


def refusal(args: Namespace) -> str | None:
    """The one-line reason slime's `args` must not run, or None (the rule: rollout/offpolicy.py)."""
    rollout_fn = str(getattr(args, "rollout_function_path", None) or "")
    return unguarded_refusal(partial_rollout=bool(getattr(args, "partial_rollout", False)),
                             fully_async=rollout_fn.rsplit(".", 1)[-1] == ASYNC_ROLLOUT_NAME,
                             masked=bool(getattr(args, "mask_offpolicy_in_partial_rollout", False)),
                             awsft=is_awsft(args), tis=bool(getattr(args, "use_tis", False)))


def refuse_unguarded(args: Namespace) -> None:
    """Raise UnguardedOffPolicy with the one line `refusal` gives, if any."""
    reason = refusal(args)
    if reason is not None:
        raise UnguardedOffPolicy(reason)
