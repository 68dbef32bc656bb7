"""The leaderboard export (tau2_rl_pipeline/eval/submission.py, `eval_passk --submission`): refused where the leaderboard would be
misled, and on tau2 1.0.1 an evaluation with the loopback judge and the scripted user whose results tau2's own
loader and metrics read (pass^k equal to ours) and whose submission.json tau2's own validation code accepts."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from pathlib import Path

import pytest

from tau2_rl_pipeline.benchmark.tau2_version import V1
from tau2_rl_pipeline.eval.submission import SubmissionError, build_submission, check_submittable

SUMMARY = {"benchmark": {"tau2_version": "1.0.1", "task_set_hash": "0" * 16},
           "episodes": {"aborted": []},
           "settings": {"domains": ["retail"], "user": "llm", "user_model": "gpt-4.1", "task_split": "base",
                        "task_ids": None, "num_samples": 4, "judge": {"model": "openai/judge"}, "model": "m"},
           "metrics": {"domains": {"retail": {"metrics": {f"pass^{k}": {"value": v} for k, v in
                                                          ((1, 0.5), (2, 0.25), (3, 0.125), (4, 0.0))}}}}}
TAU2 = {"retail": {"pass_1": 50.0, "pass_2": 25.0, "pass_3": 12.5, "pass_4": 0.0}}


def _build(summary=SUMMARY, tau2=TAU2, **kw):
    args = dict(model_name="m", model_organization="o", submitting_organization="s", contact_email=None,
                trained_on_tau2=True, trajectory_files={"retail": "r.json"})
    return build_submission(summary, tau2, **{**args, **kw})


def test_tau2s_pass_k_checked_against_ours_custom_with_a_methodology_note() -> None:
    body = _build()
    assert body["results"]["retail"] == TAU2["retail"]
    assert body["submission_type"] == "custom" and "Trained on tau2-bench tasks" in body["methodology"]["notes"]
    assert "judged by openai/judge" in body["methodology"]["notes"]
    assert body["methodology"]["tau2_bench_version"] == "1.0.1" and not body["methodology"]["verification"][
        "omitted_questions"]
    assert _build(trained_on_tau2=False)["submission_type"] == "standard"
    with pytest.raises(SubmissionError, match="retail pass_2: tau2 computes 26.0 from the results file"):
        _build(tau2={"retail": {**TAU2["retail"], "pass_2": 26.0}})


def test_refused_for_pre_1_0_grading_aborted_episodes_or_no_leaderboard_domain() -> None:
    with pytest.raises(SubmissionError, match="graded by tau2 26.3"):
        check_submittable("26.3", ["retail"])
    with pytest.raises(SubmissionError, match="is a leaderboard domain"):
        check_submittable("1.0.1", ["mock"])
    aborted = {**SUMMARY, "episodes": {"aborted": [{"task_id": "a"}]}}
    with pytest.raises(SubmissionError, match="1 episodes aborted"):
        _build(aborted)


@pytest.mark.skipif(V1, reason="checks the refusal on tau2 26.3")
def test_the_cli_refuses_a_submission_graded_by_26_3(tmp_path: Path) -> None:
    from tau2_rl_pipeline.eval.eval_passk import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["--backend", "local", "--model", str(tmp_path), "--domains", "retail", "--user", "scripted",
                   "--output", str(tmp_path / "r.json"), "--submission", str(tmp_path / "sub")])
    assert rc == 2 and "graded by tau2 26.3" in err.getvalue() and not (tmp_path / "sub").exists()


# -- tau2 1.0.1, end to end ----------------------------------------------------------------------------------------

TASKS = ["12", "62", "68", "36"]  # no writes unjudged, no writes judged (x2), writes judged (the goodbye fails it)


@pytest.mark.skipif(not V1, reason="tau2 1.0.1 only (tests/test_tau2_v1.py runs this file on 1.0.1)")
def test_a_1_0_1_run_is_read_by_tau2_and_its_submission_passes_tau2s_validation(
        tiny_engine, tiny_small_dir: Path, loopback_judge, tmp_path: Path) -> None:
    from judge_double import judge_answer
    from rich.console import Console
    from support.loopback_server import LoopbackServer
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics
    from tau2.scripts.leaderboard.prepare_submission import (
        check_and_load_submission_data,
        validate_submission_metrics,
        validate_submission_traj_set,
    )
    from tau2.scripts.leaderboard.submission import Submission

    from tau2_rl_pipeline.eval.eval_passk import main

    goodbye = tiny_engine.tokenizer.encode("Thank you, goodbye." + tiny_engine.tokenizer.eos_token,
                                           add_special_tokens=False)
    verdicts = itertools.cycle([True, True, False])  # some judged episodes fail their assertions
    loopback_judge.chat_answer = judge_answer(lambda outcome: next(verdicts))
    out = tmp_path / "run.json"
    try:
        with LoopbackServer(tiny_engine) as policy:
            policy.script(*[goodbye] * (len(TASKS) * 3))
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(["--backend", "sglang", "--sglang-url", policy.base_url, "--hf-checkpoint",
                           str(tiny_small_dir), "--user", "scripted", "--domains", "retail", "--task-split", "test",
                           "--task-ids", ",".join(TASKS), "--num-samples", "3", "--max-new-tokens", "32",
                           "--output", str(out), "--submission", str(tmp_path / "submission"),
                           "--model-organization", "Cookbook", "--submitting-organization", "Cookbook"])
    finally:
        loopback_judge.chat_answer = judge_answer()
    assert rc == 0, err.getvalue()
    summary = json.loads(out.read_text())
    assert summary["benchmark"]["tau2_version"] == "1.0.1" and summary["settings"]["judge"]["model"] == "openai/judge"
    assert summary["judge"]["usage_over_recorded_episodes"]["calls"] == 9  # 62, 68, 36 judged, 3 samples each
    assert summary["judge"]["usage_over_recorded_episodes"]["prompt_tokens"] > 0
    ours = summary["metrics"]["domains"]["retail"]["metrics"]
    assert 0 < ours["pass^1"]["value"] < 1

    results_path = out.with_name("run.retail.tau2.json")
    assert json.loads(results_path.read_text())["benchmark"] == summary["benchmark"]
    theirs = compute_metrics(Results.load(results_path))  # tau2 1.0.1's own loader and metrics
    assert set(theirs.pass_hat_ks) == {1, 2, 3}
    for k, value in theirs.pass_hat_ks.items():
        assert ours[f"pass^{k}"]["value"] == pytest.approx(value, abs=1e-12)

    directory = tmp_path / "submission"
    submission = Submission.load(directory / "submission.json")  # tau2's schema (extra keys refused)
    assert submission.submission_type == "custom" and submission.results.retail.pass_3 is not None
    ok, error, data = check_and_load_submission_data(str(directory))
    assert ok, error
    assert validate_submission_traj_set(data.results) == (True, "")
    console = Console(record=True, width=200)
    validate_submission_metrics(data.submission, data.results, console)
    report = console.export_text()
    assert "Submission metrics validation successful" in report, report  # no mismatching pass^k
    for k in (1, 2, 3):
        assert getattr(submission.results.retail, f"pass_{k}") == pytest.approx(100 * ours[f"pass^{k}"]["value"])
