"""The pages' generated blocks are current (scripts/gen_docs.py), and user docs carry no history.

The README's module map names every module of the package with its docstring's first line, the benchmark index
every P-row of bench/README.md; a module, folder or benchmark added shows up by running `python scripts/gen_docs.py`,
and this test fails until it is run. User docs (README.md, docs/*.md) cite no issue number of this project, no
hand-typed range of P-rows and no "at this commit": history belongs in CHANGELOG.md and commit messages.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
gen_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_docs)

USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_generated_block_is_current() -> None:
    assert gen_docs.stale() == [], "regenerate with: python scripts/gen_docs.py"


def test_the_readme_carries_the_module_map_and_the_benchmark_index() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = {m.group(2): m.group(0) for m in gen_docs.BLOCK.finditer(readme)}
    assert {"modules", "benchmarks"} <= set(blocks)
    modules = blocks["modules"]
    for path in (ROOT / "tau2_rl_pipeline").rglob("*.py"):
        if path.name != "__init__.py":
            assert f"`{path.name}`: {gen_docs.summary(path)}" in modules, path
    rows = modules.splitlines()
    for folder in ("cluster", "eval", "local", "slime_plugins"):
        row = next(r for r in rows if r.startswith(f"| `{folder}/` |"))
        names = re.findall(r"`(\w+\.py)`", row)
        assert names == sorted(p.name for p in (ROOT / "tau2_rl_pipeline" / folder).glob("*.py")
                               if p.name != "__init__.py"), folder


def test_a_new_folder_and_module_appear_in_the_map(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for folder, doc in [("", "The package."), ("rollout", "Token in, token out."), ("launch", "Plans. Then more.")]:
        (pkg / folder).mkdir(parents=True, exist_ok=True)
        (pkg / folder / "__init__.py").write_text(f'"""{doc}"""\n')
    (pkg / "config.py").write_text('"""Settings.\n\nMore."""\n')
    (pkg / "launch" / "planner.py").write_text('"""One plan per stage, typed.\n\nWhy."""\n')
    (pkg / "rollout" / "engines.py").write_text('"""Engines: ids in, ids out?"""\n')
    assert gen_docs.module_map(pkg) == [
        "| folder | what it holds |", "|---|---|",
        f"| `pkg/` (ground) | **{gen_docs.GROUND}**<br>`config.py`: Settings. |",
        "| `rollout/` | **Token in, token out.**<br>`engines.py`: Engines: ids in, ids out? |",  # FLOW's order first
        "| `launch/` | **Plans. Then more.**<br>`planner.py`: One plan per stage, typed. |",
    ]


@pytest.mark.parametrize("doc", ['"""Runs on\nover two lines."""', "x = 1  # no docstring", '"""A | B: not a sentence"""'])
def test_a_module_without_a_summary_line_is_named(tmp_path: Path, doc: str) -> None:
    (tmp_path / "bad.py").write_text(doc + "\n")
    with pytest.raises(ValueError, match=r"bad\.py: .*(first line must be a sentence|no docstring)"):
        gen_docs.summary(tmp_path / "bad.py")


def test_the_benchmark_index_is_every_p_row_without_history() -> None:
    rows = gen_docs.bench_rows("## P1: env cost (issue 9)\ntext\n### P1 again (issue 24)\n## P12: async (issues 30, 32)\n")
    assert rows == [("P1", "env cost"), ("P12", "async")]
    real = dict(gen_docs.bench_rows((ROOT / "bench" / "README.md").read_text()))
    assert {"P1", "P6", "P7", "P12"} <= set(real) and not any("issue" in t for t in real.values())
    index = gen_docs.benchmarks()[0]
    assert all(f"**{p}** {t}" in index for p, t in real.items())


def test_check_names_a_stale_block_and_rewrites_nothing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- generated: python scripts/gen_docs.py benchmarks -->\nold\n<!-- end generated -->\n")
    assert gen_docs.stale((page,)) == [f"{page}: benchmarks"]
    assert "old" not in gen_docs.regenerated(page.read_text())
    bad = tmp_path / "bad.md"
    bad.write_text("<!-- generated: python scripts/gen_docs.py nope -->\n<!-- end generated -->\n")
    with pytest.raises(ValueError, match="no generator for <!-- generated: python scripts/gen_docs.py nope -->"):
        gen_docs.stale((bad,))
    done = subprocess.run([sys.executable, "scripts/gen_docs.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True)
    assert (done.returncode, done.stderr) == (0, "")


# This project's history in prose or as a bare reference; another project's issue (owner/repo#N) is a citation.
HISTORY = re.compile(r"\bissues? #?\d+|(?<![\w/.-])#\d+\b|\bP\d+\s*[-–]\s*P\d+\b|\bat this commit\b", re.I)


def test_user_docs_carry_no_history() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {m.group(0)}" for p in USER_DOCS
             for n, line in enumerate(p.read_text().splitlines(), 1) for m in HISTORY.finditer(line)]
    assert not found, f"issue numbers, P-ranges or 'at this commit' in user docs (history goes in CHANGELOG.md): {found}"
    assert HISTORY.findall("issue 30; see #12; P1-P6; at this commit") == ["issue 30", "#12", "P1-P6", "at this commit"]
    assert not HISTORY.findall("THUDM/slime#1851, encode/httpx#3215, `#include`, P6 and P12")
