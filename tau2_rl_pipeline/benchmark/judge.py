"""The LLM judge of tau2-bench 1.0.1's natural-language assertions (retail's `NL_ASSERTION` reward basis).

tau2 1.0.1 grades 39 of retail's 40 test tasks `DB x NL_ASSERTION`: its `NLAssertionsEvaluator` sends the
conversation and the task's assertions to a judge model (gpt-4.1-2025-04-14, temperature 0) and multiplies in
1.0 only if every assertion is met. tau2 offers no setting for that model and retries nothing itself; this
module is the judge client it calls instead (`tau2_version.install_judge`), keeping tau2's prompt, its parsing
and its reward combination:

- configured as the user simulator is: `TAU2_JUDGE_MODEL` a litellm model name (empty = tau2's own default),
  `TAU2_JUDGE_API_BASE` an OpenAI-compatible server (`openai/<served name>` + `http://host:port/v1`, e.g.
  scripts/start_judge.sh on SGLang);
- each call has a timeout (`TAU2_JUDGE_TIMEOUT_S`) and is retried with exponential backoff
  (`TAU2_JUDGE_MAX_RETRIES`, `TAU2_JUDGE_BACKOFF_S`) on errors, timeouts and answers it does not accept;
- which answers it accepts is `TAU2_JUDGE_ANSWERS`: `tau2` (the default) = exactly those tau2 1.0.1's own parsing
  grades (json.loads, `results` read with a default of [], each result made a pydantic NLAssertionCheck), which
  tau2 then grades itself, so an evaluation scores as the leaderboard's does: `{"results": []}` and an answer with
  no `results` score 1.0 (no assertion failed), `"true"` counts as true; an answer tau2's parsing raises on (not
  JSON, a result without its keys, `"maybe"`) is retried, where tau2 alone would stop the run. `strict` (for
  training rewards) accepts only a non-empty `results` list of `{expectedOutcome, reasoning, metExpectation}` with
  a real true/false verdict: a degenerate answer never passes an episode;
- a judge that fails for good raises `JudgeError`: the episode is aborted (recorded, never scored), exactly as
  when the user simulator fails;
- calls, failed attempts and tokens are counted per process (`Judge.usage`) and per episode (`episode_usage`).

Self-contained on purpose (one client, its settings, its counters) so it can later share a transport with the
other OpenAI-compatible clients of the project.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from tau2_rl_pipeline.config import Tau2Config

MAX_BACKOFF_S = 30.0


class JudgeError(RuntimeError):
    """The judge failed for good (every attempt errored, timed out or answered malformed): infrastructure."""


class JudgeConfigError(ValueError):
    """The judge cannot be reached as configured (e.g. no API key for a remote model)."""


@dataclass
class JudgeUsage:
    calls: int = 0  # judge answers used (one per judged episode)
    failed_attempts: int = 0  # attempts retried or given up: errors, timeouts, malformed answers
    prompt_tokens: int = 0  # over every attempt that got an answer
    completion_tokens: int = 0

    def add(self, other: JudgeUsage) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class JudgeSettings:
    model: str
    api_base: str = ""
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 1.0
    temperature: float = 0.0  # tau2's DEFAULT_LLM_NL_ASSERTIONS_TEMPERATURE: the grading, not a knob
    answers: str = "tau2"  # TAU2_JUDGE_ANSWERS: which answers are graded (tau2's own parsing, or strict)

    @classmethod
    def from_config(cls, cfg: Tau2Config) -> JudgeSettings:
        from tau2_rl_pipeline.benchmark.tau2_version import judge_default_model

        return cls(model=cfg.judge_model or judge_default_model() or "gpt-4.1-2025-04-14",
                   api_base=cfg.judge_api_base, timeout_s=cfg.judge_timeout_s, max_retries=cfg.judge_max_retries,
                   backoff_s=cfg.judge_backoff_s, answers=cfg.judge_answers)

    def litellm_args(self) -> dict[str, Any]:
        """Arguments of one litellm call; never a secret (litellm reads API keys from the environment)."""
        args: dict[str, Any] = {"temperature": self.temperature, "timeout": self.timeout_s, "num_retries": 0}
        if self.api_base:
            args["api_base"] = self.api_base
            if self.model.startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
                args["api_key"] = "EMPTY"  # a local server takes any key; litellm's openai/ route wants one
            args["extra_body"] = {"chat_template_kwargs": {"enable_thinking": False}}
        return args

    def public(self) -> dict[str, Any]:
        """What a run records about its judge (no key; the API base without credentials is the caller's job)."""
        return {"model": self.model, "api_base": self.api_base or None, "temperature": self.temperature,
                "answers": self.answers}


ANSWERS = ("tau2", "strict")  # TAU2_JUDGE_ANSWERS


def check_answer(content: str | None, answers: str = "tau2") -> str:
    """The judge's answer if it is accepted under `answers` (see the module docstring), else ValueError saying why."""
    if answers not in ANSWERS:
        raise ValueError(f"answers must be one of {', '.join(ANSWERS)}, got {answers!r}")
    if not content:
        raise ValueError("empty answer")
    return _strict(content) if answers == "strict" else _as_tau2_parses(content)


def _as_tau2_parses(content: str) -> str:
    """What tau2 1.0.1's NLAssertionsEvaluator does with the answer, short of grading it: ValueError where it raises."""
    from tau2.data_model.simulation import NLAssertionCheck

    try:
        results = json.loads(content).get("results", [])
        for r in results:
            NLAssertionCheck(nl_assertion=r["expectedOutcome"], met=r["metExpectation"], justification=r["reasoning"])
    except (AttributeError, KeyError, TypeError) as e:  # ValueError (bad JSON, pydantic's errors) passes as it is
        raise ValueError(f"tau2 cannot parse it ({type(e).__name__}: {e})") from None
    return content


def _strict(content: str) -> str:
    data = json.loads(content)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or not results:
        raise ValueError("no non-empty `results` list")
    for r in results:
        if not (isinstance(r, dict) and isinstance(r.get("metExpectation"), bool)
                and isinstance(r.get("expectedOutcome"), str) and isinstance(r.get("reasoning"), str)):
            raise ValueError("a result lacks expectedOutcome / reasoning / a true-or-false metExpectation")
    return content


_episode = threading.local()


@contextlib.contextmanager
def episode_usage() -> Iterator[JudgeUsage]:
    """Counts the judge calls made on this thread inside the block (one episode's evaluation)."""
    usage = JudgeUsage()
    outer = getattr(_episode, "usage", None)
    _episode.usage = usage
    try:
        yield usage
    finally:
        _episode.usage = outer


class Judge:
    """A judge client with retries and counters; `generate` has the signature tau2's evaluator calls."""

    def __init__(self, settings: JudgeSettings, *, completion: Callable[..., Any] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._completion = completion
        self._sleep = sleep
        self._lock = threading.Lock()
        self.usage = JudgeUsage()

    def _count(self, **delta: int) -> None:
        part = JudgeUsage(**delta)
        with self._lock:
            self.usage.add(part)
        local = getattr(_episode, "usage", None)
        if local is not None:
            local.add(part)

    def complete(self, messages: list[dict]) -> str:
        """The judge's checked answer to `messages`, retried with backoff; JudgeError when it fails for good."""
        completion = self._completion
        if completion is None:
            from litellm import completion
        s = self.settings
        last = ""
        for attempt in range(s.max_retries + 1):
            if attempt:
                self._sleep(min(MAX_BACKOFF_S, s.backoff_s * 2 ** (attempt - 1)))
            try:
                response = completion(model=s.model, messages=messages, **s.litellm_args())
            except Exception as e:  # noqa: BLE001 -- every failure of the call is retried, then reported
                last = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                self._count(failed_attempts=1)
                continue
            usage = getattr(response, "usage", None)
            tokens = {"prompt_tokens": int(getattr(usage, "prompt_tokens", 0) or 0),
                      "completion_tokens": int(getattr(usage, "completion_tokens", 0) or 0)}
            try:
                content = check_answer(response.choices[0].message.content, s.answers)
            except (ValueError, AttributeError, IndexError) as e:
                last = f"malformed answer: {e}"
                self._count(failed_attempts=1, **tokens)
                continue
            self._count(calls=1, **tokens)
            return content
        raise JudgeError(f"judge {s.model} failed after {s.max_retries + 1} attempts: {last}")

    def generate(self, model: str, messages: list, tools: Any = None, tool_choice: Any = None,
                 call_name: str | None = None, **kwargs: Any) -> Any:
        """tau2's `generate` as its NL-assertion evaluator calls it; `model` and kwargs (tau2's constants) are
        replaced by this judge's settings."""
        from tau2.data_model.message import AssistantMessage
        from tau2.utils.llm_utils import to_litellm_messages

        content = self.complete(to_litellm_messages(messages))
        return AssistantMessage(role="assistant", content=content)


_installed: Judge | None = None
_install_lock = threading.Lock()


def configure(cfg: Tau2Config, **kwargs: Any) -> Judge:
    """Route tau2's NL-assertion calls to a judge made from `cfg` (for tau2 without a judge: just make it). The
    installed judge is kept, with its counters, when `cfg` asks for the same settings: every episode calls this."""
    global _installed
    from tau2_rl_pipeline.benchmark import tau2_version

    settings = JudgeSettings.from_config(cfg)
    with _install_lock:
        if _installed is not None and _installed.settings == settings and not kwargs:
            return _installed
        judge = Judge(settings, **kwargs)
        if tau2_version.V1:
            tau2_version.install_judge(judge.generate)
        _installed = judge
    return judge


def configure_for(cfg: Tau2Config, tasks: Iterable[Any]) -> None:
    """This run's judge, configured where the run reads its config, when tau2 judges any of its `tasks`
    (NL assertions, tau2 1.0.1); a run with no judged task leaves the installed judge as it is."""
    from tau2_rl_pipeline.benchmark.tau2_version import needs_judge

    if any(needs_judge(t) for t in tasks):
        configure(cfg)


def active() -> Judge:
    """The installed judge; configured from the TAU2_* environment on first use when no entry point did, so that
    tau2's own unguarded judge call never runs."""
    return _installed or configure(Tau2Config.from_env())


def check_judge(cfg: Tau2Config) -> None:
    """Fail early, in one line, when a remote judge model has no API key (checked by name, never printed)."""
    if cfg.judge_api_base:
        return
    import litellm

    model = JudgeSettings.from_config(cfg).model
    missing = litellm.validate_environment(model=model).get("missing_keys") or []
    if missing:
        raise JudgeConfigError(
            f"tau2's NL-assertion judge {model!r} needs {', '.join(missing)} in the environment; set it, or point "
            "TAU2_JUDGE_API_BASE at an OpenAI-compatible server (scripts/start_judge.sh) with "
            "TAU2_JUDGE_MODEL=openai/<served name>")


__all__ = ["Judge", "JudgeConfigError", "JudgeError", "JudgeSettings", "JudgeUsage", "active", "check_answer",
           "check_judge", "configure", "episode_usage"]
