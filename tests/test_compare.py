"""Checkpoint comparison (tau2_rl_pipeline/eval/compare.py, tau2-rl-compare): the paired permutation p-value and the paired bootstrap
CI against independent computations (binomial tails, itertools enumeration, the exact bootstrap distribution), the
comparison of constructed runs, the refusal of runs that measure different things, and the command line on files
written by the evaluator's own episode log."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tau2_rl_pipeline.eval.compare import (
    COMPARED_FIELDS,
    EXACT_MAX_TASKS,
    NotComparable,
    check_comparable,
    compare_runs,
    paired_difference,
    sign_flip_p_value,
    verdict_lines,
)
from tau2_rl_pipeline.eval.compare_cli import main
from tau2_rl_pipeline.eval.episodes_file import EpisodesFile


def binomial_tail_p(positives: int, t: int) -> float:
    """Two-sided sign-flip p of t differences all of size 1, `positives` of them positive: the sum under random
    signs is 2X - t with X ~ Binomial(t, 1/2)."""
    observed = abs(2 * positives - t)
    return sum(math.comb(t, x) for x in range(t + 1) if abs(2 * x - t) >= observed) / 2 ** t


def enumerated_p(diffs: list[float]) -> float:
    """The same p by enumerating every sign pattern in plain Python."""
    observed = abs(sum(diffs))
    hits = sum(abs(sum(s * d for s, d in zip(signs, diffs))) >= observed - 1e-12
               for signs in itertools.product((-1, 1), repeat=len(diffs)))
    return hits / 2 ** len(diffs)


@pytest.mark.parametrize("positives,t", [(3, 3), (5, 5), (9, 12), (6, 12), (0, 7)])
def test_exact_p_value_equals_the_binomial_tail(positives: int, t: int) -> None:
    diffs = [1.0] * positives + [-1.0] * (t - positives)
    assert sign_flip_p_value(diffs) == pytest.approx(binomial_tail_p(positives, t), abs=1e-12)


def test_exact_p_value_equals_plain_enumeration_on_uneven_differences() -> None:
    rng = np.random.default_rng(7)
    for t in (1, 4, 9):
        diffs = list(np.round(rng.uniform(-1, 1, size=t), 3))
        assert sign_flip_p_value(diffs) == pytest.approx(enumerated_p(diffs), abs=1e-12)
    assert sign_flip_p_value([0.0, 0.0, 0.0]) == 1.0  # no difference at all: nothing is more extreme than zero


def test_monte_carlo_p_value_above_the_exact_limit_is_close_to_the_binomial_tail() -> None:
    t = EXACT_MAX_TASKS + 4
    diffs = [1.0] * 15 + [-1.0] * (t - 15)
    exact = binomial_tail_p(15, t)  # 0.0414
    assert sign_flip_p_value(diffs, n_perm=40_000, seed=3) == pytest.approx(exact, abs=0.004)


def test_paired_bootstrap_ci_matches_the_exact_bootstrap_distribution() -> None:
    """For 5 tasks the bootstrap distribution of mean(d) is known exactly (all 5^5 equally likely resamples); the
    percentile CI must sit at its 2.5% and 97.5% quantiles, up to the Monte Carlo error of the draw."""
    a = [0.0, 0.5, 1.0, 0.25, 0.0]
    b = [1.0, 0.5, 1.0, 1.0, 0.75]
    d = [y - x for x, y in zip(a, b)]
    means = sorted(sum(d[i] for i in idx) / 5 for idx in itertools.product(range(5), repeat=5))
    q = lambda p: means[int(p * (len(means) - 1))]  # noqa: E731
    entry = paired_difference(a, b, n_boot=20_000, seed=1)
    assert entry["diff"] == pytest.approx(sum(d) / 5) and entry["a"] == pytest.approx(0.35)
    lo, hi = entry["ci"]
    assert q(0.015) <= lo <= q(0.035)
    assert q(0.965) <= hi <= q(0.985)
    assert entry["p_value"] == pytest.approx(enumerated_p(d))


# ---------------------------------------------------------------------------------------------------
# Runs

SETTINGS = {"benchmark": {"tau2_version": "26.3", "task_set_hash": "abc"}, "judge": None, "domains": ["mock"],
            "task_split": "base", "task_ids": None, "user": "scripted", "user_model": None, "user_temperature": None,
            "num_samples": 2, "runs": 1, "model": "a", "seed": 1, "max_turns": 8, "max_steps": 200,
            "max_errors": 10, "max_context_len": 32768,
            "sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "max_new_tokens": 96, "stop_token_ids": [1]}}


def records(outcomes: dict[str, list[float | None]], domain: str = "mock") -> list[dict]:
    """One record per sample; a reward of None is an aborted episode."""
    return [{"domain": domain, "task_id": t, "sample": s, "status": "aborted" if r is None else "completed",
             "reward": 0.0 if r is None else r} for t, rs in outcomes.items() for s, r in enumerate(rs)]


A = {"t1": [0, 0], "t2": [1, 0], "t3": [1, 1], "t4": [0, 0], "t5": [1, None]}
B = {"t1": [1, 1], "t2": [1, 1], "t3": [1, 0], "t4": [0, 0], "t5": [1, 1], "t6": [1, 1]}


def test_compare_runs_pairs_tasks_and_names_the_flips() -> None:
    result = compare_runs({"settings": SETTINGS, "records": records(A)},
                          {"settings": {**SETTINGS, "model": "b", "seed": 2}, "records": records(B)})
    mock = result["scopes"]["mock"]
    assert mock["n_tasks"] == 5 and mock["k"] == 1  # t5 has one scored episode in A (the other aborted)
    assert mock["unpaired_tasks"] == ["t6"]
    assert mock["better_in_b"] == ["t1", "t2"] and mock["worse_in_b"] == ["t3"]
    p1 = mock["metrics"]["pass@1"]
    a_rates, b_rates = [0, .5, 1, 0, 1], [1, 1, .5, 0, 1]
    assert p1["a"] == pytest.approx(sum(a_rates) / 5) and p1["b"] == pytest.approx(sum(b_rates) / 5)
    assert p1["p_value"] == pytest.approx(enumerated_p([y - x for x, y in zip(a_rates, b_rates)]))
    assert list(mock["metrics"]) == ["pass@1"]  # k = 1: pass^1 is pass@1


def test_pass_hat_k_uses_the_runs_samples_per_task_and_domains_pool_overall() -> None:
    a = records({"t1": [0, 0], "t2": [1, 1], "t3": [1, 0]}) + records({"x": [0, 0], "y": [1, 0]}, "other")
    b = records({"t1": [1, 1], "t2": [1, 1], "t3": [1, 1]}) + records({"x": [1, 1], "y": [1, 1]}, "other")
    settings = {**SETTINGS, "domains": ["mock", "other"]}
    result = compare_runs({"settings": settings, "records": a}, {"settings": settings, "records": b})
    assert set(result["scopes"]) == {"mock", "other", "overall"}
    hat = result["scopes"]["mock"]["metrics"]["pass^2"]
    assert (hat["a"], hat["b"], hat["diff"]) == pytest.approx((1 / 3, 1.0, 2 / 3))
    overall = result["scopes"]["overall"]
    assert overall["n_tasks"] == 5 and overall["metrics"]["pass^2"]["diff"] == pytest.approx(4 / 5)
    assert overall["metrics"]["pass^2"]["p_value"] == pytest.approx(enumerated_p([1, 0, 1, 1, 1]))


@pytest.mark.parametrize("field", COMPARED_FIELDS)
def test_runs_that_measure_different_things_are_refused_naming_the_field(field: str) -> None:
    changed = {"benchmark": {"tau2_version": "1.0.1", "task_set_hash": "abc"}, "judge": {"model": "gpt-4.1"},
               "domains": ["airline"], "task_split": "test", "task_ids": ["t1"], "user": "llm",
               "user_model": "gpt-4.1", "user_temperature": 0.0, "user_strategy": {"name": "verify", "max_checks": 2},
               "user_llm_args": {"temperature": 0.0, "extra_body": {"chat_template_kwargs": {}}},
               "num_samples": 4, "runs": 3,
               "sampling": {**SETTINGS["sampling"], "temperature": 1.0}, "max_turns": 30, "max_steps": 100,
               "max_errors": 5, "max_context_len": 4096}[field]
    with pytest.raises(NotComparable) as e:
        check_comparable(SETTINGS, {**SETTINGS, field: changed})
    message = str(e.value)
    assert "\n" not in message and f"differ in {field}" in message
    if field in ("benchmark", "sampling"):
        assert {"benchmark": "benchmark.tau2_version", "sampling": "sampling.temperature"}[field] in message


def test_task_sets_compare_as_sets_and_a_legacy_llm_user_ran_tau2s_strategy() -> None:
    settings = {**SETTINGS, "domains": ["mock", "airline"], "task_ids": ["t1", "t2", "t3"]}
    check_comparable(settings, {**settings, "domains": ["airline", "mock"], "task_ids": ["t3", "t1", "t2"]})
    with pytest.raises(NotComparable, match="differ in task_ids"):
        check_comparable(settings, {**settings, "task_ids": ["t1", "t2"]})
    llm = {**SETTINGS, "user": "llm", "user_model": "gpt-4.1", "user_temperature": 0.0,
           "user_llm_args": {"temperature": 0.0, "num_retries": 3, "timeout": 60.0, "api_base": "http://a/v1"}}
    legacy = {k: v for k, v in llm.items() if k != "user_strategy"}  # written before the strategy was recorded
    check_comparable(legacy, {**llm, "user_strategy": {"name": "llm"}})
    with pytest.raises(NotComparable, match=r"differ in user_strategy\.name \('llm' vs 'react'\)"):
        check_comparable(legacy, {**llm, "user_strategy": {"name": "react"}})
    # how the user model is reached may differ; what it is asked may not
    transport = {"temperature": 0.0, "num_retries": 9, "timeout": 5.0, "api_base": "http://b/v1"}
    check_comparable(llm, {**llm, "user_llm_args": transport})
    with pytest.raises(NotComparable, match=r"differ in user_llm_args\.extra_body"):
        check_comparable(llm, {**llm, "user_llm_args": {**transport, "extra_body": {"x": 1}}})


def _user_settings(tmp_path: Path, **cfg_fields) -> dict:
    """The evaluator's own settings of a mock run with an LLM user configured by `cfg_fields`."""
    import argparse

    from tau2_rl_pipeline.config import Tau2Config
    from tau2_rl_pipeline.eval.plan import make_plan, run_settings
    from tau2_rl_pipeline.rollout.engines import SamplingParams

    args = argparse.Namespace(user="llm", backend="local", sglang_url=None, domain_list=["mock"], task_split="base",
                              task_id_list=None, num_samples=1, runs=1, seed=0, concurrency=1, procs=1)
    return run_settings(args, Tau2Config(**cfg_fields), SamplingParams(), "m", "tok",
                        make_plan(["mock"], "base", None, 1))


