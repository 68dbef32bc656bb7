"""The commands of the README and docs/ work as typed on a machine set up by its two commands: the files they name are the ones
the code writes, the inputs they need are made first, and defaults that differ between entry points say so.
(The export commands' relative paths are run in tests/test_scripts.py.)"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from tau2_rl_pipeline.config import Tau2Config, env_var
from tau2_rl_pipeline.eval.plan import output_paths

ROOT = Path(__file__).resolve().parents[1]
# The front door and its pages, read as one text: a command may sit on either.
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def command_lines() -> list[str]:
    """Lines of the code blocks (indented or fenced), continuation lines joined."""
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", README, re.DOTALL)
    blocks += re.findall(r"(?:^ {4}\S.*\n)+", README, re.MULTILINE)
    text = "\n".join(blocks).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip()]


def test_the_env_file_passed_to_docker_is_made_from_the_template_first() -> None:
    lines = command_lines()
    uses = [i for i, line in enumerate(lines) if "--env-file configs/.env" in line]
    made = [i for i, line in enumerate(lines) if line.startswith("cp configs/.env.template configs/.env")]
    assert uses and made and min(made) < min(uses)


def test_local_commands_run_in_the_virtual_environment() -> None:
    """Outside the container `python` is the system's, without the pinned packages: local commands run from
    .venv/bin (its python or the installed console scripts)."""
    local = [line for line in command_lines() if "--backend local" in line]
    assert local and all(line.startswith(".venv/bin/") for line in local), local


def test_the_tau2_results_file_name_is_the_one_the_evaluator_writes() -> None:
    written = output_paths(Path("outputs/eval/qwen3-4b.json"), ["airline"])["tau2"]["airline"]
    assert f"`{written}`" in README and "`<output stem>.<domain>.tau2.json`" in README


def test_every_demo_output_under_eval_is_named() -> None:
    """The evaluations of each stage (`<stage>.json` ...) and the RFT stage's sampling run (`rft_samples.*`)."""
    from tau2_rl_pipeline.local.pipeline import eval_output

    assert eval_output(Path("outputs/demo"), "rft_samples").name == "rft_samples.json"
    assert "`rft_samples.*`" in README and "`<stage>.json`" in README and "`outputs/demo/stages.json`" in README


def test_a_default_the_stage_scripts_change_is_explained_in_the_table() -> None:
    common = (ROOT / "scripts" / "common.sh").read_text()
    script_defaults = dict(re.findall(r'^export (TAU2_\w+)="\$\{\1:-([^}]*)\}"', common, re.MULTILINE))
    differing = {f.name: script_defaults[env_var(f.name)] for f in fields(Tau2Config)
                 if env_var(f.name) in script_defaults and script_defaults[env_var(f.name)] != str(f.default)}
    assert "user_temperature" not in differing  # one default (config.DEFAULT_USER_TEMPERATURE): the GRPO gate's
    for name, value in differing.items():
        (row,) = [line for line in README.splitlines() if line.startswith(f"| `{env_var(name)}` |")]
        assert value in row and "scripts" in row, row
