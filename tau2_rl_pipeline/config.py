"""The one place that defines configuration.

Every knob is a field of `Tau2Config`, read from a documented `TAU2_*` environment variable (listed in
`configs/.env.template` and docs/recipes-and-settings.md) and overridable from CLI flags. A bad value is a one-line
`ConfigError` naming the variable. Secrets (API keys) are never fields: they are read from the
environment by litellm / huggingface-hub when used.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
import math
import os
import sys
import textwrap
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

ENV_PREFIX = "TAU2_"
CURRICULUM_MAX_WEIGHT = 5.0  # AWSFT's largest weight (learning/awsft.py MAX_WEIGHT): a larger curriculum weight saturates it
# TAU2_* variables read elsewhere than Tau2Config (configs/.env.template, "Other variables"): the scripts' layout
# and output directory, the tests', tau2's log level, and tau2-bench's own data directory.
OTHER_VARIABLES = ("TAU2_LOG_LEVEL", "TAU2_QWEN3_TOKENIZER", "TAU2_VENV", "TAU2_TEST_WORKERS", "TAU2_THIRD_PARTY",
                   "TAU2_GPU_LAYOUT", "TAU2_OUT_DIR", "TAU2_DATA_DIR")
# The user simulator's temperature when TAU2_USER_TEMPERATURE is unset: tau2's own (its user runs at 0), for every
# entry point and the stage scripts alike, so that a qualification made with the defaults (tau2-rl-qualify-user)
# covers a run made with them (eval/qualify_gate.py compares the two); set the variable for both to change it.
DEFAULT_USER_TEMPERATURE = 0.0
_warned: set[str] = set()


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the variable and says what is valid."""


def _meta(doc: str, *, choices: tuple[str, ...] | None = None, min_value: float | None = None,
          max_value: float | None = None) -> dict[str, Any]:
    return {"doc": doc, "choices": choices, "min": min_value, "max": max_value}


