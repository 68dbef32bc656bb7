"""The pictures in public/ regenerate from the project itself, and the console scripts work as the README types them.

The pipeline picture is drawn from scripts/pipeline.sh's dry runs, so it must name every stage script there is;
the demo chart reads any report shaped like the demo's; the benchmark chart reads bench/README.md's own tables.
The console scripts are run the way a visitor runs them: `.venv/bin/<name>` from a fresh shell, no venv activated.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

from tau2_rl_pipeline.pictures import bench_chart, stage_chart
from tau2_rl_pipeline.pictures.pipeline_diagram import render as render_pipeline
from tau2_rl_pipeline.pictures.pipeline_diagram import scripts_outside
from tau2_rl_pipeline.pictures.plan import dry_run_plan, gpu_layouts, parse_plan

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
BIN = Path(sys.executable).parent
# what pyproject's [project.scripts] installed
CONSOLE_SCRIPTS = {ep.name: ep.value for ep in distribution("tau2_rl_pipeline").entry_points
                   if ep.group == "console_scripts"}
SCREEN_LINES = 30  # --help at 100 columns: one screen; the rest behind --help-all


def entry(value: float, n_tasks: int = 9, n_episodes: int = 36) -> dict:
    return {"value": value, "ci": [max(0.0, value - 0.1), min(1.0, value + 0.1)], "n_tasks": n_tasks,
            "n_episodes": n_episodes}


def small_report(stages=("base", "sft", "rft", "grpo")) -> dict:
    return {"domain": "mock", "eval_split": "base", "stages": {
        s: {"k": 4, "pass@1": entry(0.1 * i), "pass@4": entry(0.2 * i), "pass^4": entry(0.05 * i),
            "mean_partial": entry(0.3)} for i, s in enumerate(stages)}}


def fresh_shell(cmd: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a command line as typed, in bash with no venv on PATH and nothing of ours in the environment."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8", "COLUMNS": "100"}
    return subprocess.run(["bash", "-c", cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)


@pytest.fixture(scope="module")
def plans() -> dict:
    return {layout: dry_run_plan(layout) for layout in gpu_layouts()}


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tau2-rl-pictures run from a fresh shell on a small report: every picture regenerated into a temp folder."""
    out = tmp_path_factory.mktemp("public")
    report = out.parent / "report.json"
    report.write_text(json.dumps(small_report()))
    proc = fresh_shell(f"{shlex.quote(str(BIN / 'tau2-rl-pictures'))} --out {shlex.quote(str(out))} "
                       f"--report {shlex.quote(str(report))}", out.parent)
    assert proc.returncode == 0, proc.stderr
    return out


# ---- the pipeline picture ---------------------------------------------------------------------------------------
def stage_scripts() -> set[str]:
    """Every script the pipeline's stages are made of: those that source common.sh, but pipeline.sh itself."""
    return {p.name for p in SCRIPTS.glob("*.sh")
            if p.name != "pipeline.sh" and re.search(r"^source .*common\.sh", p.read_text(), flags=re.MULTILINE)}


def test_pipeline_picture_names_every_stage_script(plans: dict, tmp_path: Path) -> None:
    texts = render_pipeline(plans, tmp_path / "pipeline.png")
    words = {w for t in texts for w in re.split(r"[\s+,:()]+", t)}
    outside = set(scripts_outside(plans["8"], SCRIPTS))
    assert stage_scripts() <= plans["8"].stage_scripts() | outside
    assert outside <= {"start_judge.sh", "start_router.sh"}  # run by hand when needed: a new stage script belongs in pipeline.sh, or here with a reason
    missing = stage_scripts() - words
    assert not missing, f"not named in the picture: {sorted(missing)}"
    stages = [s.name for s in plans["8"].stages]
    assert stages == ["download", "convert", "tasks", "sft", "sft_hf", "rft_data", "rft", "grpo_tasks", "grpo",
                      "grpo_hf"]
    assert all(any(t.startswith(f"{i + 1}  {name}") for t in texts) for i, name in enumerate(stages))
    assert (tmp_path / "pipeline.png").read_bytes()[:4] == b"\x89PNG"


