"""Pass@k / pass^k estimators against brute force, the bootstrap, and summarize() on hand-computed records."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from tau2_rl_pipeline.metrics import (
    bootstrap_ci,
    format_metric,
    is_success,
    over_runs,
    pass_at_k,
    pass_hat_k,
    summarize,
)


def rec(domain, task_id, sample, reward, *, status="completed", partial=None, reason=None, parse_errors=0,
        unknown_tool_calls=0, user_tool_calls_by_agent=0, turns=5):
    """One episode record as eval_passk.py writes it; defaults describe a clean run that the user ended."""
    return {"domain": domain, "task_id": task_id, "sample": sample, "status": status, "reward": float(reward),
            "partial": float(reward) if partial is None else partial,
            "termination_reason": reason or ("aborted" if status == "aborted" else "user_stop"),
            "parse_errors": parse_errors, "unknown_tool_calls": unknown_tool_calls,
            "user_tool_calls_by_agent": user_tool_calls_by_agent, "turns": turns}


def task_recs(domain, task_id, outcomes, start=0):
    return [rec(domain, task_id, start + s, o) for s, o in enumerate(outcomes)]


# ---------------------------------------------------------------------------------------------------
# Estimators

@pytest.mark.parametrize("n", range(1, 9))
def test_estimators_match_brute_force_over_all_k_subsets(n):
    rng = np.random.default_rng(n)
    for c in range(n + 1):
        outcomes = rng.permutation([True] * c + [False] * (n - c))  # order must not matter
        for k in range(1, n + 1):
            subsets = list(combinations(outcomes, k))
            any_ok = Fraction(sum(any(s) for s in subsets), len(subsets))
            all_ok = Fraction(sum(all(s) for s in subsets), len(subsets))
            assert abs(pass_at_k(n, c, k) - any_ok) <= 1e-12, (n, c, k)
            assert abs(pass_hat_k(n, c, k) - all_ok) <= 1e-12, (n, c, k)


def test_pass_hat_k_agrees_with_tau2():
    from tau2.metrics.agent_metrics import pass_hat_k as tau2_pass_hat_k

    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_hat_k(n, c, k) == pytest.approx(tau2_pass_hat_k(n, c, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # math.comb(2000, 500) has ~490 digits: the product form must still agree with exact arithmetic.
    for n, c, k in [(2000, 1000, 500), (1000, 1, 1), (500, 3, 250), (300, 299, 2)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert abs(pass_at_k(n, c, k) - float(exact)) <= 1e-12
        exact_hat = Fraction(math.comb(c, k), math.comb(n, k))
        assert abs(pass_hat_k(n, c, k) - float(exact_hat)) <= 1e-12


def test_pass_at_1_is_success_fraction_and_pass_hat_n_is_all_success():
    for n in range(1, 9):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
            assert pass_hat_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
            assert pass_hat_k(n, c, n) == (1.0 if c == n else 0.0)
            assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)


@pytest.mark.parametrize("fn", [pass_at_k, pass_hat_k])
@pytest.mark.parametrize("n,c,k", [(4, 2, 5), (4, 2, 0), (4, 5, 1), (4, -1, 1), (0, 0, 1), (4.0, 2, 1),
                                   (4, 2, 1.5), (True, 1, 1)])
def test_estimators_reject_bad_input(fn, n, c, k):
    with pytest.raises(ValueError):
        fn(n, c, k)


def test_is_success_uses_tau2_tolerance():
    assert is_success(1.0) and is_success(1 - 5e-7) and is_success(1 + 5e-7)
    assert not is_success(1 - 1e-5) and not is_success(0.0) and not is_success(0.5) and not is_success(math.nan)


# ---------------------------------------------------------------------------------------------------
# Bootstrap

def test_bootstrap_is_deterministic_per_seed():
    values = np.random.default_rng(1).random(30)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)


def test_bootstrap_identical_tasks_give_a_point_interval():
    for v in (0.1, 1 / 3, 0.0, 1.0):
        assert bootstrap_ci([v] * 7) == (v, v)
        assert bootstrap_ci([v] * 7, weights=[1, 2, 3, 4, 5, 6, 7]) == (v, v)


def test_bootstrap_width_matches_normal_approximation():
    # 100 tasks, half solved: the 95% CI of the mean is about 0.5 +- 1.96 * 0.05.
    values = [1.0] * 50 + [0.0] * 50
    lo, hi = bootstrap_ci(values, n_boot=4000, seed=0)
    assert 0.39 < lo < 0.42 and 0.58 < hi < 0.61
    lo90, hi90 = bootstrap_ci(values, n_boot=4000, seed=0, alpha=0.10)
    assert lo < lo90 < 0.5 < hi90 < hi


def test_bootstrap_weights_give_the_ratio_of_sums():
    # One task dominates the episodes: the weighted statistic resamples sum(w*v)/sum(w).
    lo, hi = bootstrap_ci([1.0, 0.0], weights=[9, 1], n_boot=2000, seed=0)
    assert (lo, hi) == (0.0, 1.0)  # the two all-one-task resamples sit at the 2.5% / 97.5% tails
    # Three copies of the solved task among four draws: unweighted mean 3/4, weighted 27/(27+1).
    assert bootstrap_ci([1.0, 0.0, 0.0, 0.0], n_boot=2000, seed=0) == (0.0, 0.75)
    lo, hi = bootstrap_ci([1.0, 0.0, 0.0, 0.0], weights=[9, 1, 1, 1], n_boot=2000, seed=0)
    assert lo == 0.0 and hi == pytest.approx(27 / 28)
    assert bootstrap_ci([0.2, 0.9, 0.4], weights=[2, 2, 2], seed=5) == pytest.approx(bootstrap_ci([0.2, 0.9, 0.4], seed=5))


@pytest.mark.parametrize("values, kwargs", [([], {}), ([0.5, math.nan], {}), ([0.5], {"n_boot": 0}),
                                            ([0.5], {"alpha": 1.0}), ([0.5], {"seed": -1}), ([0.5], {"weights": [0]}),
                                            ([0.5, 1.0], {"weights": [1]})])
def test_bootstrap_rejects_bad_input(values, kwargs):
    with pytest.raises(ValueError):
        bootstrap_ci(values, **kwargs)


# ---------------------------------------------------------------------------------------------------
# summarize

def two_domains():
    """airline: a1 2/4, a2 0/4 (+2 aborted a1 samples, a3 only aborted); retail: r1-r3 4/4, r4 0/4."""
    records = task_recs("airline", "a1", [1, 1, 0, 0]) + task_recs("airline", "a2", [0, 0, 0, 0])
    records += [rec("airline", "a1", 4, 0, status="aborted"), rec("airline", "a1", 5, 0, status="aborted"),
                rec("airline", "a3", 0, 0, status="aborted")]
    for t in ("r1", "r2", "r3"):
        records += task_recs("retail", t, [1, 1, 1, 1])
    records += task_recs("retail", "r4", [0, 0, 0, 0])
    return records


def walk_plain_json(x):
    if isinstance(x, dict):
        assert all(type(k) is str for k in x)
        for v in x.values():
            walk_plain_json(v)
    elif isinstance(x, list):
        for v in x:
            walk_plain_json(v)
    else:
        assert type(x) in (str, int, float, bool), (x, type(x))


def all_entries(s):
    for d in s["domains"].values():
        yield from d["metrics"].values()
    yield from s["overall"]["micro"].values()
    yield from s["overall"]["macro"].values()


def test_summarize_micro_and_macro_by_hand():
    s = summarize(two_domains(), n_boot=200)
    air, ret, ov = s["domains"]["airline"], s["domains"]["retail"], s["overall"]
    assert (air["n_tasks"], air["n_episodes"], ret["n_tasks"], ret["n_episodes"]) == (2, 8, 4, 16)
    assert (ov["n_tasks"], ov["n_episodes"], ov["n_domains"]) == (6, 24, 2)
    assert air["k_values"] == ret["k_values"] == ov["k_values"] == [1, 2, 3, 4]
    expected = {  # name: (airline, retail, micro over 6 tasks, macro over 2 domains)
        "pass@1": (1 / 4, 3 / 4, 3.5 / 6, 1 / 2),
        "pass@2": (5 / 12, 3 / 4, 23 / 36, 7 / 12),   # a1: 1 - C(2,2)/C(4,2) = 5/6
        "pass^2": (1 / 12, 3 / 4, 19 / 36, 5 / 12),   # a1: C(2,2)/C(4,2) = 1/6
        "pass^4": (0.0, 3 / 4, 3 / 6, 3 / 8),         # fraction of tasks solved every time
        "pass@4": (1 / 2, 3 / 4, 4 / 6, 5 / 8),
        "success_rate": (2 / 8, 12 / 16, 14 / 24, 1 / 2),
    }
    for name, (a, r, micro, macro) in expected.items():
        assert air["metrics"][name]["value"] == pytest.approx(a, abs=1e-12), name
        assert ret["metrics"][name]["value"] == pytest.approx(r, abs=1e-12), name
        assert ov["micro"][name]["value"] == pytest.approx(micro, abs=1e-12), name
        assert ov["macro"][name]["value"] == pytest.approx(macro, abs=1e-12), name
    assert ov["micro"]["pass@1"]["value"] != pytest.approx(ov["macro"]["pass@1"]["value"])
    assert ov["macro"]["pass@1"]["n_domains"] == 2 and ov["micro"]["pass@1"]["n_tasks"] == 6
    assert air["metrics"]["pass@3"] == {**air["metrics"]["pass@3"], "n_tasks": 2, "n_episodes": 8}


def test_summarize_excludes_and_counts_aborted():
    s = summarize(two_domains(), n_boot=50)
    air = s["domains"]["airline"]
    assert s["aborted_episodes"] == s["overall"]["aborted_episodes"] == 3
    assert air["aborted_episodes"] == 3 and s["domains"]["retail"]["aborted_episodes"] == 0
    assert air["tasks_all_aborted"] == ["a3"]
    assert air["samples_per_task"] == {"min": 4, "max": 4}  # a1's aborted samples 4 and 5 do not count
    aborted = air["failures"]["categories"]["aborted"]
    assert (aborted["episodes"], aborted["tasks"], aborted["example_task_ids"]) == (3, 2, ["a1", "a3"])
    assert "aborted" not in air["failures"]["termination_reasons"]
    # Same metrics as if the aborted episodes had never been recorded.
    clean = [r for r in two_domains() if r["status"] != "aborted"]
    assert summarize(clean, n_boot=50)["overall"]["micro"] == s["overall"]["micro"]


def test_summarize_unequal_samples_per_task():
    # t1 lost one of 4 samples to an abort: n = 3 for t1, 4 for t2.
    records = task_recs("mock", "t1", [1, 0, 0]) + [rec("mock", "t1", 3, 0, status="aborted")]
    records += task_recs("mock", "t2", [1, 0, 0, 0])
    d = summarize(records, n_boot=50)["domains"]["mock"]
    assert d["samples_per_task"] == {"min": 3, "max": 4}
    assert d["k_values"] == [1, 2, 3]
    assert list(d["k_skipped"]) == ["4"] and "1 of 2 tasks" in d["k_skipped"]["4"]
    assert "pass@4" not in d["metrics"] and "pass^4" not in d["metrics"]
    m = d["metrics"]
    assert m["pass@1"]["value"] == pytest.approx((1 / 3 + 1 / 4) / 2)  # each task uses its own n
    assert m["success_rate"]["value"] == pytest.approx(2 / 7)  # episode-weighted
    assert m["pass@3"]["value"] == pytest.approx((1.0 + (1 - 1 / 4)) / 2)
    assert m["pass^2"]["value"] == pytest.approx(0.0)


def test_summarize_k_values_selection_and_errors():
    records = two_domains()
    s = summarize(records, k_values=[2, 1, 2], n_boot=20)
    assert s["overall"]["k_values"] == [1, 2]
    assert {k for k in s["overall"]["micro"] if k.startswith("pass")} == {"pass@1", "pass^1", "pass@2", "pass^2"}
    with pytest.raises(ValueError, match="k=5 exceeds"):
        summarize(records, k_values=[5])
    for bad in ([0], [], [1.5], [True]):
        with pytest.raises(ValueError):
            summarize(records, k_values=bad)


def test_summarize_ci_contains_point_and_collapses_for_identical_tasks():
    s = summarize(two_domains(), n_boot=300)
    for e in all_entries(s):
        lo, hi = e["ci"]
        assert lo <= e["value"] <= hi
    assert s["domains"]["airline"]["metrics"]["pass@1"]["ci"][0] < s["domains"]["airline"]["metrics"]["pass@1"]["ci"][1]
    same = [r for t in ("x1", "x2", "x3") for r in task_recs("d1", t, [1, 0, 0])]
    same += [r for t in ("y1", "y2") for r in task_recs("d2", t, [1, 0, 0])]
    for e in all_entries(summarize(same, n_boot=200)):
        assert e["ci"] == [e["value"], e["value"]]


def test_summarize_domain_ci_is_bootstrap_over_its_tasks_with_offset_seed():
    outcomes = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0]] * 2
    records = [r for i, o in enumerate(outcomes) for r in task_recs("airline", f"a{i:02d}", o)]
    records += [r for i, o in enumerate(reversed(outcomes)) for r in task_recs("retail", f"r{i:02d}", o)]
    s = summarize(records, n_boot=300, seed=7)
    air_pass1 = [sum(o) / 4 for o in outcomes]
    ret_pass1 = air_pass1[::-1]
    # airline is the first domain by name (seed 7), retail the second (seed 8): independent resamples.
    assert tuple(s["domains"]["airline"]["metrics"]["pass@1"]["ci"]) == bootstrap_ci(air_pass1, n_boot=300, seed=7)
    retail = tuple(s["domains"]["retail"]["metrics"]["pass@1"]["ci"])
    assert retail == bootstrap_ci(ret_pass1, n_boot=300, seed=8)
    assert retail != bootstrap_ci(ret_pass1, n_boot=300, seed=7)


def test_summarize_seed_and_n_boot_are_used():
    records = [r for i in range(12) for r in task_recs("d", f"t{i}", [i % 2, i % 3 == 0, 1, 0])]
    base = summarize(records, n_boot=200, seed=0)
    assert summarize(records, n_boot=200, seed=0) == base
    assert summarize(records, n_boot=200, seed=1)["overall"]["micro"]["pass@1"]["ci"] != \
        base["overall"]["micro"]["pass@1"]["ci"]
    assert summarize(records, n_boot=5, seed=0)["overall"]["micro"]["pass@1"]["ci"] != \
        base["overall"]["micro"]["pass@1"]["ci"]
    assert (base["n_boot"], base["seed"]) == (200, 0)


def test_summarize_partial_and_turns_are_episode_means():
    records = [rec("d", "t1", 0, 0, partial=0.5, turns=4), rec("d", "t1", 1, 1, turns=6),
               rec("d", "t2", 0, 0, partial=0.2, turns=10)]
    m = summarize(records, n_boot=20)["domains"]["d"]["metrics"]
    assert m["mean_partial"]["value"] == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    assert m["mean_turns"]["value"] == pytest.approx(20 / 3)


def test_failure_taxonomy_counts_and_examples():
    records = [rec("d", f"p{i}", 0, 0, parse_errors=2, reason="too_many_errors") for i in range(7)]
    records += [rec("d", "p0", 1, 0, parse_errors=1, reason="agent_stop")]  # premature stop, same task again
    records += [rec("d", "u1", 0, 1, unknown_tool_calls=1, reason="agent_stop"),  # success: not premature
                rec("d", "u1", 1, 0, user_tool_calls_by_agent=3, reason="max_steps"),
                rec("d", "m1", 0, 0, status="truncated", reason="max_turns"),
                rec("d", "m2", 0, 0, status="truncated", reason="truncated"),
                rec("d", "ab", 0, 0, status="aborted", parse_errors=5)]
    f = summarize(records, n_boot=10)["domains"]["d"]["failures"]
    assert f["termination_reasons"] == {"agent_stop": 2, "max_steps": 1, "max_turns": 1, "too_many_errors": 7,
                                        "truncated": 1}
    cat = f["categories"]
    assert cat["parse_errors"] == {"episodes": 8, "tasks": 7, "example_task_ids": ["p0", "p1", "p2", "p3", "p4"]}
    assert cat["too_many_errors"]["episodes"] == 7
    assert cat["premature_stop"] == {"episodes": 1, "tasks": 1, "example_task_ids": ["p0"]}
    assert cat["unknown_tool_calls"] == {"episodes": 1, "tasks": 1, "example_task_ids": ["u1"]}
    assert cat["user_tool_calls_by_agent"] == {"episodes": 1, "tasks": 1, "example_task_ids": ["u1"]}
    assert cat["max_steps_or_turns"] == {"episodes": 2, "tasks": 2, "example_task_ids": ["m1", "u1"]}
    assert cat["truncated"] == {"episodes": 2, "tasks": 2, "example_task_ids": ["m1", "m2"]}
    assert cat["aborted"] == {"episodes": 1, "tasks": 1, "example_task_ids": ["ab"]}


def test_summarize_returns_plain_json():
    s = summarize(two_domains(), n_boot=50)
    walk_plain_json(s)
    assert json.loads(json.dumps(s)) == s


def test_summarize_domain_with_only_aborted_episodes_is_reported_not_averaged():
    records = task_recs("retail", "r1", [1, 0]) + [rec("telecom", "x", 0, 0, status="aborted")]
    s = summarize(records, n_boot=20)
    assert s["domains"]["telecom"]["n_tasks"] == 0 and s["domains"]["telecom"]["metrics"] == {}
    assert s["overall"]["domains_without_episodes"] == ["telecom"] and s["overall"]["n_domains"] == 1
    assert s["overall"]["macro"]["pass@1"]["value"] == pytest.approx(0.5)


@pytest.mark.parametrize("mutate, msg", [
    (lambda rs: rs[0].pop("reward"), "missing fields"),
    (lambda rs: rs[0].update(status="done"), "status must be"),
    (lambda rs: rs[0].update(partial=1.5), "partial must be"),
    (lambda rs: rs[0].update(reward=math.nan), "reward must be"),
    (lambda rs: rs[0].update(parse_errors=-1), "parse_errors must be"),
    (lambda rs: rs[0].update(task_id=3), "task_id must be"),
    (lambda rs: rs.append(dict(rs[0])), "duplicate episode"),
])
def test_summarize_rejects_bad_records(mutate, msg):
    records = task_recs("d", "t", [1, 0])
    mutate(records)
    with pytest.raises(ValueError, match=msg):
        summarize(records)


def test_summarize_rejects_empty_and_all_aborted():
    with pytest.raises(ValueError, match="non-empty"):
        summarize([])
    with pytest.raises(ValueError, match="all 1 episodes are aborted"):
        summarize([rec("d", "t", 0, 0, status="aborted")])


def test_format_metric_carries_ci_and_counts():
    entry = {"value": 0.425, "ci": [0.3, 0.55], "n_tasks": 40, "n_episodes": 160}
    assert format_metric(entry) == "0.425 [0.300, 0.550] (T=40 tasks, E=160 eps)"
    assert format_metric({**entry, "n_domains": 3}) == "0.425 [0.300, 0.550] (T=40 tasks, E=160 eps, D=3 domains)"
    s = summarize(two_domains(), n_boot=50)
    assert format_metric(s["overall"]["macro"]["pass@1"]).startswith("0.500 [")
    with pytest.raises(ValueError, match="not a metric entry"):
        format_metric({"value": 0.4})


# ---------------------------------------------------------------------------------------------------
# Repeated runs (--runs)

def test_over_runs_gives_each_runs_estimate_and_their_mean_and_sd():
    """3 runs x 2 samples of 2 tasks; run r owns samples 2r, 2r+1. Each run's pass@1 / pass^2 by hand."""
    outcomes = {"t1": [1, 1, 1, 0, 0, 0], "t2": [0, 1, 1, 1, 1, 1]}
    records = [r for t, o in outcomes.items() for r in task_recs("mock", t, o)]
    records.append(rec("mock", "t1", 6, 1))  # a sample beyond the runs: belongs to none
    runs = over_runs(records, num_samples=2, runs=3)
    mock = runs["domains"]["mock"]
    assert mock["pass@1"]["values"] == pytest.approx([(1 + 0.5) / 2, (0.5 + 1) / 2, (0 + 1) / 2])
    assert mock["pass^2"]["values"] == pytest.approx([0.5, 0.5, 0.5])
    assert mock["pass@1"]["mean"] == pytest.approx(np.mean([0.75, 0.75, 0.5]))
    assert mock["pass@1"]["sd"] == pytest.approx(float(np.std([0.75, 0.75, 0.5], ddof=1)))
    assert mock["pass^2"]["sd"] == 0.0 and "pass@3" not in mock and runs["runs_scored"] == 3
    assert "overall" not in runs  # one domain


def test_over_runs_leaves_out_a_run_whose_episodes_all_aborted():
    records = task_recs("a", "t", [1, 0]) + [rec("a", "t", 2, 0, status="aborted"),
                                            rec("a", "t", 3, 0, status="aborted")] + task_recs("b", "u", [1, 1, 0, 1])
    runs = over_runs(records, num_samples=2, runs=2)
    assert runs["runs_scored"] == 2  # run 1 still has domain b
    assert runs["domains"]["a"]["pass@1"]["values"] == [0.5]
    assert runs["domains"]["b"]["pass@1"]["values"] == [1.0, 0.5]
    assert runs["overall"]["pass@1"]["values"] == pytest.approx([0.75, 0.5])
