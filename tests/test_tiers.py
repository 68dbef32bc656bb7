"""The tiers hold (tests/tiers.py): markers registered and strict, the slowest tests listed after every run, and a
quick tier (`bash scripts/test.sh --quick`) that still reaches every module of tau2_rl_pipeline."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tiers

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tau2_rl_pipeline"


def collect(*args: str) -> list[str]:
    """Node ids pytest collects from the repository root with these arguments (nothing runs)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_markers_are_registered_strict_and_the_slowest_tests_listed() -> None:
    opts = re.search(r'^addopts = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1).split()
    assert "--strict-markers" in opts and any(o.startswith("--durations=") for o in opts)
    assert set(tiers.QUICK_LEAVES_OUT) | {"contract"} <= set(tiers.MARKERS)


@pytest.mark.parametrize("rel, test, marks", [
    ("test_metrics.py", "test_pass_at_k_is_stable_for_large_n", set()),
    ("contract/test_slime_adapter.py", "test_x", {"contract"}),
    ("contract/test_router.py", "test_x", {"contract", "slow"}),
    ("contract/test_hosts_cluster.py", "test_x", {"contract", "hosts"}),
    ("test_hosts.py", "test_x", {"hosts"}),
    ("slurm/test_sbatch.py", "test_x", {"slurm"}),
    ("test_local_pipeline.py", "test_x", {"slow"}),
    ("test_scripts.py", "test_shellcheck_passes_on_every_script", {"slow"}),
    ("test_scripts.py", "test_grpo_defaults", set()),
])
def test_marks_go_by_path_and_name(rel: str, test: str, marks: set[str]) -> None:
    assert tiers.marks_for(rel, test) == marks


def functions(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_module_and_test_named_for_a_tier_exists() -> None:
    for rel in tiers.HOSTS_MODULES:
        assert (ROOT / "tests" / rel).is_file(), rel
    for rel, tests in tiers.SLOW.items():
        assert (ROOT / "tests" / rel).is_file(), rel
        missing = tests - tiers.ALL - functions(ROOT / "tests" / rel)
        assert not missing, f"tests/tiers.py names tests that tests/{rel} no longer has: {sorted(missing)}"


def test_references_count_imports_python_m_and_plugin_paths() -> None:
    modules = tiers.product_modules(PACKAGE)
    assert "tau2_rl_pipeline.metrics" in modules and "tau2_rl_pipeline.eval" not in modules  # __init__ apart
    source = ("import tau2_rl_pipeline.metrics\nfrom tau2_rl_pipeline.scale import cost\n"
              "def test_x():\n    from tau2_rl_pipeline.eval.shards import run\n"
              "    run(['-m', 'tau2_rl_pipeline.cluster.net'], 'tau2_rl_pipeline.slime_plugins.adapter.generate',\n"
              "        'tau2_rl_pipeline/rollout/tokens.py')\n")
    assert tiers.references(source, modules) == {
        "tau2_rl_pipeline.metrics", "tau2_rl_pipeline.scale.cost", "tau2_rl_pipeline.eval.shards",
        "tau2_rl_pipeline.cluster.net", "tau2_rl_pipeline.slime_plugins.adapter", "tau2_rl_pipeline.rollout.tokens"}


def test_a_module_loaded_at_the_top_counts_and_a_lazy_import_does_not(tmp_path: Path) -> None:
    pkg = tmp_path / "tau2_rl_pipeline"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    for name, text in {"__init__.py": "", "sub/__init__.py": "", "a.py": "from tau2_rl_pipeline.sub import b\n",
                       "sub/b.py": "def f():\n    import tau2_rl_pipeline.c\n", "c.py": "", "d.py": ""}.items():
        (pkg / name).write_text(text)
    (tmp_path / "tests" / "rig.py").write_text("import tau2_rl_pipeline.d\n")
    (tmp_path / "tests" / "test_a.py").write_text("import rig\nimport tau2_rl_pipeline.a\n")
    assert tiers.unreached([tmp_path / "tests" / "test_a.py"], pkg) == ["tau2_rl_pipeline.c"]


def marked_slow(path: Path) -> set[str]:
    """The tests of a module that carry @pytest.mark.slow themselves."""
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and any("mark.slow" in ast.unparse(d) for d in node.decorator_list)}


@pytest.mark.slow
def test_the_quick_tier_reaches_every_module_and_leaves_the_slow_ones_out() -> None:
    quick = collect("--quick")
    files = sorted({ROOT / node.split("::")[0] for node in quick})
    rels = {f.relative_to(ROOT / "tests").as_posix() for f in files}
    assert len(rels) > 40 and not rels & ({r for r, t in tiers.SLOW.items() if t == tiers.ALL} | tiers.HOSTS_MODULES)
    assert not any(r.startswith("slurm/") for r in rels)
    named = {f"tests/{r}::{t}" for r, tests in tiers.SLOW.items() for t in tests - tiers.ALL}
    named |= {f"{p.relative_to(ROOT).as_posix()}::{t}" for p in (ROOT / "tests").rglob("test_*.py") for t in marked_slow(p)}
    assert named and not {node.split("[")[0] for node in quick} & named
    missing = tiers.unreached(files, PACKAGE)
    assert not missing, f"modules no quick-tier test module imports or runs (give one a quick test): {missing}"
