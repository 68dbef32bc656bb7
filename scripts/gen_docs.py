"""The generated blocks of README.md and docs/*.md, rewritten in place: `python scripts/gen_docs.py` (`--check`: exit 1
naming each stale block, rewrite nothing).

A page carries a block between `<!-- generated: COMMAND NAME -->` and `<!-- end generated -->`; this script owns
every block of every page and rebuilds each from the project itself, so a module, a benchmark or a preset that
changes changes the pages with it (tests/test_docs.py holds the pages to this output):
- `modules`: the module map, one row per folder of tau2_rl_pipeline, each module named with its docstring's first
  line (the folder's own line from its `__init__.py`); a new module or folder appears without an edit here.
- `benchmarks`: the P-rows of bench/README.md (its `## Pn: title` sections), as an index.
- the scale tables (`python -m tau2_rl_pipeline.scale.tables NAME`): the presets, sizing and cost tables.
Pure Python, standard library and the package only.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tau2_rl_pipeline"
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
THIS = "python scripts/gen_docs.py"
TABLES = "python -m tau2_rl_pipeline.scale.tables"
BLOCK = re.compile(r"<!-- generated: (.+?) (\w+) -->\n.*?<!-- end generated -->", re.S)

# The folders in the order data flows through them (README's "How it fits together"); a folder not named here
# follows them in alphabetical order.
FLOW = ("benchmark", "scale", "cluster", "rollout", "learning", "eval", "slime_plugins", "selection", "pictures",
        "local")
GROUND = "used by every folder below"


def summary(path: Path) -> str:
    """A module's docstring's first line: what the module map says of it. It must be a sentence of its own."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    line = doc.strip().splitlines()[0].strip() if doc else ""
    if not re.search(r"[.?!]\)?$", line):
        rel = _shown(path)
        raise ValueError(f"{rel}: the docstring's first line must be a sentence of its own (the module map reads "
                         f"it): {line!r}" if line else f"{rel}: no docstring (the module map reads its first line)")
    return line


def folders(package: Path) -> list[Path]:
    """The package's folders (each with an `__init__.py`), in FLOW's order, then any other by name."""
    found = {p.parent for p in package.rglob("__init__.py") if p.parent != package and "__pycache__" not in p.parts}
    order = {name: i for i, name in enumerate(FLOW)}
    return sorted(found, key=lambda p: (order.get(p.name, len(FLOW)), str(p)))


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def module_map(package: Path = PACKAGE) -> list[str]:
    """The README's module map: one row per folder, every module of the folder with its summary line."""
    lines = ["| folder | what it holds |", "|---|---|"]
    for folder in [package, *folders(package)]:
        modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        entries = [f"`{p.name}`: {_cell(summary(p))}" for p in modules]
        if folder == package:
            name, about = f"`{package.name}/` (ground)", GROUND
        else:
            name, about = f"`{folder.relative_to(package).as_posix()}/`", _cell(summary(folder / "__init__.py"))
        lines.append(f"| {name} | {'<br>'.join([f'**{about}**', *entries])} |")
    return lines


def bench_rows(text: str) -> list[tuple[str, str]]:
    """(P-number, title) of each `## Pn: title` section of bench/README.md, history notes like "(issue 9)" left out."""
    rows = re.findall(r"^## (P\d+): (.+?)\s*$", text, re.M)
    return [(p, re.sub(r"\s*\(issues? [^)]*\)", "", title)) for p, title in rows]


def benchmarks() -> list[str]:
    """The P-rows as an index: each row, what it measures; details in bench/README.md and docs/performance.md."""
    rows = bench_rows((ROOT / "bench" / "README.md").read_text())
    return ["; ".join(f"**{p}** {title}" for p, title in rows) + "."]


OWN: dict[str, Callable[[], list[str]]] = {"modules": module_map, "benchmarks": benchmarks}


def block(command: str, name: str) -> str:
    """The block `<!-- generated: COMMAND NAME -->` as it should read."""
    if command == THIS and name in OWN:
        body = OWN[name]()
    elif command == TABLES:
        from tau2_rl_pipeline.scale import tables

        return tables.block(name)
    else:
        raise ValueError(f"no generator for <!-- generated: {command} {name} -->")
    return "\n".join([f"<!-- generated: {command} {name} -->", *body, "<!-- end generated -->"])


def regenerated(text: str) -> str:
    return BLOCK.sub(lambda m: block(m.group(1), m.group(2)), text)


def stale(pages: tuple[Path, ...] = PAGES) -> list[str]:
    """'page: NAME' for each block that differs from what the project gives now."""
    out = []
    for page in pages:
        for m in BLOCK.finditer(page.read_text()):
            if m.group(0) != block(m.group(1), m.group(2)):
                out.append(f"{_shown(page)}: {m.group(2)}")
    return out


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(f"usage: {THIS} [--check]", file=sys.stderr)
        return 2
    try:
        if argv:
            behind = stale()
            for line in behind:
                print(f"stale: {line} (regenerate with {THIS})", file=sys.stderr)
            return 1 if behind else 0
        for page in PAGES:
            text = page.read_text()
            if regenerated(text) != text:
                page.write_text(regenerated(text))
                print(f"rewrote {_shown(page)}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the package from this checkout, installed or not
    sys.exit(main(sys.argv[1:]))
