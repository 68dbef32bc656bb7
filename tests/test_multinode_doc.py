"""docs/multi-node.md's one-machine commands run in sequence, as the page gives them: the namespaced hosts started
from the clone, the head's shell (which starts in `/`) taking the page's lines, the dry run of `train_grpo.sh`
planning for those hosts, and the hosts gone after `down`. Skipped in one line where namespaces cannot be made."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import hosts as hosts_mod

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "multi-node.md"
WHY_NOT = hosts_mod.unavailable()
OWN_PER_HOST = ("/tmp", "/dev/shm", "/run")  # each host has its own: a clone there is not the hosts' to see


def page_commands() -> tuple[list[str], list[str]]:
    """The section's code block: the commands typed here, and those typed in the head's shell (the `#   ` lines,
    continuation lines joined)."""
    text = PAGE.read_text()
    section = text[text.index("**Try the multi-node path on one machine.**"):]
    block = re.search(r"\n\n((?: {4}.*\n)+)", section).group(1)
    here, head = [], []
    for line in block.replace("\\\n    #  ", "").splitlines():
        line = line[4:]
        if line.startswith("#   "):
            head.append(line[4:].strip())
        else:
            here.append(line)
    return here, head


def test_the_page_gives_the_commands_this_test_runs() -> None:
    here, head = page_commands()
    assert [c.split()[0] for c in here] == ["cd", "PYTHONPATH=tests", "PYTHONPATH=tests", "PYTHONPATH=tests"]
    assert " up --hosts " in here[1] and " exec t2h1234 0 -- bash" in here[2] and " down t2h1234" in here[3]
    assert head[0] == here[0].split("#")[0].strip()  # the head's shell goes to the same clone
    assert head[1].startswith("export HOSTFILE=") and "DRY_RUN=1 bash scripts/train_grpo.sh" in head[2]


@pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaced hosts skipped: {WHY_NOT}")
def test_the_pages_commands_run_in_sequence_on_namespaced_hosts(tmp_path: Path) -> None:
    if any(ROOT.is_relative_to(p) for p in OWN_PER_HOST):
        pytest.skip(f"the page asks for a clone outside {', '.join(OWN_PER_HOST)}; this one is {ROOT}")
    here, head = page_commands()
    clone = here[0].split()[1]
    shared = tmp_path / "t2"
    env = dict(os.environ)
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():  # a worktree that uses another venv
        env["TAU2_VENV"] = sys.prefix

    def typed(command: str, run_id: str = "t2h1234") -> str:
        command = command.replace(clone, str(ROOT)).replace("/data/t2", str(shared)).replace("t2h1234", run_id)
        return command.replace(".venv/bin/python", sys.executable)

    up = subprocess.run(["bash", "-c", typed(here[1])], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=180)
    assert up.returncode == 0, up.stderr
    run_id = up.stdout.split()[1]
    try:
        exports = up.stdout.split("then, on the head:", 1)[1].split("\n")[0].strip()
        shell = "\n".join(exports if line.startswith("export HOSTFILE=") else typed(line, run_id) for line in head)
        session = subprocess.run(["bash", "-c", typed(here[2], run_id)], cwd=ROOT, env=env, input=shell + "\n",
                                 capture_output=True, text=True, timeout=300)
        assert session.returncode == 0, session.stdout[-3000:] + session.stderr[-3000:]
        assert "cluster plan: 2 node(s) x 4 Ray GPUs" in session.stderr, session.stderr[-3000:]
        assert "198.18.0.1 (head): actor ranks 0-3" in session.stderr
        assert "198.18.0.2 (worker): actor ranks 4-7" in session.stderr
    finally:
        down = subprocess.run(["bash", "-c", typed(here[3], run_id)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=180)
    assert down.returncode == 0, down.stderr
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert run_id not in names and not (hosts_mod.RUNS_DIR / run_id).exists()


def test_the_hostfile_the_pages_write_in_the_clone_is_ignored_by_git() -> None:
    """README.md and this page write `hostfile` in the clone (printf ... > hostfile): git leaves it out of status."""
    for page in (ROOT / "README.md", PAGE):
        assert "> hostfile" in page.read_text(), page
    ignored = subprocess.run(["git", "check-ignore", "-q", "hostfile"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, ".gitignore does not cover the hostfile the docs write"