def test_the_user_strategy_is_recorded_compared_and_part_of_a_resumes_identity(tmp_path: Path) -> None:
    from tau2_rl_pipeline.eval.episodes_file import EpisodesFileError
    from tau2_rl_pipeline.eval.plan import episode_settings

    plain = _user_settings(tmp_path)
    verify = _user_settings(tmp_path, user_strategy="verify", user_strategy_max_checks=3)
    assert plain["user_strategy"] == {"name": "llm"} and verify["user_strategy"] == {"name": "verify", "max_checks": 3}
    assert plain["user_llm_args"]["temperature"] == 0.0
    with pytest.raises(NotComparable, match="differ in user_strategy"):
        check_comparable(plain, verify)
    path = tmp_path / "run.json.episodes.jsonl"
    log = EpisodesFile(path, episode_settings(plain), benchmark=plain["benchmark"])
    log.open_for_append()
    log.append({"domain": "mock", "task_id": "create_task_1", "sample": 0, "status": "completed", "reward": 1.0})
    log.close()
    header = json.loads(path.read_text().splitlines()[0])["header"]["settings"]
    assert header["user_strategy"] == {"name": "llm"} and "timeout" not in header["user_llm_args"]
    with pytest.raises(EpisodesFileError, match=r"other settings \(user_strategy\)"):
        EpisodesFile(path, episode_settings(verify), benchmark=verify["benchmark"]).load()
    with pytest.raises(EpisodesFileError, match=r"other settings \(user_llm_args\)"):
        EpisodesFile(path, episode_settings(_user_settings(tmp_path, user_api_base="http://127.0.0.1:1/v1")),
                     benchmark=plain["benchmark"]).load()  # a served Qwen3 user is told not to think: extra_body
    slower = _user_settings(tmp_path, user_timeout_s=300.0, user_max_retries=9)  # transport: the same episodes
    assert list(EpisodesFile(path, episode_settings(slower), benchmark=plain["benchmark"]).load()) == [
        ("mock", "create_task_1", 0)]


