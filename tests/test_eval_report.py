"""What a Pass@K run shows a person (tau2_rl_pipeline/eval/report.py), from metrics.summarize over known records:
the chart's bars per scope, the title's caveat for a scripted user, and the terminal table's cells and counts."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from test_metrics import task_recs

from tau2_rl_pipeline.eval import report
from tau2_rl_pipeline.metrics import summarize

# Two domains: mock's two tasks 4/4 and 0/4, airline's one task 2/4 (k up to 4 everywhere).
RECORDS = [*task_recs("mock", "a", [1, 1, 1, 1]), *task_recs("mock", "b", [0, 0, 0, 0]),
           *task_recs("airline", "c", [1, 0, 1, 0])]


@pytest.fixture(scope="module")
def metrics() -> dict:
    return summarize(RECORDS, n_boot=200)


def test_the_chart_has_a_group_per_scope_with_pass1_passn_and_pass_hat_n(metrics: dict) -> None:
    groups = report.chart_bars(metrics)
    assert [g["label"] for g in groups] == ["airline", "mock", "overall (micro)", "overall (macro)"]
    mock = groups[1]
    assert mock["n"] == 4 and [name for name, _ in mock["bars"]] == ["pass@1", "pass@4", "pass^4"]
    values = {name: entry["value"] for name, entry in mock["bars"]}
    assert values == pytest.approx({"pass@1": 0.5, "pass@4": 0.5, "pass^4": 0.5})
    assert mock["counts"] == "T=2 tasks, E=8 eps"
    assert groups[2]["counts"] == "T=3 tasks, E=12 eps, D=2 domains"


@pytest.mark.parametrize("user, caveat", [("scripted", True), ("llm", False)])
def test_a_scripted_user_run_says_it_is_not_a_tau2_score(user: str, caveat: bool) -> None:
    settings = {"user": user, "user_model": "openai/sim", "model": "ckpt", "task_split": "base", "num_samples": 4,
                "sampling": {"temperature": 1.0}}
    title = report.chart_title(settings, None, 120)
    assert title.splitlines()[0] == "tau2 Pass@k" and "4 samples/task | temperature 1.0" in title
    assert (report.SCRIPTED_CAVEAT in title) is caveat
    assert ("(openai/sim)" in title) is (user == "llm")


def test_the_terminal_table_prints_each_value_with_its_ci_and_a_dash_for_a_missing_k(metrics: dict) -> None:
    assert report.cell(None) == "-"
    assert report.cell({"value": 0.5, "ci": (0.0, 1.0)}, 2) == "0.50 [0.00, 1.00]"
    out = io.StringIO()
    Console(file=out, width=200).print(report.metrics_table(metrics, "run"))
    text = out.getvalue()
    assert "pass^4" in text and "T=2 tasks, E=8 eps" in text and "overall (macro)" in text


def test_rates_by_domain_leave_out_aborted_and_unmarked_episodes_and_pool_several_domains() -> None:
    """eval/summary.py's per-domain rates: an aborted episode, or one without the key (an older line of a resumed
    file), counts nowhere; with several domains an overall entry pools them."""
    from tau2_rl_pipeline.eval.summary import rates_by_domain

    records = [{"domain": "airline", "status": "done", "monitors": {"x": 1}},
               {"domain": "airline", "status": "aborted", "monitors": {"x": 1}},
               {"domain": "retail", "status": "done", "monitors": {"x": 1}},
               {"domain": "retail", "status": "done"}]
    counts = rates_by_domain(records, "monitors", len)
    assert counts == {"airline": 1, "retail": 1, "overall": 2}
    assert rates_by_domain(records[:2], "monitors", len) == {"airline": 1}
