"""The off-policy guard inside the run: rollout/offpolicy.py's rule, read from slime's own args.

The rule refuses a run that would train turns sampled by older weights as if on-policy, or outside the staleness
bound; the stage planner (tau2_rl_pipeline/launch) applies the same function to the argv it builds.

A user who launches slime with their own argv meets it in
the adapter: its fully async rollout calls `refuse_unguarded` before slime's worker starts, its generate at its
first call (before any episode). Under slime's own worker a generate that raises only loses its group (the worker
logs it and starts another, for ever), so there the adapter stops the worker and makes slime's rollout raise the
refusal: the run stops, in one line.

Turns sampled by weights older than the ones being trained reach the loss only where an episode can cross a weight
update: under `--partial-rollout` (a cut episode goes on in a later rollout) or in a fully asynchronous rollout
(this project's `generate_rollout_fully_async`, whose episodes run on across updates). slime's PPO ratio uses
log-probs the actor recomputes, so such turns are trained as if on-policy unless
`--mask-offpolicy-in-partial-rollout` takes them out of the loss (rollout/offpolicy.py) or `--use-tis` weights them
by the rollout log-probs. The AWSFT custom loss has no importance ratio: it needs the mask. A synchronous run
without partial rollout samples every episode with the weights it trains, and needs neither.

Which rollout function runs decides the rest:
- slime's own `slime.rollout.fully_async_rollout.generate_rollout_fully_async` is refused whatever guards the loss:
  under it the staleness bound (TAU2_MAX_STALENESS, staleness.py) admits and masks nothing and an abort storm never
  stops the run (its worker drops a failing group and waits for groups that never come). The project's
  `generate_rollout_fully_async` is that same worker with both.
- slime's synchronous `generate_rollout` and the project's SFT rollout return only when every episode they started
  has ended (train_async.py awaits the rollout before each weight update): no episode crosses an update there.
- Any other function may run episodes across updates for all this module can tell: refused unless the mask or TIS
  guards the loss (the mask takes nothing out of an on-policy run), and named in one line (`notice`) when guarded,
  because the staleness bound and the abort-storm stop are not known to hold under it.
"""

from __future__ import annotations

from argparse import Namespace

from tau2_rl_pipeline.rollout.offpolicy import (
    KNOWN_ROLLOUTS,
    PROJECT_ASYNC_ROLLOUT,
    SLIME_ROLLOUT,
    unguarded_refusal,
)
from tau2_rl_pipeline.slime_plugins.awsft import is_awsft


class UnguardedOffPolicy(ValueError):
    """slime's args would train turns sampled by older weights with nothing to correct them, or unbounded."""


def rollout_function(args: Namespace) -> str:
    """The dotted path of the rollout function slime runs (its default when the argv names none)."""
    return str(getattr(args, "rollout_function_path", None) or SLIME_ROLLOUT)


def known(args: Namespace) -> bool:
    """Whether this module knows whether the run's rollout function lets an episode cross a weight update."""
    return rollout_function(args) in KNOWN_ROLLOUTS


def refusal(args: Namespace) -> str | None:
    """The one-line reason slime's `args` must not run, or None (rollout/offpolicy.py's rule, on slime's args)."""
    return unguarded_refusal(partial_rollout=bool(getattr(args, "partial_rollout", False)),
                             rollout_function=rollout_function(args),
                             masked=bool(getattr(args, "mask_offpolicy_in_partial_rollout", False)),
                             awsft=is_awsft(args), tis=bool(getattr(args, "use_tis", False)))


def notice(args: Namespace) -> str | None:
    """The one line a run that may go on still deserves: a rollout function this module does not know."""
    if known(args) or refusal(args) is not None:
        return None
    return (f"--rollout-function-path {rollout_function(args)} is not a rollout function this project knows: if its "
            "episodes run across weight updates, TAU2_MAX_STALENESS is not held and an abort storm may not stop the "
            f"run ({PROJECT_ASYNC_ROLLOUT} holds both)")


def refuse_unguarded(args: Namespace) -> None:
    """Raise UnguardedOffPolicy with the one line `refusal` gives, if any."""
    reason = refusal(args)
    if reason is not None:
        raise UnguardedOffPolicy(reason)