def test_model_seed_and_stop_tokens_may_differ() -> None:
    other = {**SETTINGS, "model": "other", "seed": 9, "sampling": {**SETTINGS["sampling"], "stop_token_ids": [7]}}
    check_comparable(SETTINGS, other)
    legacy = {k: v for k, v in SETTINGS.items() if k != "runs"}  # a summary written before --runs existed
    check_comparable(legacy, SETTINGS)


def test_when_every_task_moves_alike_the_verdict_says_so_instead_of_a_zero_width_ci() -> None:
    tasks = {f"t{i}": [0, 0] for i in range(16)}
    result = compare_runs({"settings": SETTINGS, "records": records(tasks)},
                          {"settings": SETTINGS, "records": records({t: [1, 1] for t in tasks})})
    entry = result["scopes"]["mock"]["metrics"]["pass@1"]
    assert entry["ci"] == [1.0, 1.0] and entry["all_alike"] and entry["p_value"] == pytest.approx(2 / 2 ** 16)
    [line] = verdict_lines("A", "B", result)
    assert "every one of the 16 tasks moved alike" in line and "95% CI" not in line
    mixed = compare_runs({"settings": SETTINGS, "records": records(tasks)},
                         {"settings": SETTINGS, "records": records({**tasks, "t0": [1, 1], "t1": [1, 0]})})
    assert not mixed["scopes"]["mock"]["metrics"]["pass@1"]["all_alike"]
    assert "95% CI" in verdict_lines("A", "B", mixed)[0]