@dataclass(frozen=True)
class Tau2Config:
    # -- user simulator -------------------------------------------------------------------------
    user_model: str = field(default="gpt-4.1", metadata=_meta(
        "litellm model name of the user simulator (tau2's default gpt-4.1; at scale "
        "openai/Qwen/Qwen3-4B-Instruct-2507 served by scripts/start_user_sim.sh)"))
    user_api_base: str = field(default="", metadata=_meta(
        "API base of the user simulator, e.g. http://127.0.0.1:30001/v1 (a router's, or several servers' "
        "comma-separated: the async client spreads the load); empty = the provider default"))
    user_temperature: float = field(default=DEFAULT_USER_TEMPERATURE, metadata=_meta(
        "sampling temperature of the user simulator (tau2's 0 unless set; the stage scripts keep it, so a "
        "qualification and a run made with the defaults agree)", min_value=0.0, max_value=2.0))
    user_max_retries: int = field(default=4, metadata=_meta(
        "retries of a failed user-simulator call (errors, malformed answers, timeouts; the async client backs off "
        "between them) before the episode ends aborted; also tau2's re-asks of an empty answer", min_value=0))
    user_timeout_s: float = field(default=120.0, metadata=_meta(
        "seconds one user-simulator call may take before it is retried", min_value=0.1))
    user_client: str = field(default="auto", metadata=_meta(
        "how tau2's LLM user reaches its model: async = the project's client of an OpenAI-compatible "
        "/v1/chat/completions on the event loop, sending tau2's requests (a local server); litellm = tau2's own "
        "UserSimulator over litellm on worker threads (provider models: API keys, routing); auto = async when "
        "TAU2_USER_API_BASE is set and TAU2_USER_MODEL starts with openai/, else litellm (any TAU2_USER_STRATEGY "
        "runs over either)",
        choices=("auto", "async", "litellm")))
    user_max_in_flight: int = field(default=256, metadata=_meta(
        "user-simulator requests open at once through the async client, per rollout process", min_value=1))
    user_strategy: str = field(default="llm", metadata=_meta(
        "how the LLM user simulator writes each message (the original tau-bench's strategies): llm = tau2's "
        "own; react = a thought, then the message (the thought is stripped); verify = a second call checks the "
        "message against the scenario and regenerates when it does not fit; reflection = on a failed check, "
        "reflect, then retry", choices=("llm", "react", "verify", "reflection")))
    user_strategy_max_checks: int = field(default=2, metadata=_meta(
        "verify / reflection: checks of one user message; after this many failed checks the last message is "
        "kept", min_value=1))
    # -- LLM judge: tau2 1.0.1's NL assertions (judge.py) and the TAU2_USE_JUDGE reward (judge_reward.py) --
    judge_model: str = field(default="", metadata=_meta(
        "litellm model name of the judge (tau2 1.0.1's NL assertions, and the rubric reward of TAU2_USE_JUDGE); "
        "empty = tau2's default (gpt-4.1-2025-04-14); openai/<served name> with TAU2_JUDGE_API_BASE for a local "
        "server (scripts/start_judge.sh)"))
    judge_api_base: str = field(default="", metadata=_meta(
        "API base of the judge, e.g. http://127.0.0.1:30002/v1; empty = the provider default"))
    judge_timeout_s: float = field(default=120.0, metadata=_meta(
        "seconds one judge call may take before it is retried", min_value=0.1))
    judge_max_retries: int = field(default=4, metadata=_meta(
        "retries of a failed judge call (errors, timeouts, answers tau2 cannot parse) before the episode ends "
        "aborted", min_value=0))
    judge_backoff_s: float = field(default=1.0, metadata=_meta(
        "first wait before a judge retry, doubled each retry (at most 30 s)", min_value=0.0))
    judge_answers: str = field(default="tau2", metadata=_meta(
        "which NL-assertion judge answers are graded: tau2 = exactly those tau2 1.0.1 grades, as it grades them "
        "(an empty or missing results list scores 1.0, a \"true\" string counts as true: leaderboard-comparable); "
        "strict = only a non-empty results list of true/false verdicts, anything else retried, then the episode "
        "aborted (for training rewards)", choices=("tau2", "strict")))
    # -- episode ----------------------------------------------------------------------------------
    max_steps: int = field(default=200, metadata=_meta(
        "tau2's max_steps: orchestrator steps before the episode ends as max_steps", min_value=1))
    max_errors: int = field(default=10, metadata=_meta(
        "tau2's max_errors: failed tool calls (parse errors included) before the episode ends", min_value=1))
    max_turns: int = field(default=30, metadata=_meta(
        "policy turns (generate calls) per episode before it ends as truncated", min_value=1))
    max_context_len: int = field(default=32768, metadata=_meta(
        "prompt + response tokens per episode; longer ends the episode as truncated", min_value=16))
    fast_env: bool = field(default=True, metadata=_meta(
        "cheap tau2 environments (databases parsed once, copy-on-read records, cached hashes) for episodes and "
        "their evaluation; rewards identical to tau2's native path (bench/env_cost.py); off = tau2's own; "
        "banking_knowledge always runs tau2's own (no fast path for it)"))
    retrieval_variant: str = field(default="bm25", metadata=_meta(
        "tau2-bench 1.0.1 banking_knowledge's retrieval variant (tau2's --retrieval-config), for its episodes and "
        "their evaluation: bm25 = offline BM25 (needs rank_bm25); tau2's own default alltools needs "
        "OPENAI_API_KEY and a sandbox binary; a variant whose keys or binaries are missing is refused before a run"))
    episode_workers: int = field(default=-1, metadata=_meta(
        "threads for blocking episode work (tau2 tools, litellm user-simulator calls, evaluation) shared by all "
        "episodes in flight in one process; 0 = on the event loop (litellm refuses it); -1 = auto: 0 when no "
        "user turn blocks (the scripted user or the async user client) and fast_env is on (fastest, shortest "
        "event-loop stalls: bench/README.md P2, P5), else 64",
        min_value=-1))
    # -- policy server (engines.py) and aborted runs ---------------------------------------------
    engine_max_retries: int = field(default=4, metadata=_meta(
        "retries of a failed policy-server /generate call (refused, reset, 5xx, malformed, timed out) before the "
        "episode ends aborted", min_value=0))
    engine_timeout_s: float = field(default=120.0, metadata=_meta(
        "seconds one policy-server /generate call may take before it is retried", min_value=0.1))
    abort_storm_fraction: float = field(default=0.5, metadata=_meta(
        "slime runs: a rollout's worth of episodes counts as an abort storm when more than this fraction ended "
        "aborted by infrastructure failures", min_value=0.0, max_value=1.0))
    abort_storm_patience: int = field(default=2, metadata=_meta(
        "slime runs: consecutive abort-storm windows tolerated (each a rollout's worth of finished episodes: "
        "slime refills a rollout whose groups aborted, so one rollout can hold several); one more stops the run "
        "with the first error recorded (instead of training on empty masks)", min_value=0))
    max_staleness: int = field(default=-1, metadata=_meta(
        "asynchronous GRPO's bound eta (scripts/train_grpo.sh sets it from GRPO_MAX_STALENESS): no trained token "
        "comes from weights more than eta versions behind the weights training it; slime's fully async rollout "
        "starts new groups only while that can hold and masks, counted, the turns that still fall past it; "
        "-1 = unbounded (slime's own behaviour; the stage script passes 1, bench/README.md P12); 0 is refused there "
        "(train_async.py is always one version behind: eta = 0 is the synchronous path)", min_value=-1))
    partial_resume: bool = field(default=True, metadata=_meta(
        "slime runs with --partial-rollout: an episode cut by the rollout (slime's end-of-rollout abort, or a weight "
        "update's pause in the fully async rollout) goes on where it was cut when slime hands its sample back (tau2 "
        "state, tokens and log-probs kept); off = it starts again"))
    slime_gc_policy: bool = field(default=False, metadata=_meta(
        "slime runs: apply the rollout GC policy (rollout/gc_policy.py: freeze what is loaded, rarer full passes) "
        "in slime's rollout actor at its first episode, for the rest of that process; off = slime's collector is "
        "left as it is (the project's own CLIs and eval shards always apply it)"))
    # -- reward shaping (reward.py) ---------------------------------------------------------------
    use_partial_credit: bool = field(default=True, metadata=_meta(
        "add alpha * partial score to the task reward; off = no partial-score term"))
    partial_weights: tuple[float, ...] = field(default=(0.5, 0.15, 0.35, 0.0), metadata=_meta(
        "partial-score weights action,communicate,env_assertion,db (averaged over the components a "
        "RewardInfo has)"))
    telecom_partial_weights: tuple[float, ...] = field(default=(0.35, 0.35, 0.30, 0.0), metadata=_meta(
        "partial-score weights for telecom (dual control: the user acts, so talking counts more)"))
    use_telecom_weights: bool = field(default=True, metadata=_meta(
        "score telecom with TAU2_TELECOM_PARTIAL_WEIGHTS; off = every domain uses TAU2_PARTIAL_WEIGHTS"))
    reward_alpha: float = field(default=0.25, metadata=_meta(
        "alpha: shaped = task reward + alpha * domain multiplier * partial score", min_value=0.0))
    use_domain_alpha: bool = field(default=True, metadata=_meta(
        "scale alpha by the domain multiplier (TAU2_ALPHA_MULT_*); off = alpha for every domain"))
    alpha_mult_retail: float = field(default=0.8, metadata=_meta(
        "alpha multiplier for retail", min_value=0.0))
    alpha_mult_airline: float = field(default=1.0, metadata=_meta(
        "alpha multiplier for airline (other domains, e.g. mock, use 1.0)", min_value=0.0))
    alpha_mult_telecom: float = field(default=1.6, metadata=_meta(
        "alpha multiplier for telecom (more partial credit for its dual-control turns)", min_value=0.0))
    format_penalty: float = field(default=0.0, metadata=_meta(
        "subtracted from the shaped reward per parse error or refused tool call in the episode; 0 = off",
        min_value=0.0))
    format_penalty_max: float = field(default=0.5, metadata=_meta(
        "the most the format penalty takes from one episode's shaped reward", min_value=0.0))
    use_judge: bool = field(default=False, metadata=_meta(
        "score each finished conversation with an LLM judge's rubric and add it as the partial score's judge "
        "component (needs TAU2_JUDGE_MODEL and TAU2_JUDGE_API_BASE; timeout, retries and backoff are the "
        "TAU2_JUDGE_* ones); a judge that fails after retries aborts the episode, never scores it"))
    judge_weight: float = field(default=0.2, metadata=_meta(
        "weight of the judge component beside the TAU2_PARTIAL_WEIGHTS components", min_value=0.0))
    # -- GRPO advantages and curriculum (reward.py, curriculum.py) -------------------------------
    use_curriculum: bool = field(default=True, metadata=_meta(
        "the original cookbook's curriculum switch: off = every task weighs 1.0 and tasks are drawn uniformly "
        "(counts are still kept and saved)"))
    grpo_std_normalization: bool = field(default=True, metadata=_meta(
        "divide group-centred rewards by the group's std + 1e-6 (off = Dr. GRPO, mean-centring only)"))
    awsft_reward: str = field(default="task", metadata=_meta(
        "the reward AWSFT's advantage A = r - V* reads (GRPO_ALGORITHM=awsft / --algorithm awsft): task = tau2's "
        "binary task reward (1 on success, else 0), the recipe's and the scale of V*, the reference's pass rate; "
        "shaped = the shaped reward (partial credit, format penalty) against the same V*, which ranks failures "
        "by what they got right (docs/recipes-and-settings.md: when it helps)", choices=("task", "shaped")))
    loss_reduction: str = field(default="sample_mean", metadata=_meta(
        "how the GRPO and AWSFT losses average over an optimizer step, on both paths: sample_mean = slime's "
        "default, the mean over samples of each sample's token mean; token_mean = every trained token weighs the "
        "same (slime's --calculate-per-token-loss, which scripts/train_grpo.sh then passes); SFT is token_mean",
        choices=("sample_mean", "token_mean")))
    filter_zero_std: bool = field(default=False, metadata=_meta(
        "drop (remove_sample; slime's dynamic filter, reason zero_std) groups whose valid rewards are all equal: "
        "they carry no GRPO signal. Groups with no valid sample are dropped whatever this says (all_aborted)"))
    filter_keep_when_insufficient: bool = field(default=False, metadata=_meta(
        "slime's dynamic filter: keep a group without signal when dropping it would leave too few to fill the "
        "rollout batch (no extra over-sampling round)"))
    apply_curriculum_weights: bool = field(default=True, metadata=_meta(
        "multiply advantages by the task's curriculum weight (solved / hard / 1.0)"))
    curriculum_min_attempts: int = field(default=5, metadata=_meta(
        "attempts of a task before its curriculum weight departs from 1.0", min_value=1))
    curriculum_solved_threshold: float = field(default=0.75, metadata=_meta(
        "success rate above which a task counts as solved", min_value=0.0, max_value=1.0))
    curriculum_hard_threshold: float = field(default=0.25, metadata=_meta(
        "success rate below which a task counts as hard", min_value=0.0, max_value=1.0))
    curriculum_solved_weight: float = field(default=0.1, metadata=_meta(
        "advantage weight of a solved task (at most 5, AWSFT's largest weight: above it every success of the task "
        "would weigh the same 5)", min_value=0.0, max_value=CURRICULUM_MAX_WEIGHT))
    curriculum_hard_weight: float = field(default=0.5, metadata=_meta(
        "advantage weight of a hard task (at most 5, as the solved one; above 1 it raises GRPO's advantages and "
        "AWSFT's successes, never an AWSFT failure's weight)", min_value=0.0, max_value=CURRICULUM_MAX_WEIGHT))
    curriculum_persist: bool = field(default=True, metadata=_meta(
        "save the curriculum counts (atomic JSON) after every rollout and restore them on resume as they stood at "
        "the checkpoint (slime: the rollouts after it, generated again, count once)"))
    curriculum_state_path: str = field(default="", metadata=_meta(
        "file for the curriculum counts; empty = curriculum_state.json in the checkpoint directory"))
    task_sampler: str = field(default="uniform", metadata=_meta(
        "how tasks are drawn: uniform, or learning_value (in proportion to p(1-p), p the smoothed "
        "success rate)", choices=("uniform", "learning_value")))
    sampler_floor: float = field(default=0.05, metadata=_meta(
        "least learning-value weight, so solved and unsolved tasks are still drawn (> 0)",
        max_value=0.25))
    grpo_min_pass_rate: float = field(default=0.0, metadata=_meta(
        "difficulty filter: GRPO trains on tasks whose RFT-sampling pass rate is at least this", min_value=0.0,
        max_value=1.0))
    grpo_max_pass_rate: float = field(default=1.0, metadata=_meta(
        "difficulty filter: and at most this (e.g. 0.85 drops the nearly always solved tasks); 0 and 1 keep all",
        min_value=0.0, max_value=1.0))

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Tau2Config:
        """Defaults, then `TAU2_*` variables, then explicit overrides (CLI flags); validated."""
        environ = os.environ if environ is None else environ
        warn_unknown_variables(environ)
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = env_var(f.name)
            if name in environ:
                values[f.name] = _parse(name, environ[name], hints[f.name])
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in hints:
                raise ConfigError(f"unknown config field {key!r}; valid: {', '.join(sorted(hints))}")
            values[key] = value
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{env_var(f.name)}={value!r} must be a finite number")
            choices, lo, hi = f.metadata.get("choices"), f.metadata.get("min"), f.metadata.get("max")
            if choices and value not in choices:
                raise ConfigError(f"{env_var(f.name)}={value!r} is not one of: {', '.join(choices)}")
            if lo is not None and value < lo:
                raise ConfigError(f"{env_var(f.name)}={value!r} must be >= {lo}")
            if hi is not None and value > hi:
                raise ConfigError(f"{env_var(f.name)}={value!r} must be <= {hi}")
        for name in ("partial_weights", "telecom_partial_weights"):
            weights = getattr(self, name)
            if (len(weights) != 4 or not all(math.isfinite(w) and w >= 0 for w in weights)
                    or sum(weights) <= 0):
                raise ConfigError(f"{env_var(name)}={','.join(map(str, weights))!r} must be 4 non-negative "
                                  "numbers action,communicate,env_assertion,db with a positive sum")
        if self.curriculum_hard_threshold >= self.curriculum_solved_threshold:
            raise ConfigError(f"{env_var('curriculum_hard_threshold')}={self.curriculum_hard_threshold!r} must be "
                              f"below {env_var('curriculum_solved_threshold')}={self.curriculum_solved_threshold!r}")
        if self.grpo_min_pass_rate > self.grpo_max_pass_rate:
            raise ConfigError(f"{env_var('grpo_min_pass_rate')}={self.grpo_min_pass_rate!r} must not exceed "
                              f"{env_var('grpo_max_pass_rate')}={self.grpo_max_pass_rate!r}")
        if self.use_judge and not (self.judge_model and self.judge_api_base):
            raise ConfigError(f"{env_var('use_judge')}=1 needs {env_var('judge_model')} and "
                              f"{env_var('judge_api_base')} (an OpenAI-compatible server)")
        if self.sampler_floor <= 0:
            raise ConfigError(f"{env_var('sampler_floor')}={self.sampler_floor!r} must be > 0 "
                              "(a zero weight would never draw a solved task again)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def env_var(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def unknown_variable_warnings(environ: Mapping[str, str]) -> list[str]:
    """One line for each TAU2_* variable that nothing reads (a typo is otherwise silently ignored), naming the
    closest known variable."""
    known = sorted({env_var(f.name) for f in fields(Tau2Config)} | set(OTHER_VARIABLES))
    lines = []
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "the known ones are in configs/.env.template"
        lines.append(f"warning: {name} is not a setting of this cookbook and is ignored; {hint}")
    return lines


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """Print `unknown_variable_warnings` to stderr, each variable once per process."""
    for line in unknown_variable_warnings(environ):
        name = line.split()[1]
        if name not in _warned:
            _warned.add(name)
            print(line, file=sys.stderr)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse(name: str, raw: str, typ: Any) -> Any:
    text = raw.strip()
    try:
        if typ is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typing.get_origin(typ) is tuple:
            return tuple(float(x) for x in text.split(","))
        return text
    except ValueError:
        if typ is bool:
            kind = "true/false"
        elif typing.get_origin(typ) is tuple:
            kind = "comma-separated list of numbers"
        else:
            kind = getattr(typ, "__name__", str(typ))
        raise ConfigError(f"{name}={raw!r} is not a valid {kind}") from None


def _parse_tuple(name: str, raw: str) -> tuple[float, ...]:
    """A tuple-of-floats flag (--help-config's flags), read as its TAU2_* variable would be."""
    return _parse(name, raw, tuple[float, ...])


@dataclass(frozen=True)
class Bounded:
    """An argparse `type=`: a number of `kind` within its bounds, or refused while the command line is parsed, before
    anything starts, in one line that names the option (argparse's prefix) and the rule. Every numeric option of the
    installed commands is one of these (tests/test_number_options.py holds them to it)."""

    kind: type = int  # int or float
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    multiple_of: int | None = None
    also: tuple[float, ...] = ()  # values allowed outside the bounds (e.g. -1 = off)
    why: str = ""  # the reason for a rule that is not obvious, said with it

    @property
    def rule(self) -> str:
        low = (f">= {self.at_least:g}" if self.at_least is not None else
               f"> {self.above:g}" if self.above is not None else None)
        parts = [p for p in (low, f"<= {self.at_most:g}" if self.at_most is not None else None) if p]
        if self.multiple_of:
            parts.append(f"a multiple of {self.multiple_of}")
        noun = "a whole number" if self.kind is int else "a number"
        text = f"{noun} {' and '.join(parts)}" if parts else noun
        if self.also:
            text = f"{' or '.join(f'{v:g}' for v in self.also)} or {text}"
        return f"{text} ({self.why})" if self.why else text

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {self.rule}, got {text!r}") from None
        if value in self.also:
            return value
        if not (math.isfinite(value)
                and (self.at_least is None or value >= self.at_least)
                and (self.above is None or value > self.above)
                and (self.at_most is None or value <= self.at_most)
                and (not self.multiple_of or value % self.multiple_of == 0)):
            raise argparse.ArgumentTypeError(f"must be {self.rule}, got {text!r}")
        return value


COUNT = Bounded(int, at_least=1)  # how many of something: at least one
SEED = Bounded(int, at_least=0)
TEMPERATURE = Bounded(float, at_least=0.0, why="0 = greedy")
LEARNING_RATE = Bounded(float, above=0.0)


def config_help() -> str:
    """Every config flag with its variable, default and meaning (what --help-config prints)."""
    lines = ["tau2 config: each flag overrides its TAU2_* variable (configs/.env.template), which overrides the default"]
    for f in fields(Tau2Config):
        default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else f.default
        flag = "--" + f.name.replace("_", "-")
        if typing.get_type_hints(Tau2Config)[f.name] is bool:
            flag = f"{flag} / --no-{f.name.replace('_', '-')}"
        lines.append(f"  {flag}  ({env_var(f.name)}, default {default!r})")
        lines += textwrap.wrap(f.metadata["doc"], 110, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help on one screen: the help text beside each flag, and no "(default: None)"."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        super().__init__(prog, max_help_position=36, **kwargs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings and not any(
                action.default is v for v in (None, False, argparse.SUPPRESS)):
            action = copy.copy(action)  # a flag without help still shows its default
            action.help = "default: %(default)s"
        return super()._format_action(action)


class CommandParser(argparse.ArgumentParser):
    """`--help` on one screen: the options a first run needs. Groups added with `more=True` (tuning, sampling, ...)
    show under `--help-all` only; `--help` ends by saying how many there are."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._more: list[argparse._ArgumentGroup] = []
        self._show_all = False
        self.reads_config = False  # add_config_args sets it: --help-config lists the settings, else says there are none
        self.add_argument("--help-all", action=_HelpAll)
        self.add_argument("--help-config", action=_HelpConfig)

    def error(self, message: str) -> typing.NoReturn:
        """A bad command line in one line (argparse's usage block left out: --help has it)."""
        self.exit(2, f"{self.prog}: error: {message}\n")

    def add_argument_group(self, *args: Any, more: bool = False, **kwargs: Any) -> argparse._ArgumentGroup:
        group = super().add_argument_group(*args, **kwargs)
        if more:
            self._more.append(group)
        return group

    def format_help(self) -> str:
        hidden = [] if self._show_all else [a for g in self._more for a in g._group_actions
                                              if a.help is not argparse.SUPPRESS]
        saved = [a.help for a in hidden]
        descriptions = [g.description for g in self._more]
        for action in hidden:
            action.help = argparse.SUPPRESS
        if hidden:
            for group in self._more:
                group.description = None
        try:
            text = super().format_help()
        finally:
            for action, help_text in zip(hidden, saved):
                action.help = help_text
            for group, description in zip(self._more, descriptions):
                group.description = description
        if hidden:
            text += f"\n--help-all also lists {len(hidden)} more options ({', '.join(g.title for g in self._more)})\n"
        return text


class _HelpAll(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="every option, the tuning ones too, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        parser._show_all = True
        parser.print_help()
        parser.exit()


def command_parser(prog: str, description: str, epilog: str | None = None,
                   formatter_class: type[argparse.HelpFormatter] = HelpFormatter) -> CommandParser:
    """The parser of an installed command (pyproject's [project.scripts]): `prog [options]`, help on one screen."""
    return CommandParser(prog=prog, usage="%(prog)s [options]", description=description, epilog=epilog,
                         formatter_class=formatter_class)


class _HelpConfig(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="list every TAU2_* setting as a flag and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(parser, "reads_config", True):
            print(config_help())
        else:
            print(f"{parser.prog} reads no TAU2_* setting: --help-all lists all its options")
        parser.exit()


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Expose every config field as a `--flag` (default None = keep the env/default value). They are left out of
    --help, which stays one screen; --help-config lists them."""
    hints = typing.get_type_hints(Tau2Config)
    if isinstance(parser, CommandParser):
        parser.reads_config = True
    else:
        parser.add_argument("--help-config", action=_HelpConfig)
    for f in fields(Tau2Config):
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        if typ is bool:
            parser.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction,
                                help=argparse.SUPPRESS)
        elif typing.get_origin(typ) is tuple:
            parser.add_argument(flag, dest=f.name, default=None,
                                type=functools.partial(_parse_tuple, env_var(f.name)),
                                help=argparse.SUPPRESS)
        elif typ in (int, float):  # the field's own bounds, so that a bad flag is refused as it is parsed
            parser.add_argument(flag, dest=f.name, default=None, help=argparse.SUPPRESS, type=Bounded(
                typ, at_least=f.metadata.get("min"), at_most=f.metadata.get("max")))
        else:
            parser.add_argument(flag, dest=f.name, default=None, type=typ, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Tau2Config:
    names = {f.name for f in fields(Tau2Config)}
    overrides = {k: v for k, v in vars(args).items() if k in names}
    return Tau2Config.from_env(environ, **overrides)
