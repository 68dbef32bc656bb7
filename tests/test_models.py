"""The model files under scripts/models/ hold the same Megatron flags as slime's own files for those models.

Both sides are sourced by bash in a clean environment (slime's files compute some values: the rotary base from
MODEL_ARGS_ROTARY_BASE, the 30B-A3B's MoE layer list with a loop) and compared flag by flag, every flag and value,
order aside. Each preset (scale/presets.py) names one of these files, and the sizing sheet reads its dimensions
from it, so a wrong number here would size the wrong model too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from third_party import third_party_path

from tau2_rl_pipeline.scale.presets import PRESETS
from tau2_rl_pipeline.scale.sizing import model_args_from_file

MODELS = Path(__file__).resolve().parents[1] / "scripts" / "models"
SLIME_MODELS = third_party_path() / "slime-624b824" / "scripts" / "models"


def sourced(path: Path) -> list[str]:
    """MODEL_ARGS after `source path` in bash, one element per NUL-separated field."""
    out = subprocess.run(["bash", "-c", 'source "$1" && printf "%s\\0" "${MODEL_ARGS[@]}"', "bash", str(path)],
                         env={"PATH": "/usr/bin:/bin"}, capture_output=True, check=True, timeout=30)
    return out.stdout.decode().split("\0")[:-1]


def flags(argv: list[str]) -> dict[str, str | None]:
    """--flag -> its value (None for a switch); a flag given twice is an error here."""
    out: dict[str, str | None] = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--"):
            assert tok not in out, f"{tok} given twice"
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[tok] = None if nxt is None or nxt.startswith("--") else nxt
    return out


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_file_agrees_with_slime(name: str) -> None:
    ours = MODELS / PRESETS[name].model_file
    theirs = SLIME_MODELS / PRESETS[name].model_file
    if not theirs.is_file():
        pytest.skip(f"{theirs} not found (../shared/third_party or TAU2_THIRD_PARTY)")
    assert flags(sourced(ours)) == flags(sourced(theirs))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_sheet_reads_what_bash_reads(name: str) -> None:
    """The sizing sheet parses the file without bash (a dry run needs none of slime); it must get the same argv."""
    path = MODELS / PRESETS[name].model_file
    assert model_args_from_file(path.read_text()) == sourced(path)


def test_every_model_file_is_a_preset() -> None:
    assert sorted(p.name for p in MODELS.glob("*.sh")) == sorted(p.model_file for p in PRESETS.values())