def test_a_pass_hat_k_that_cannot_be_computed_is_named_in_a_warning() -> None:
    result = compare_runs({"settings": SETTINGS, "records": records(A)},
                          {"settings": SETTINGS, "records": records(B)})
    assert result["scopes"]["mock"]["warnings"] == [
        "pass^2 not computed: 1 of 5 paired tasks hold fewer than 2 scored episodes in a run: t5 (A 1, B 2)"]
    line, warning = verdict_lines("A", "B", result)
    assert line.startswith("B vs A (mock, 5 paired tasks)") and warning.startswith("WARNING (mock): pass^2 not computed")


def test_verdict_says_plainly_when_a_difference_is_not_significant() -> None:
    tasks = {f"t{i}": [1, 1] for i in range(9)}
    same = compare_runs({"settings": SETTINGS, "records": records(tasks)},
                        {"settings": SETTINGS, "records": records({**tasks, "t0": [0, 1]})})
    [line] = verdict_lines("RFT", "GRPO", same)
    assert line.startswith("GRPO vs RFT (mock, 9 paired tasks): pass@1 0.944 vs 1.000: -0.056")
    assert "NOT significant" in line and "0 tasks better, 1 worse" in line
    gained = compare_runs({"settings": SETTINGS, "records": records({t: [0, 0] for t in tasks})},
                          {"settings": SETTINGS, "records": records(tasks)})
    [line] = verdict_lines("RFT", "GRPO", gained)
    assert "p=0.004" in line and line.endswith("significant: GRPO is better than RFT")  # 2/2^9


