"""The README is a front door and docs/ holds the rest: nothing a user can set or run goes undocumented.

Every `TAU2_*` setting (a Tau2Config field, or a variable a script, the Dockerfile or the Python code reads from the
environment), every script under scripts/ and every folder of the package is named somewhere in README.md or
docs/; each docs page says first what its reader will be able to do; every relative link resolves.
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from tau2_rl_pipeline.config import OTHER_VARIABLES, Tau2Config, env_var

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 200


def documentation() -> str:
    return "\n".join(p.read_text() for p in [README, *PAGES])


def settings_read_from_the_environment() -> set[str]:
    """TAU2_* names the project reads with a default or from os.environ: what a user can set."""
    names = {env_var(f.name) for f in fields(Tau2Config)} | set(OTHER_VARIABLES)
    for path in [*(ROOT / "scripts").rglob("*.sh"), ROOT / ".ci" / "run"]:
        names |= set(re.findall(r"\$\{(TAU2_\w+):[-=]", path.read_text()))
    names |= set(re.findall(r"^ARG (TAU2_\w+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE))
    for path in [*(ROOT / "tau2_rl_pipeline").rglob("*.py"),
                 *(ROOT / "bench").glob("*.py")]:
        names |= set(re.findall(r"""(?:environ(?:\.get)?[(\[]|getenv\()\s*["'](TAU2_\w+)["']""", path.read_text()))
    return names


def test_every_setting_is_documented():
    text = documentation()
    settings = settings_read_from_the_environment()
    assert {"TAU2_REWARD_ALPHA", "TAU2_VENV", "TAU2_LOG_LEVEL", "TAU2_BENCH"} <= settings  # the scan finds each kind
    missing = sorted(n for n in settings if not re.search(rf"\b{n}\b", text))
    assert not missing, f"TAU2_* settings named nowhere in README.md or docs/: {missing}"


def test_every_script_is_documented():
    text = documentation()
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "scripts").rglob("*.sh"))
    assert "scripts/train_grpo.sh" in scripts
    missing = [s for s in scripts if s not in text]
    assert not missing, f"scripts named nowhere in README.md or docs/: {missing}"


def test_the_readme_is_a_front_door_that_names_every_folder():
    text = README.read_text()
    assert len(text.splitlines()) < README_MAX_LINES
    folders = [p.name for p in (ROOT / "tau2_rl_pipeline").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert len(folders) >= 8
    missing = [f for f in folders if f"`{f}/`" not in text]
    assert not missing, f"package folders the README's 'How it fits together' does not name: {missing}"
    for page in PAGES:  # every page is reachable from the front door
        assert f"docs/{page.name}" in text, page.name


def test_each_page_starts_with_what_its_reader_can_do_after_it():
    for page in PAGES:
        lines = [line for line in page.read_text().splitlines() if line.strip()]
        assert lines[0].startswith("# ") and lines[1].startswith("After this page you "), page.name


def test_relative_links_resolve():
    for path in [README, *PAGES]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to missing {target}"
