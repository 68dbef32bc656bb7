"""The package's layout follows the data flow, and the imports keep it so.

Each folder of tau2_rl_pipeline/ is a room on a layer; a module may import from its own room and from
rooms on lower layers, never from a higher layer or from another room on its own layer. Only the slime plug-ins
import slime, and none imports the test rigs (tests/support). Read from the source (ast), so a lazy import inside
a function counts too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# room -> layer, low to high: the README's "How it fits together" draws the same picture.
LAYERS = {
    "ground": 0,          # tau2_rl_pipeline/*.py: config, metrics, files, http_post
    "benchmark": 1,       # what tau2 is, made fast and safe
    "scale": 1,           # model presets, the sizing sheet, the cost on paper (stdlib only)
    "cluster": 1,         # the cluster tools the scripts run: the check, the watch, interfaces and inputs
    "rollout": 2,         # token in, token out
    "learning": 3,        # rewards, curriculum, losses, SFT data
    "launch": 3,          # the stage planner: one plan per slime stage (imports config, scale, cluster, rollout's rule)
    "eval": 4,            # the Pass@K evaluator
    "slime_plugins": 4,   # what slime loads by dotted path
    "selection": 5,       # RFT selection and the difficulty filter: they read evaluator runs
    "pictures": 5,        # the pictures in public/
    "local": 6,           # the embedded backend and the demo
}


# The test rigs' top-level names (tests/support, imported as `support`; tests/ itself).
TEST_SUPPORT = ("support", "tests")


def room_of(module: str) -> str | None:
    """The room of a dotted module name of this project, or None for anything else (tau2, torch, ...)."""
    parts = module.split(".")
    if parts[0] != "tau2_rl_pipeline":
        return None
    if len(parts) == 1 or parts[1] not in LAYERS:
        return "ground"
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in a file; `from pkg import name` also yields pkg.name, so importing
    a submodule by name counts as importing that submodule."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (this project imports absolutely)"
            base = node.module or ""
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names
                    if (ROOT / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").exists()
                    or (ROOT / Path(*f"{base}.{a.name}".split("."))).is_dir()]
    return out


def project_files() -> list[Path]:
    return sorted([*(ROOT / "tau2_rl_pipeline").rglob("*.py")])


def violations(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        here = room_of(module_name(path))
        for line, target in imports(path):
            where = f"{path.relative_to(ROOT)}:{line}"
            if target.split(".")[0] in TEST_SUPPORT:
                found.append(f"{where}: imports {target}; the product never imports the test rigs (tests/)")
            if target.split(".")[0] == "slime" and here != "slime_plugins":
                found.append(f"{where}: imports {target}; only tau2_rl_pipeline/slime_plugins/ may import slime")
            there = room_of(target)
            if there is None or there == here or target == "tau2_rl_pipeline":
                continue  # the package roots themselves are the ground (__init__ sets up logging only)
            if LAYERS[there] >= LAYERS[here]:
                found.append(f"{where}: {here} (layer {LAYERS[here]}) imports {target} ({there}, layer "
                             f"{LAYERS[there]}): imports run down the flow only")
    return found


def test_every_module_sits_in_a_known_room():
    unknown = [str(p.relative_to(ROOT)) for p in (ROOT / "tau2_rl_pipeline").glob("*/")
               if p.is_dir() and p.name not in LAYERS and p.name != "__pycache__"]
    assert not unknown, f"folders without a layer in tests/test_layers.py: {unknown}"


def test_no_import_runs_up_a_layer_and_only_slime_plugins_import_slime():
    assert violations(project_files()) == []


@pytest.mark.parametrize("room, source, expected", [
    ("benchmark", "from tau2_rl_pipeline.rollout.engines import SamplingParams\n", "imports run down the flow"),
    ("rollout", "def f():\n    from tau2_rl_pipeline.local import trainer\n", "imports run down the flow"),
    ("learning", "from tau2_rl_pipeline.local import tiny_model\n", "imports run down the flow"),
    ("local", "from support.loopback_server import LoopbackServer\n", "never imports the test rigs"),
    ("eval", "def f():\n    import support.hosts\n", "never imports the test rigs"),
    ("local", "import slime.utils.arguments\n", "only tau2_rl_pipeline/slime_plugins/ may import slime"),
    ("rollout", "from tau2_rl_pipeline.eval.runner import run_episodes\n", "imports run down the flow"),
])
def test_the_check_catches_an_upward_import(tmp_path, monkeypatch, room, source, expected):
    """The checker itself: a module planted in a room with an import that breaks the rule is reported."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    for pkg in ("tau2_rl_pipeline", f"tau2_rl_pipeline/{room}", "tau2_rl_pipeline/local",
                "tau2_rl_pipeline/eval"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    planted = tmp_path / "tau2_rl_pipeline" / room / "planted.py"
    planted.write_text(source)
    found = violations([planted])
    assert len(found) == 1 and expected in found[0], found
