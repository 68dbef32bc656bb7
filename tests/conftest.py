"""Shared fixtures: the real Qwen3 tokenizer, tiny random Qwen3 models, an in-process engine, a loopback server.

Models are built once per test session in a temporary directory (about a second each on CPU).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tiers

import tau2_rl_pipeline  # noqa: F401  (sets LITELLM_LOCAL_MODEL_COST_MAP before anything imports litellm)

REPO_ROOT = Path(__file__).resolve().parents[1]
# The test rigs (tests/support) are importable as `support` here and in every child a test starts.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO_ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
QWEN3_TOKENIZER_ENV = "TAU2_QWEN3_TOKENIZER"


def qwen3_tokenizer_path() -> Path | None:
    """$TAU2_QWEN3_TOKENIZER, else ../shared/tokenizers/qwen3 beside the repository; None when neither exists."""
    candidates = [Path(os.environ[QWEN3_TOKENIZER_ENV])] if os.environ.get(QWEN3_TOKENIZER_ENV) else []
    candidates.append(REPO_ROOT.parent / "shared" / "tokenizers" / "qwen3")
    return next((c for c in candidates if (c / "tokenizer.json").is_file()), None)


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3-4B-Instruct-2507 tokenizer (skips the test when it is not available)."""
    path = qwen3_tokenizer_path()
    if path is None:
        pytest.skip(f"needs the Qwen3 tokenizer: set {QWEN3_TOKENIZER_ENV}=DIR (a directory with the "
                    "tokenizer.json and tokenizer_config.json of Qwen/Qwen3-4B-Instruct-2507) or put those files "
                    "at ../shared/tokenizers/qwen3 beside the repository")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_tokenizer: Any) -> Path:
    """A tiny random Qwen3 with the real Qwen3 tokenizer (151669-way vocabulary): inference-only tests."""
    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny-qwen3", qwen3_tokenizer)


@pytest.fixture(scope="session")
def small_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A byte-level BPE tokenizer trained on tau2's mock domain, with Qwen3's markers and chat template."""
    from tau2_rl_pipeline.local.tiny_model import domain_corpus, train_small_tokenizer

    return train_small_tokenizer(domain_corpus(["mock"]), tmp_path_factory.mktemp("small-tokenizer"))


@pytest.fixture(scope="session")
def tiny_small_dir(tmp_path_factory: pytest.TempPathFactory, small_tokenizer: Any) -> Path:
    """A tiny random Qwen3 over the small tokenizer: cheap enough to sample from and train on CPU."""
    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny-small", small_tokenizer)


@pytest.fixture(scope="session")
def tiny_engine(tiny_small_dir: Path) -> Any:
    """TransformersEngine over the small-tokenizer model (fp32, CPU). Tests pass explicit seeds."""
    from tau2_rl_pipeline.rollout.engines import TransformersEngine

    return TransformersEngine.from_pretrained(tiny_small_dir, seed=0)


@pytest.fixture
def loopback(tiny_engine: Any) -> Iterator[Any]:
    """A fresh SGLang look-alike HTTP server on 127.0.0.1 (no faults, no latency, empty request log)."""
    from support.loopback_server import LoopbackServer

    with LoopbackServer(tiny_engine) as server:
        yield server


@pytest.fixture(scope="session")
def loopback_judge(tiny_engine: Any) -> Iterator[Any]:
    """A loopback server answering tau2 1.0.1's NL-assertion judge prompts (tests/judge_double.py), made the judge
    of every run for the whole session through the TAU2_JUDGE_* variables (subprocesses included)."""
    from judge_double import judge_answer
    from support.loopback_server import LoopbackServer

    from tau2_rl_pipeline.benchmark import judge
    from tau2_rl_pipeline.config import Tau2Config

    with LoopbackServer(tiny_engine, model_name="judge") as server:
        server.chat_answer = judge_answer()
        settings = {"TAU2_JUDGE_MODEL": "openai/judge", "TAU2_JUDGE_API_BASE": f"{server.base_url}/v1",
                    "TAU2_JUDGE_MAX_RETRIES": "1", "TAU2_JUDGE_BACKOFF_S": "0.01", "TAU2_JUDGE_TIMEOUT_S": "30"}
        saved = {k: os.environ.get(k) for k in settings}
        os.environ.update(settings)
        server.cfg = Tau2Config.from_env()
        judge.configure(server.cfg)
        try:
            yield server
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(autouse=True, scope="session")
def _judge_for_tau2_v1(request: pytest.FixtureRequest) -> None:
    """On tau2 1.0.1, retail is graded by an LLM judge: every test evaluates with the loopback judge."""
    from tau2_rl_pipeline.benchmark.tau2_version import V1

    if V1:
        request.getfixturevalue("loopback_judge")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="the quick tier: leave out the tests marked " + ", ".join(tiers.QUICK_LEAVES_OUT))


def pytest_configure(config: pytest.Config) -> None:
    for name, text in tiers.MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tiers' marks by path (tests/tiers.py); with --quick, the tests they leave out deselected."""
    for item in items:
        path = Path(str(item.path))
        if path.is_relative_to(REPO_ROOT / "tests"):
            rel = path.relative_to(REPO_ROOT / "tests").as_posix()
            for mark in sorted(tiers.marks_for(rel, getattr(item, "originalname", item.name))):
                item.add_marker(mark)
    if config.getoption("--quick"):
        out = [i for i in items if any(i.get_closest_marker(m) for m in tiers.QUICK_LEAVES_OUT)]
        if out:
            config.hook.pytest_deselected(items=out)
            left_out = set(out)
            items[:] = [i for i in items if i not in left_out]