def test_pipeline_plan_has_the_files_servers_and_gpus_the_scripts_use(plans: dict) -> None:
    stages = {s.name: s for s in plans["8"].stages}
    assert ("data/sft_seed.jsonl", 1) in stages["sft"].reads
    assert ("models/Qwen3-4B-Instruct-2507_torch_dist/", 2) in stages["sft"].reads
    assert ("checkpoints/rft/", 7) in stages["grpo"].reads
    assert ("data/tasks/tau2_train_all_tasks.jsonl", 3) in stages["grpo_tasks"].reads
    assert ("data/tasks/tau2_train_grpo_tasks.jsonl", 8) in stages["grpo"].reads  # the difficulty-filtered tasks
    assert stages["rft_data"].outputs == ["data/sft_seed_plus_rft.jsonl"]
    # the user simulator's address is in every Ray job's runtime env; only the stages running episodes use it
    assert stages["sft"].servers == ["slime"] and stages["rft"].servers == ["slime"]
    assert set(stages["grpo"].servers) == {"slime", "start_user_sim"}
    assert set(stages["rft_data"].servers) == {"start_user_sim", "start_policy_server"}
    assert not stages["download"].servers and not stages["grpo_hf"].servers
    servers = plans["8"].servers
    assert servers["start_user_sim"].gpus == (4, 5, 6, 7) and servers["start_user_sim"].port == 30001
    assert (servers["slime"].gpus, servers["slime"].tp, servers["slime"].dp) == ((0, 1, 2, 3), 2, 2)
    assert servers["slime"].jobs["train.py"].endswith("4 colocated SGLang rollout engines")
    assert servers["slime"].jobs["train_async.py"] == "training only"
    assert plans["2"].servers["start_user_sim"].gpus == (1,) and plans["2"].servers["slime"].gpus == (0,)
    assert list(plans) == ["8", "4", "2"]


def test_plan_parsing_rejects_output_without_stages() -> None:
    with pytest.raises(ValueError, match="no stage headers"):
        parse_plan("+ echo hello\n", "/out")


# ---- the demo chart ---------------------------------------------------------------------------------------------
def test_demo_chart_reads_any_report_shaped_like_the_demos(tmp_path: Path) -> None:
    report = small_report(("base", "sft", "rft", "grpo", "grpo_round2"))
    report["stages"]["grpo"]["pass@2"] = entry(0.5)  # a metric only one stage has
    report["stages"]["grpo"]["history"] = [{"step": 1}]  # not a metric entry: ignored
    stages, names = stage_chart.stage_metrics(report)
    assert stages == ["base", "sft", "rft", "grpo", "grpo_round2"]
    assert names == ["pass@1", "pass@4", "pass^4", "pass@2", "mean_partial"]
    stage_chart.render(report, tmp_path / "stages.png")
    assert (tmp_path / "stages.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no evaluated stages"):
        stage_chart.stage_metrics({"stages": {}})


# ---- the benchmark chart ----------------------------------------------------------------------------------------
def test_bench_chart_reads_every_p_table_of_the_bench_readme(tmp_path: Path) -> None:
    text = (ROOT / "bench" / "README.md").read_text()
    sections = set(re.findall(r"^## (P\d+):", text, flags=re.MULTILINE))
    # a benchmark prepared but not run yet (P7 waits for a GPU) has no numbers to draw
    unmeasured = set(re.findall(r"^## (P\d+):[^\n]*\n\n\*\*Status: not yet measured", text, flags=re.MULTILINE))
    assert {spec.section for spec in bench_chart.SPECS} == sections - unmeasured and "P7" in unmeasured
    for spec in bench_chart.SPECS:
        rows = bench_chart.bench_rows(text, spec)
        assert rows and all(r.value > 0 and all(r.sides) for r in rows), spec.section
    p1 = {r.label: r.value for r in bench_chart.bench_rows(text, bench_chart.SPECS[0])}
    assert p1["airline"] == float(re.search(r"\| airline \|.*?\*\*(\d+)x\*\*", text).group(1))
    renamed = tmp_path / "README.md"
    renamed.write_text(text.replace("| efficiency |", "| share |", 1))
    with pytest.raises(ValueError, match="P2: no column 'efficiency'"):
        bench_chart.render(renamed, tmp_path / "bench.png")


def test_bench_labels_carry_no_lab_notebook_notes() -> None:
    """bench/README.md's rows note clock times and commits for the record; the chart's labels leave them out."""
    text = (ROOT / "bench" / "README.md").read_text()
    assert re.search(r"\(\d{1,2}:\d{2}", text) and re.search(r"\b[0-9a-f]{7}\b", text)  # the README has them
    labels = [r.label for spec in bench_chart.SPECS for r in bench_chart.bench_rows(text, spec)]
    assert not [lab for lab in labels if re.search(r"\d{1,2}:\d{2}|\b[0-9a-f]{7,40}\b|\(\s*\)|main at", lab)]
    assert "13. retail --workers 0 --latency 2.0 --procs 2, 2 s" in labels  # no **Charted** line: every row


