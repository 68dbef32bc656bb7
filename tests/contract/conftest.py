"""The contract tier: slime's and Megatron-LM's own code, at the commits the stage scripts and the Dockerfile pin,
driving this project's plug-ins on CPU.

The sources are the unmodified copies in ../shared/third_party (or $TAU2_THIRD_PARTY); they are put on sys.path
here, for tests only: the project never imports them at run time. SGLang's package gets a test double
(sglang_double/, SGLang's real definitions of the few names slime imports); the model server is the loopback
server. Where the sources or the tier's packages (requirements-contract.lock, installed by scripts/test.sh) are
missing, every test here is left out and test_tier_present.py says, in one skip line, how to provide them.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from contract_tier import MISSING


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if MISSING is not None and collection_path.suffix == ".py" and collection_path.name != "test_tier_present.py":
        return True
    return None


@pytest.fixture
def slime_env(monkeypatch, loopback, tmp_path):
    """The adapter's settings as a stage script exports them; the user simulator is the loopback server."""
    from slime_harness import reset_slime

    monkeypatch.setenv("TAU2_USER_MODEL", "openai/tiny")
    monkeypatch.setenv("TAU2_USER_API_BASE", loopback.base_url + "/v1")
    monkeypatch.setenv("TAU2_USER_MAX_RETRIES", "0")
    monkeypatch.setenv("TAU2_MAX_TURNS", "4")
    monkeypatch.setenv("TAU2_CURRICULUM_STATE_PATH", str(tmp_path / "curriculum.json"))
    reset_slime()
    thresholds = gc.get_threshold()
    yield
    reset_slime()  # before the loopback server goes: slime's async worker drains its episodes against it
    gc.unfreeze()  # the adapter's first episode settles the heap (gc_policy.settle): give it back as it was
    gc.set_threshold(*thresholds)
