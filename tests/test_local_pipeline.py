"""The local pipeline's reruns and report: each stage's output is recorded with the settings that made it and the
tau2 benchmark it ran on (a rerun skips, resumes or redoes it, and says which; another tau2's outputs are refused),
GRPO resumes at its last finished step with that step's curriculum, and the report counts the GRPO steps that had a
learning signal.

GRPO runs here for real (tiny model, real mock episodes and the scripted user) but small; the evaluations, which
the pipeline runs as tau2_rl_pipeline/eval/eval_passk.py subprocesses, are covered by that CLI's own tests. On tau2 1.0.1
(tests/test_tau2_v1.py) the whole pipeline runs once, tiny, end to end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import V1, VERSION, BenchmarkMismatch, task_set_hash
from tau2_rl_pipeline.config import Tau2Config, config_from_args
from tau2_rl_pipeline.local.demo_report import grpo_summary, summary_lines, write_charts
from tau2_rl_pipeline.local.grpo import GrpoProgress, GrpoSettings, grpo_stage
from tau2_rl_pipeline.local.pipeline import build_parser, default_out, main, run_benchmark, stage_settings
from tau2_rl_pipeline.local.stage_book import RUN, SKIP, StageBook, StaleOutputError

BENCHMARK = {"tau2_version": "0.0", "task_set_hash": "0" * 16}  # any: the book only records and compares it


def settings_for(*argv: str) -> dict[str, dict]:
    args = build_parser().parse_args(list(argv))
    args.max_turns = 8
    return stage_settings(args, config_from_args(args, {}), "base", "base")


# ---------------------------------------------------------------------------------------------------------------
# Settings per stage


def test_a_setting_changes_the_stages_it_affects_and_no_earlier_one() -> None:
    default = settings_for()
    changed = {
        ("--grpo-steps", "2"): {"grpo", "eval grpo"},
        ("--rft-samples", "2"): {"rft", "grpo", "eval rft", "eval grpo"},
        ("--eval-samples", "2"): {"eval base", "eval sft", "eval rft", "eval grpo"},
        ("--domain", "airline"): set(default),  # the tokenizer is trained on the domain's texts: everything
        ("--reward-alpha", "0.5"): {"rft", "grpo", "eval base", "eval sft", "eval rft", "eval grpo"},
        ("--sft-epochs", "3"): {"sft", "rft", "grpo", "eval sft", "eval rft", "eval grpo"},
    }
    for argv, stages in changed.items():
        other = settings_for(*argv)
        assert {s for s in default if default[s] != other[s]} == stages, argv
    assert settings_for("--device", "cpu", "--episode-workers", "0") == default  # speed, not outcome


def test_the_book_skips_resumes_redoes_and_refuses(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    ckpt, partial = out / "sft", out / "eval" / "sft.json.episodes.jsonl"
    book = StageBook(out, BENCHMARK)
    assert book.plan("sft", {"epochs": 40}, [ckpt]).message == "sft: running"
    ckpt.mkdir(parents=True)
    assert StageBook(out, BENCHMARK).plan("sft", {"epochs": 40}, [ckpt]).message == (
        "sft: unfinished with these settings: running it again (resuming what it can)")
    book = StageBook(out, BENCHMARK)
    book.plan("sft", {"epochs": 40}, [ckpt])
    book.finish("sft", {"loss": 0.5})
    plan = StageBook(out, BENCHMARK).plan("sft", {"epochs": 40}, [ckpt])  # read back from stages.json: a rerun
    assert plan.action == SKIP and plan.result == {"loss": 0.5} and "skipped" in plan.message
    partial.parent.mkdir()
    partial.write_text("{}\n")
    plan = StageBook(out, BENCHMARK).plan("sft", {"epochs": 3}, [ckpt], [partial])
    assert plan.action == RUN and plan.message == "sft: settings changed (epochs: 40 -> 3): redoing it"
    assert not ckpt.exists() and not partial.exists()  # the old run's outputs are gone, not relabelled
    (out / "rft").mkdir()
    with pytest.raises(StaleOutputError, match="no record of the settings"):
        StageBook(out, BENCHMARK).plan("rft", {"epochs": 3}, [out / "rft"])


@pytest.mark.parametrize("held", [["sft"], ["passk.json", "passk.png"]])
def test_output_without_a_record_is_refused_in_one_line(tmp_path: Path, capsys, held: list[str]) -> None:
    """An output directory written by an older version (no stages.json), or holding anything else (say the
    evaluator's outputs/eval), is refused, never reused, relabelled or written beside."""
    for name in held:
        (tmp_path / "demo" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "demo" / name).mkdir() if "." not in name else (tmp_path / "demo" / name).write_text("{}")
    assert main(["--out", str(tmp_path / "demo")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0] == (f"error: {tmp_path / 'demo'} holds other files ({', '.join(held)}) and "
                                            "no record of a demo run: pass --out DIR with a new or empty folder"), lines
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == held  # nothing built or written


def test_another_domains_run_is_refused_in_words_and_each_domain_has_its_own_default(tmp_path: Path,
                                                                                     capsys) -> None:
    """`tau2-rl-demo --domain airline` after the mock demo: by default it goes to its own folder; pointed at the
    mock demo's, the refusal says what that folder holds (no hashes) and what to do."""
    out = tmp_path / "demo"
    mock = run_benchmark("mock", "base", "base", Tau2Config.from_env({}).retrieval_variant)
    book = StageBook(out, mock)
    book.plan("base", settings_for()["base"], [])
    book.plan("eval base", settings_for()["eval base"], [])
    assert main(["--domain", "airline", "--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"error: {out} holds the demo run on mock (evaluated on base) on another task set than this "
                     "run's: pass --out DIR to keep it and run this one beside it"], lines
    assert build_parser().parse_args(["--domain", "airline"]).out is None
    assert default_out("mock") == Path("outputs/demo") and default_out("airline") == Path("outputs/demo-airline")


@pytest.mark.parametrize("where", ["under_a_file", "proc"])
def test_an_unwritable_out_is_one_line(tmp_path: Path, capsys, where: str) -> None:
    (tmp_path / "file").write_text("x")
    out = {"under_a_file": tmp_path / "file" / "demo", "proc": Path("/proc/tau2-demo-test/demo")}[where]
    assert main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: --out {out}: cannot write") and "Traceback" not in err


def test_an_unfinished_run_on_another_tau2_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    """A run stopped before its report (SFT done and evaluated) on the other tau2: resuming it would skip those
    stages and report their numbers under this tau2's grading. Refused before anything is built or removed."""
    out = tmp_path / "demo"
    other = {"tau2_version": "26.3" if V1 else "1.0.1", "task_set_hash": "0123456789abcdef"}
    book = StageBook(out, other)
    for stage in ("sft", "eval sft"):
        book.plan(stage, {"epochs": 40}, [])
        book.finish(stage, {"loss": 0.5})
    (out / "sft").mkdir()
    recorded = (out / "stages.json").read_text()
    assert main(["--out", str(out)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {out} was produced with tau2 "
                                                   f"{other['tau2_version']}, this run uses tau2 {VERSION}"), lines
    assert sorted(p.name for p in out.iterdir()) == ["sft", "stages.json"]  # nothing built, nothing removed
    assert (out / "stages.json").read_text() == recorded
    mock = run_benchmark("mock", "base", "base", Tau2Config.from_env({}).retrieval_variant)
    with pytest.raises(BenchmarkMismatch, match="another task set"):  # this tau2, other tasks
        StageBook(out, other | {"task_set_hash": mock["task_set_hash"]})


@pytest.mark.skipif(not V1, reason="tau2 1.0.1 only (tests/test_tau2_v1.py runs it there; CI runs the demo on 26.3)")
def test_the_whole_pipeline_runs_on_tau2_1_0_1_and_records_it(tiny_small_dir: Path, tmp_path: Path,
                                                               capsys) -> None:
    """SFT, RFT, GRPO and AWSFT, each evaluated, tiny, on 1.0.1's mock tasks; a rerun skips every stage; the same
    outputs as recorded by a 26.3 run are refused."""
    out = tmp_path / "demo"
    argv = ["--domain", "mock", "--model", str(tiny_small_dir), "--out", str(out), "--algorithm", "grpo,awsft",
            "--sft-epochs", "1", "--rft-samples", "1", "--rft-epochs", "1", "--eval-samples", "1", "--grpo-steps",
            "1", "--grpo-tasks-per-step", "2", "--grpo-n", "2", "--max-new-tokens", "8", "--max-turns", "1",
            "--micro-batch-size", "8"]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    tasks = load_tasks("mock", "base")
    report = json.loads((out / "report.json").read_text())
    assert report["benchmark"] == {"tau2_version": VERSION, "task_set_hash": task_set_hash({"mock": tasks * 2})}
    assert VERSION.startswith("1.") and list(report["stages"]) == ["base", "sft", "rft", "grpo", "awsft"]
    assert all(s["pass@1"]["n_tasks"] == len(tasks) for s in report["stages"].values())  # 1.0.1's 10 mock tasks
    assert report["sft"]["demonstrations"] > 0 and report["grpo"]["steps"] == report["awsft"]["steps"] == 1
    for name in ("base", "sft", "rft_samples", "rft", "grpo", "awsft"):  # every evaluation graded by 1.0.1
        header = json.loads((out / "eval" / f"{name}.json.episodes.jsonl").open().readline())["header"]
        assert header["benchmark"] == {"tau2_version": VERSION, "task_set_hash": task_set_hash({"mock": tasks})}
        assert json.loads((out / "eval" / f"{name}.mock.tau2.json").read_text())["benchmark"] == header["benchmark"]
    capsys.readouterr()
    assert main(argv) == 0  # resumed: everything done with these settings on this benchmark
    skipped = [line for line in capsys.readouterr().err.splitlines() if "done with these settings, skipped" in line]
    assert len(skipped) == 9  # the base evaluation, then sft, rft, grpo and awsft, each with its evaluation

    records = json.loads((out / "stages.json").read_text())
    for record in records.values():  # as a run on tau2 26.3 would have recorded them
        record["benchmark"] = {"tau2_version": "26.3", "task_set_hash": "0123456789abcdef"}
    (out / "stages.json").write_text(json.dumps(records))
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"was produced with tau2 26.3, this run uses tau2 {VERSION}: results of two tau2 versions are not "
        "comparable; pass --out DIR to keep it and run this one beside it")
    assert (out / "sft" / "config.json").is_file() and (out / "report.json").is_file()  # nothing removed


@pytest.mark.skipif(not V1, reason="tau2 1.0.1 only: 26.3's retail has no judged task (tests/test_tau2_v1.py runs it)")
def test_a_judged_domain_without_a_reachable_judge_is_one_line_before_any_work(tmp_path: Path, capsys,
                                                                                 monkeypatch) -> None:
    for name in ("TAU2_JUDGE_API_BASE", "TAU2_JUDGE_MODEL", "OPENAI_API_KEY"):  # tau2's default judge, no key
        monkeypatch.delenv(name, raising=False)
    assert main(["--domain", "retail", "--out", str(tmp_path / "d")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: tau2's NL-assertion judge") and "OPENAI_API_KEY" in lines[0]
    assert not (tmp_path / "d").exists()  # no tokenizer, model or evaluation started


def test_a_bad_tau2_value_is_one_line_not_a_traceback(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TAU2_REWARD_ALPHA", "lots")
    assert main(["--out", str(tmp_path / "d")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: TAU2_REWARD_ALPHA='lots'"), lines
    assert not (tmp_path / "d").exists()


def test_ctrl_c_anywhere_is_one_line_saying_how_to_resume(tmp_path: Path, capsys, monkeypatch) -> None:
    import tau2_rl_pipeline.local.pipeline as pipeline

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "prepare_model", interrupted)
    assert main(["--out", str(tmp_path / "d")]) == 130
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("interrupted:") and "rerun the same command" in lines[0], lines


def test_a_child_stopped_by_ctrl_c_leaves_the_line_to_the_child(capsys) -> None:
    """The evaluator (a child process) gets Ctrl-C too and reports what it kept; the pipeline adds nothing."""
    from tau2_rl_pipeline.local.pipeline import StageFailed, run_child

    with pytest.raises(StageFailed) as info:
        run_child([sys.executable, "-c", "import sys; print('interrupted: child', file=sys.stderr); sys.exit(130)"],
                  "evaluation of sft")
    assert info.value.returncode == 130
    with pytest.raises(StageFailed, match=r"^evaluation of sft failed \(exit 3\)"):
        run_child([sys.executable, "-c", "raise SystemExit(3)"], "evaluation of sft")


# ---------------------------------------------------------------------------------------------------------------
# GRPO: resume at the last finished step, and the report's count of steps with signal


def grpo_settings(steps: int) -> GrpoSettings:
    return GrpoSettings(domain="mock", split="base", steps=steps, tasks_per_step=2, n=2, lr=1e-4, temperature=1.5,
                        max_new_tokens=24, kl_coef=0.0, entropy_coef=0.0, micro_batch_size=4, seed=0)


class Interrupt(Exception):
    pass


def test_an_interrupted_grpo_resumes_at_its_last_step_with_that_steps_curriculum(tiny_small_dir: Path,
                                                                                  tmp_path: Path) -> None:
    cfg = Tau2Config.from_env({}, max_turns=2, episode_workers=0, task_sampler="learning_value")
    whole = grpo_stage(grpo_settings(3), tiny_small_dir, tmp_path / "a" / "model", tmp_path / "a", cfg,
                       tmp_path / "a.jsonl", report=lambda line: None)

    def stop_after_step_2(line: str) -> None:
        if line.startswith("grpo step 2/"):
            raise Interrupt  # as Ctrl-C would, after step 2 was committed
    with pytest.raises(Interrupt):
        grpo_stage(grpo_settings(3), tiny_small_dir, tmp_path / "b" / "model", tmp_path / "b", cfg,
                   tmp_path / "b.jsonl", report=stop_after_step_2)
    assert GrpoProgress(tmp_path / "b").step == 2 and not (tmp_path / "b" / "model").exists()
    lines: list[str] = []
    resumed = grpo_stage(grpo_settings(3), tiny_small_dir, tmp_path / "b" / "model", tmp_path / "b", cfg,
                         tmp_path / "b.jsonl", report=lines.append)
    assert lines[0] == "grpo: resuming after step 2 of 3 (its weights, optimizer and curriculum)"
    assert [line.split(":")[0] for line in lines[1:]] == ["grpo step 3/3"]  # steps 1 and 2 are not run again

    def without_timing(history: list[dict]) -> list[dict]:
        return [{k: v for k, v in h.items() if k != "rollout_s"} for h in history]
    assert without_timing(resumed) == without_timing(whole)  # same draws, rewards and updates as uninterrupted
    for h in whole:  # the step log's behaviour monitors cover the step's scored episodes
        b = h["behaviour"]
        assert b["episodes"] == h["episodes"] - h["aborted"] == 4
        assert b["agent_ended_share"] + b["user_ended_share"] + b["limit_ended_share"] == pytest.approx(1.0)
    curriculum = json.loads((GrpoProgress(tmp_path / "b").step_dir() / "curriculum_state.json").read_text())
    assert sum(t["attempts"] for t in curriculum["tasks"].values()) == 3 * 2 * 2  # each episode counted once
    assert [p.name for p in (tmp_path / "b").iterdir() if "step_" in p.name] == ["step_3"]


def history_step(step: int, groups_without_signal: int, trained: int) -> dict:
    return {"step": step, "tasks": [], "episodes": 24, "raw_reward_mean": 0.5, "shaped_reward_mean": 0.6,
            "success_rate": 0.5, "groups": 3, "groups_without_signal": groups_without_signal,
            "trained_sequences": trained}


def test_the_report_counts_grpo_steps_with_signal_and_charts_them(tmp_path: Path) -> None:
    history = [history_step(1, 1, 16), history_step(2, 3, 0), history_step(3, 0, 24)]
    summary = grpo_summary(history)
    assert (summary["steps"], summary["steps_with_signal"], summary["groups"], summary["groups_with_signal"],
            summary["episodes"]) == (3, 2, 9, 5, 72)
    report = {"domain": "mock", "stages": {}, "grpo": summary}
    assert summary_lines(report) == ["GRPO: 2/3 steps with signal (5/9 groups, 72 episodes)"]
    row = {"k": 4, "pass@1": {"value": 0.75}, "pass@4": {"value": 0.778}, "mean_partial": {"value": 0.66}}
    same = {**report, "stages": {"rft": row, "grpo": dict(row)}}
    assert summary_lines(same)[-1] == ("GRPO changed nothing measurable: its row equals RFT's on every metric "
                                       "(its updates flipped no evaluated episode)")
    moved = {**report, "stages": {"rft": row, "grpo": {**row, "pass@1": {"value": 0.722}}}}
    assert summary_lines(moved) == summary_lines(report)  # a difference: the paired comparison's to judge
    (chart,) = write_charts(report, tmp_path)
    assert chart.name == "grpo_reward.png" and chart.stat().st_size > 0


def test_each_stage_depends_on_the_settings_of_the_stage_it_starts_from() -> None:
    from tau2_rl_pipeline.launch.recipe import starts_from

    settings = settings_for("--algorithm", "grpo,awsft")
    for stage in ("sft", "rft", "grpo", "awsft"):
        start = settings[starts_from(stage)]
        assert {k: settings[stage][k] for k in start} == start, stage