def test_a_table_with_history_charts_its_current_rows_pooled_with_their_range(tmp_path: Path) -> None:
    """P5 keeps 29 rows of history; its **Charted** line names the current ones: one bar per name, the mean of its
    runs with their range and count, its sides as a range."""
    text = (ROOT / "bench" / "README.md").read_text()
    spec = next(s for s in bench_chart.SPECS if s.section == "P5")
    table = {row["#"]: row for row in bench_chart._table(text, "P5")}
    groups = bench_chart.charted(text, "P5")
    rows = bench_chart.bench_rows(text, spec)
    assert len(table) >= 29 and [r.runs for r in rows] == [len(numbers) for _, numbers in groups] and len(rows) < 4
    for row, (name, numbers) in zip(rows, groups):
        values = [float(re.search(r"[\d.]+", table[n]["efficiency (ideal / achieved)"]).group(0)) for n in numbers]
        assert row.label.startswith(name) and (row.low, row.high) == (min(values), max(values))
        assert row.value == pytest.approx(sum(values) / len(values))
    shipped = rows[-1]
    assert shipped.runs >= 2 and re.fullmatch(r"[\d.]+-[\d.]+ ms", shipped.sides[0]), shipped
    # a charted row the table lacks, or an entry that names none, is one line naming the benchmark
    for line, words in (("shipped = rows 28-31", "names row 30, which its table lacks"),
                        ("shipped = the last ones", "is not NAME = row N or rows N-M")):
        broken = tmp_path / "README.md"
        broken.write_text(re.sub(r"^\*\*Charted\*\*.*$", f"**Charted**: {line}", text, count=1, flags=re.MULTILINE))
        with pytest.raises(ValueError, match="P5: ") as e:
            bench_chart.render(broken, tmp_path / "bench.png")
        assert words in str(e.value)


def test_pictures_go_to_the_users_folder_unless_public_is_asked() -> None:
    from tau2_rl_pipeline.pictures.__main__ import PUBLIC, build_parser, out_dir

    assert out_dir(build_parser().parse_args([])) == Path("outputs/pictures")
    assert out_dir(build_parser().parse_args(["--out", "x"])) == Path("x")
    assert out_dir(build_parser().parse_args(["--public"])) == PUBLIC == ROOT / "public"
    with pytest.raises(ValueError, match="drop --out"):
        out_dir(build_parser().parse_args(["--public", "--out", "x"]))


def test_a_bad_pictures_command_is_one_line_in_words(tmp_path: Path, capsys) -> None:
    from tau2_rl_pipeline.pictures.__main__ import main

    (tmp_path / "file").write_text("")
    (tmp_path / "report.json").write_text("{}")
    for argv, said in ((["--public", "--out", "x"], "error: --public writes into public/; drop --out"),
                       (["--out", str(tmp_path / "file" / "sub")], f"error: cannot write {tmp_path / 'file'}"),
                       (["--out", str(tmp_path / "o"), "--report", str(tmp_path / "report.json")],
                        "error: the report has no ")):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(said) and "Error:" not in err[0], (argv, err)


# ---- the whole command ------------------------------------------------------------------------------------------
def test_pictures_regenerate_from_a_fresh_shell(pictures: Path) -> None:
    for name in ("pipeline.png", "demo_stages.png", "bench.png"):
        assert (pictures / name).read_bytes()[:4] == b"\x89PNG", name
    assert json.loads((pictures / "demo_report.json").read_text()) == small_report()


def test_checked_in_pictures_are_the_ones_the_command_writes(pictures: Path) -> None:
    public = ROOT / "public"
    assert {p.name for p in public.glob("*.png")} == {"pipeline.png", "demo_stages.png", "bench.png"}
    for name in ("pipeline.png", "bench.png"):  # drawn from the scripts and bench/README.md as they are now
        assert (pictures / name).read_bytes() == (public / name).read_bytes(), \
            f"public/{name} is out of date: run .venv/bin/tau2-rl-pictures --public and commit public/"
    stage_chart.stage_metrics(json.loads((public / "demo_report.json").read_text()))
    readme = (ROOT / "README.md").read_text()
    assert all(f"public/{name}" in readme for name in ("pipeline.png", "demo_stages.png", "bench.png"))