# ---------------------------------------------------------------------------------------------------
# Command line

def write_run(path: Path, settings: dict, recs: list[dict]) -> Path:
    """A finished run as the evaluator leaves it: the summary (with the count of its planned episodes) and the
    episode log beside it (its own writer)."""
    log = EpisodesFile(path.with_name(path.name + ".episodes.jsonl"), {"seed": settings["seed"]},
                       benchmark=settings["benchmark"])
    log.open_for_append(discard=True)
    for r in recs:
        log.append(r)
    log.close()
    planned = sum(r["domain"] in settings["domains"] for r in recs)
    path.write_text(json.dumps({"format": "tau2_rl_pipeline.eval_passk/1", "settings": settings,
                                "episodes": {"planned": planned}}))
    return path


def test_cli_compares_two_runs_and_writes_the_comparison(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "rft.json", SETTINGS, records(A) + records({"t1": [1, 1, 1]}, "airline"))
    b = write_run(tmp_path / "grpo.json", {**SETTINGS, "model": "b"}, records(B))
    assert main([str(a), str(b), "--names", "RFT,GRPO", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("GRPO vs RFT (mock, 5 paired tasks)")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert set(saved["scopes"]) == {"mock"}  # the airline lines lie outside run A's plan: not counted
    assert saved["runs"]["b"] == {"name": "GRPO", "summary": str(b)}


def _rewrite(path: Path, edit) -> None:
    """Apply `edit` to every line's JSON object of a file (a summary is one such line once re-dumped)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("\n".join(json.dumps(edit(obj)) for obj in lines) + "\n")


ERRORS = {"other_user": "differ in user", "not_a_summary": "not an evaluator summary",
          "no_episodes": "episodes file", "names": "--names", "malformed": "not a readable evaluator summary",
          "no_settings": "the summary has no settings", "no_num_samples": "no valid num_samples",
          "no_reward": "episode mock/t1/0 in", "string_reward": "has no numeric reward",
          "no_task_id": "holds an episode without 'task_id'",
          "json_under_a_file": "is a file, not a folder",
          "json_unwritable": "--json /sys/tau2-compare.json: cannot write in /sys",
          "cut_off": "the run is unfinished or its episodes file was cut off: its summary counts 12 episodes, the "
                     "file holds 7 (tasks with fewer than 2 episodes: mock/t4 (1)); finish it"}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_cli_errors_are_one_line(case: str, tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "a.json", SETTINGS, records(A))
    b = write_run(tmp_path / "b.json", {**SETTINGS, "user": "llm"} if case == "other_user" else SETTINGS, records(B))
    episodes = b.with_name(b.name + ".episodes.jsonl")
    argv = [str(a), str(b)]
    if case == "not_a_summary":
        b.write_text("[1, 2]")
    elif case == "malformed":
        b.write_text('{"format": "tau2_rl_pipeline.eval_passk/1", "settings": {')
    elif case in ("no_settings", "no_num_samples"):
        _rewrite(b, lambda s: {k: v for k, v in s.items() if k != "settings"} if case == "no_settings" else
                 {**s, "settings": {k: v for k, v in s["settings"].items() if k != "num_samples"}})
    elif case in ("no_reward", "string_reward", "no_task_id"):
        key, value = {"no_reward": ("reward", None), "string_reward": ("reward", "1.0"),
                      "no_task_id": ("task_id", None)}[case]
        _rewrite(episodes, lambda r: r if "header" in r or r["task_id"] != "t1" else
                 {k: v for k, v in r.items() if k != key} if value is None else {**r, key: value})
    elif case == "cut_off":  # a copy that stopped after the 7th episode: 5 of B's 12 are missing
        episodes.write_text("\n".join(episodes.read_text().splitlines()[:8]) + "\n")
    elif case == "no_episodes":
        episodes.unlink()
    elif case == "names":
        argv += ["--names", "only-one"]
    elif case == "json_under_a_file":  # checked before comparing: nothing printed but the line
        argv += ["--json", str(a / "c.json")]
    elif case == "json_unwritable":  # /sys refuses a new file even to root
        argv += ["--json", "/sys/tau2-compare.json"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err and not captured.out
    assert ERRORS[case] in err


def test_a_cut_off_run_is_refused_and_compared_with_warnings_only_when_allowed(tmp_path: Path, capsys) -> None:
    """The issue's case: 9 tasks x 4 samples, the episodes file cut after 22 episodes. Refused by default (the old
    command compared '6 paired tasks' and left pass^4 out in silence); --allow-unfinished names what is missing."""
    settings = {**SETTINGS, "num_samples": 4}
    tasks = {f"t{i}": [1, 0, 1, 1] for i in range(9)}
    a = write_run(tmp_path / "a.json", settings, records(tasks))
    b = write_run(tmp_path / "b.json", settings, records({t: [1, 1, 1, 1] for t in tasks}))
    episodes = b.with_name(b.name + ".episodes.jsonl")
    episodes.write_text("\n".join(episodes.read_text().splitlines()[:23]) + "\n")
    assert main([str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "summary counts 36 episodes, the file holds 22 (tasks with fewer than 4 episodes: mock/t5 (2))" in err
    assert main([str(a), str(b), "--allow-unfinished", "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"WARNING: {b}: the run is unfinished") and "holds 22" in out[0]
    assert out[1].startswith("B vs A (mock, 6 paired tasks)") and "pass^4" not in out[1]
    assert out[2] == ("WARNING (mock): pass^4 not computed: 1 of 6 paired tasks hold fewer than 4 scored episodes "
                      "in a run: t5 (A 4, B 2)")
    saved = json.loads((tmp_path / "c.json").read_text())
    assert len(saved["warnings"]) == 1 and saved["scopes"]["mock"]["warnings"]
    assert main([str(b), str(b), "--allow-unfinished"]) == 0  # the same unfinished run as A and B: warned once
    out = capsys.readouterr().out.splitlines()
    assert sum(line.startswith(f"WARNING: {b}: the run is unfinished") for line in out) == 1, out


# ---------------------------------------------------------------------------------------------------
# The demo's report

def test_demo_report_compares_each_stage_with_the_one_it_starts_from(tmp_path: Path) -> None:
    from tau2_rl_pipeline.local.demo_report import stage_comparisons, stage_verdicts

    tasks = [f"t{i}" for i in range(9)]
    outcomes = {"base": [0] * 9, "sft": [1] * 6 + [0] * 3, "rft": [1] * 7 + [0] * 2, "grpo": [1] * 6 + [0] * 3}
    for stage, wins in outcomes.items():
        write_run(tmp_path / f"{stage}.json", {**SETTINGS, "model": stage},
                  records({t: [w, w] for t, w in zip(tasks, wins)}))
    hot = {**SETTINGS, "sampling": {**SETTINGS["sampling"], "temperature": 1.0}}
    write_run(tmp_path / "awsft.json", hot, records({t: [1, 1] for t in tasks}))
    report = {"comparisons": stage_comparisons(tmp_path, ["base", "sft", "rft", "grpo", "awsft"])}
    assert list(report["comparisons"]) == ["sft vs base", "rft vs sft", "grpo vs rft", "awsft vs rft"]
    sft = report["comparisons"]["sft vs base"]["scopes"]["mock"]
    assert sft["metrics"]["pass@1"]["diff"] == pytest.approx(6 / 9) and sft["better_in_b"] == tasks[:6]
    lines = stage_verdicts(report)
    assert lines[0].startswith("SFT vs BASE (mock, 9 paired tasks)") and "significant: SFT is better" in lines[0]
    assert "p=0.031" in lines[0]  # 2/2^6: six tasks gained, three unchanged
    assert lines[1].startswith("RFT vs SFT") and "NOT significant" in lines[1]  # one task gained: p = 1
    assert lines[2].startswith("GRPO vs RFT") and "NOT significant" in lines[2] and "0 tasks better, 1 worse" in lines[2]
    assert lines[3].startswith("AWSFT vs RFT: no paired comparison (the runs differ in sampling.temperature")
