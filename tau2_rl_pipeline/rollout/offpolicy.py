"""Which of an episode's sampled tokens older weights drew, from the weight version SGLang reports per request.

A multi-turn episode can outlive a weight update: in slime's fully asynchronous rollout the trainer updates the
engines while episodes are in flight (a request in flight is aborted and the episode goes on after the update; one
waiting on its user or a tool simply sends its next turn to the new weights), and under partial rollout a cut
episode goes on in a later rollout. Its earlier turns were then sampled by weights the loss no longer has, and
slime's PPO ratio, computed from log-probs the actor recomputes, cannot tell them apart (only TIS reads the rollout
log-probs). `mask_older_turns` takes every request whose weight version is not the episode's last out of the loss,
so that under `--mask-offpolicy-in-partial-rollout` no token sampled by older weights is trained, whatever the
rollout mode. Pure bookkeeping over the Trajectory's per-request spans and meta.
"""

from __future__ import annotations

from collections.abc import Sequence


def mask_older_turns(loss_mask: Sequence[int], spans: Sequence[tuple[int, int]],
                     versions: Sequence[str | None]) -> list[int]:
    """`loss_mask` with the tokens of every request whose weight version differs from the last request's set to 0.

    `spans[i]` is request i's [start, end) in the response, `versions[i]` the weight version the server reported
    for it (None: not reported). Where any version is unknown nothing can be told, and the mask is returned as is.
    """
    if len(spans) != len(versions):
        raise ValueError(f"{len(spans)} request spans but {len(versions)} weight versions")
    out = list(loss_mask)
    if not versions or any(v is None for v in versions):
        return out
    newest = versions[-1]
    for (start, end), version in zip(spans, versions):
        if version != newest:
            out[start:end] = [0] * (end - start)
    return out


def versions_of(turn_meta: Sequence[dict]) -> list[str | None]:
    """Each request's weight version as SGLang reported it (meta_info.weight_version), None where it did not."""
    return [None if m.get("weight_version") is None else str(m["weight_version"]) for m in turn_meta]


SLIME_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"  # slime's default --rollout-function-path
SLIME_ASYNC_ROLLOUT = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
PROJECT_ASYNC_ROLLOUT = "tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async"
SYNCHRONOUS_ROLLOUTS = (SLIME_ROLLOUT, "tau2_rl_pipeline.slime_plugins.sft.generate_rollout")
KNOWN_ROLLOUTS = (*SYNCHRONOUS_ROLLOUTS, SLIME_ASYNC_ROLLOUT, PROJECT_ASYNC_ROLLOUT)


def unguarded_refusal(*, partial_rollout: bool, rollout_function: str, masked: bool, awsft: bool,
                      tis: bool) -> str | None:
    """The one-line reason a run must not start, or None: the off-policy rule itself, pure, so the stage planner (on
    the argv it builds) and the in-run guard (slime_plugins/offpolicy_guard.py, on slime's args) apply the same one.

    Turns sampled by older weights reach the loss only where an episode can cross a weight update: under
    `partial_rollout`, or in a rollout function that runs episodes across updates (the project's fully async one; one
    this project does not know may). The mask takes them out, TIS corrects them, except under AWSFT, whose loss has no
    importance ratio. slime's own fully async rollout is refused whatever guards the loss: under it the staleness
    bound admits and masks nothing and an abort storm never stops the run."""
    if rollout_function == SLIME_ASYNC_ROLLOUT:
        return (f"--rollout-function-path {SLIME_ASYNC_ROLLOUT} runs this project's generate without the staleness "
                "bound (TAU2_MAX_STALENESS) and without the abort-storm stop (slime's worker drops every group whose "
                f"generate raised and waits for ever): pass --rollout-function-path {PROJECT_ASYNC_ROLLOUT}, the same "
                "worker with both (GRPO_ASYNC_ROLLOUT_FUNCTION's default)")
    if masked:
        return None
    if partial_rollout:
        mode = "--partial-rollout"
    elif rollout_function == PROJECT_ASYNC_ROLLOUT:
        mode = "the fully async rollout"
    elif rollout_function in SYNCHRONOUS_ROLLOUTS:
        return None
    else:
        mode = (f"--rollout-function-path {rollout_function} (a rollout function this project does not know: its "
                "episodes may cross a weight update)")
    if awsft:
        return (f"{mode} without --mask-offpolicy-in-partial-rollout would train turns sampled by older weights with "
                "nothing to correct them: the AWSFT custom loss never applies TIS; pass "
                "--mask-offpolicy-in-partial-rollout (GRPO_MASK_OFFPOLICY=1)")
    if not tis:
        return (f"{mode} without --mask-offpolicy-in-partial-rollout or --use-tis would train turns sampled by older "
                "weights as if on-policy (slime's PPO ratio ignores the rollout log-probs): pass "
                "--mask-offpolicy-in-partial-rollout or --use-tis (GRPO_MASK_OFFPOLICY=1 or GRPO_USE_TIS=1)")
    return None