# ---- console scripts ----------------------------------------------------------------------------------------------
def readme_console_commands() -> list[list[str]]:
    """Every `.venv/bin/tau2-rl-...` command line in the README and docs/ (a trailing `\\` joins lines)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(p.read_text() for p in pages).replace("\\\n", " ")
    return [shlex.split(m.split("#")[0]) for m in re.findall(r"\.venv/bin/tau2-rl-[^\n`]*", text)]


def test_console_scripts_help_fits_one_screen_from_a_fresh_shell(tmp_path: Path) -> None:
    assert set(CONSOLE_SCRIPTS) == {"tau2-rl-demo", "tau2-rl-eval", "tau2-rl-tasks", "tau2-rl-pictures",
                                    "tau2-rl-compare", "tau2-rl-qualify-user"}
    commands = readme_console_commands()
    assert {Path(c[0]).name for c in commands} >= {"tau2-rl-demo", "tau2-rl-eval", "tau2-rl-tasks"}
    helps = {}
    for name in CONSOLE_SCRIPTS:
        proc = fresh_shell(f"{shlex.quote(str(BIN / name))} --help", tmp_path)
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stdout.startswith(f"usage: {name} "), proc.stdout[:200]
        assert len(proc.stdout.splitlines()) <= SCREEN_LINES, f"{name} --help is {len(proc.stdout.splitlines())} lines"
        everything = fresh_shell(f"{shlex.quote(str(BIN / name))} --help-all", tmp_path)
        assert everything.returncode == 0 and len(everything.stdout) >= len(proc.stdout), (name, everything.stderr)
        config = fresh_shell(f"{shlex.quote(str(BIN / name))} --help-config", tmp_path)  # TAU2_* flags, if any
        helps[name] = everything.stdout + (config.stdout if config.returncode == 0 else "")
    for cmd in commands:  # every flag the README gives a console script is one it has
        name = Path(cmd[0]).name
        flags = {tok.split("=")[0] for tok in cmd[1:] if tok.startswith("--")}
        assert flags <= set(re.findall(r"--[\w-]+", helps[name])), (name, flags)


def test_readme_tasks_command_runs_as_typed_from_a_fresh_shell(tmp_path: Path) -> None:
    """The README's tau2-rl-tasks line, run as written (only the venv's location and the domain made local)."""
    (cmd,) = [c for c in readme_console_commands() if Path(c[0]).name == "tau2-rl-tasks"]
    argv = [str(BIN / "tau2-rl-tasks"), *cmd[1:]]
    domains = argv.index("--domains")
    argv[domains + 1:domains + 2] = ["mock"]
    argv[argv.index("--splits") + 1] = "base"
    proc = fresh_shell(shlex.join(argv), tmp_path)
    assert proc.returncode == 0, proc.stderr
    out_dir = tmp_path / argv[argv.index("--local-dir") + 1]
    rows = [json.loads(line) for line in (out_dir / "tau2_base_all_tasks.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and rows[0]["metadata"]["domain"] == "mock"


def test_help_config_lists_every_setting_that_help_leaves_out() -> None:
    from dataclasses import fields

    from tau2_rl_pipeline.config import Tau2Config, config_help, env_var
    from tau2_rl_pipeline.eval.args import build_parser

    text = config_help()
    help_text = build_parser().format_help()
    for f in fields(Tau2Config):
        flag = "--" + f.name.replace("_", "-")
        assert f"{flag} " in text + " " and env_var(f.name) in text, f.name
        assert f"{flag} " not in help_text, f"{flag} is in --help: it no longer fits one screen"
    assert "--help-config" in help_text
    assert build_parser().parse_args(["--max-turns", "3"]).max_turns == 3  # hidden from --help, still a flag


@pytest.mark.parametrize("name", sorted(CONSOLE_SCRIPTS))
def test_every_console_script_answers_help_config(name: str, capsys) -> None:
    """The README says every command has --help-config: the ones that read TAU2_* settings list them, the others
    say they read none (exit 0, not argparse's "unrecognized arguments")."""
    import importlib

    module, func = CONSOLE_SCRIPTS[name].split(":")
    with pytest.raises(SystemExit) as stop:
        getattr(importlib.import_module(module), func)(["--help-config"])
    out = capsys.readouterr().out
    assert stop.value.code in (0, None)
    assert "TAU2_MAX_TURNS" in out or out.strip() == f"{name} reads no TAU2_* setting: --help-all lists all its options"
