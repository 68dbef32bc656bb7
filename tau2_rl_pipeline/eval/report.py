"""What a Pass@K run shows a person: the metric and failure tables on the terminal, and the PNG chart.

Every printed number carries its 95% CI, and every column the task and episode counts behind it; the chart
draws the same numbers with CI error bars. Re-render a chart from a saved summary (a reference run's for public/:
tau2-rl-pictures --reference SUMMARY):

    python -m tau2_rl_pipeline.eval.report --summary outputs/eval/run.json --chart outputs/eval/run.png
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from rich.table import Table

from tau2_rl_pipeline.eval.episodes_file import atomic_write_text
from tau2_rl_pipeline.files import atomic_write_bytes

SCRIPTED_CAVEAT = "scripted user: a plumbing check, not a tau2 score"


# ---------------------------------------------------------------------------------------------------
# Scopes: the domains, then overall micro and macro when there is more than one domain

def scopes(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Columns of the report: label, metric entries, counts, and the ks reported."""
    out = []
    for name, d in sorted(metrics["domains"].items()):
        out.append({"label": name, "metrics": d["metrics"], "n_tasks": d["n_tasks"], "n_episodes": d["n_episodes"],
                    "aborted": d["aborted_episodes"], "k_values": d["k_values"]})
    overall = metrics["overall"]
    if len(metrics["domains"]) > 1:
        for kind in ("micro", "macro"):
            out.append({"label": f"overall ({kind})", "metrics": overall[kind], "n_tasks": overall["n_tasks"],
                        "n_episodes": overall["n_episodes"], "aborted": overall["aborted_episodes"],
                        "k_values": overall["k_values"], "n_domains": overall["n_domains"]})
    return out


def metric_names(columns: list[dict[str, Any]]) -> list[str]:
    ks = sorted({k for c in columns for k in c["k_values"]})
    return [f"pass@{k}" for k in ks] + [f"pass^{k}" for k in ks] + ["success_rate", "mean_partial", "mean_turns"]


def cell(entry: dict[str, Any] | None, digits: int = 3) -> str:
    if entry is None:
        return "-"
    lo, hi = entry["ci"]
    return f"{entry['value']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def counts_line(column: dict[str, Any]) -> str:
    text = f"T={column['n_tasks']} tasks, E={column['n_episodes']} eps"
    text += f", D={column['n_domains']} domains" if "n_domains" in column else ""
    return text + (f", {column['aborted']} aborted" if column["aborted"] else "")


# ---------------------------------------------------------------------------------------------------
# Terminal tables

def metrics_table(metrics: dict[str, Any], title: str) -> Table:
    """Rows = metrics, columns = scopes; a '-' is a k some task in that scope has too few samples for."""
    columns = scopes(metrics)
    table = Table(title=title, caption="value [95% bootstrap CI over tasks]; pass@k = any of k succeeds "
                                       "(unbiased), pass^k = all k succeed (tau2); aborted episodes excluded")
    table.add_column("metric", style="bold")
    for c in columns:
        table.add_column(f"{c['label']}\n{counts_line(c)}", justify="right")
    for name in metric_names(columns):
        table.add_row(name, *(cell(c["metrics"].get(name), 2 if name == "mean_turns" else 3) for c in columns))
    return table


def failures_table(metrics: dict[str, Any]) -> Table:
    """Per domain: termination reasons, then each failure category that occurred, with example task ids."""
    table = Table(title="Failure taxonomy (non-aborted episodes; one episode can be in several rows)")
    for name, justify in (("domain", "left"), ("category", "left"), ("episodes", "right"), ("tasks", "right"),
                          ("example task ids", "left")):
        table.add_column(name, justify=justify)
    for domain, d in sorted(metrics["domains"].items()):
        failures = d["failures"]
        reasons = ", ".join(f"{r} {n}" for r, n in failures["termination_reasons"].items()) or "-"
        table.add_row(domain, "termination reasons", "", "", reasons)
        for category, c in failures["categories"].items():
            if c["episodes"]:
                table.add_row("", category, str(c["episodes"]), str(c["tasks"]), ", ".join(c["example_task_ids"]))
    return table


# Behaviour monitors (benchmark/monitors.py): summary key -> what the row says
BEHAVIOUR_ROWS = (("tool_calls_mean", "tool calls / episode"), ("over_actions_mean", "over-actions / episode"),
                  ("over_action_share", "episodes with an over-action"),
                  ("order_only_mean", "order-only writes / episode"),
                  ("repeated_reads_mean", "repeated reads / episode"),
                  ("transfer_share", "episodes with a transfer"), ("refused_share", "episodes with a refusal"),
                  ("agent_ended_share", "ended by the agent"), ("user_ended_share", "ended by the user"),
                  ("limit_ended_share", "ended otherwise (limits)"), ("max_turns_share", "max turns/steps endings"),
                  ("max_errors_share", "max errors endings"),
                  ("successes_without_action_check_share", "successes whose task has no ACTION check"))
# the shares the chart draws (each in [0, 1])
BEHAVIOUR_BARS = (("over_action_share", "over-action"), ("transfer_share", "transfer"), ("refused_share", "refusal"),
                  ("agent_ended_share", "agent ended"), ("limit_ended_share", "limit ended"),
                  ("successes_without_action_check_share", "successes w/o ACTION check"))


def behaviour_table(behaviour: dict[str, Any]) -> Table:
    """Rows = behaviour monitors, columns = scopes with their episode counts ('-': nothing to take a share of)."""
    table = Table(title="Behaviour monitors (scored episodes): what the agent did beyond its reward",
                  caption="over the policy's messages (a task's initial history left out); over-action = a write "
                          "matching no gold action (order-only: matching up to list order, counted apart); repeated "
                          "read = the same read again with no write between")
    table.add_column("monitor", style="bold")
    for scope, b in behaviour.items():
        table.add_column(f"{scope}\nE={b['episodes']} eps", justify="right")
    for key, label in BEHAVIOUR_ROWS:
        table.add_row(label, *("-" if b.get(key) is None else f"{b[key]:.3f}" for b in behaviour.values()))
    return table


# ---------------------------------------------------------------------------------------------------
# Chart

def chart_bars(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scope: pass@1, pass@n and pass^n with CIs, n the largest k every task of the scope supports."""
    groups = []
    for c in scopes(metrics):
        if not c["k_values"]:
            continue
        n = max(c["k_values"])
        bars = [(f"pass@{k}", c["metrics"][f"pass@{k}"]) for k in dict.fromkeys((1, n))]
        bars.append((f"pass^{n}", c["metrics"][f"pass^{n}"]))
        groups.append({"label": c["label"], "n": n, "counts": counts_line(c), "bars": bars})
    return groups


def chart_title(settings: dict[str, Any], title: str | None, width: int) -> str:
    """The title, then the run's settings; a scripted-user run always says it is not a tau2 score."""
    user = settings["user"] if settings["user"] == "scripted" else f"{settings['user']} ({settings['user_model']})"
    lines = [title or "tau2 Pass@k",
             *textwrap.wrap(f"model {settings['model']} | user {user} | split {settings['task_split']} | "
                            f"{settings['num_samples']} samples/task | temperature "
                            f"{settings['sampling']['temperature']}", width)]
    if settings["user"] == "scripted" and "not a tau2 score" not in lines[0]:
        lines.append(SCRIPTED_CAVEAT)
    return "\n".join(lines)


def render_chart(summary: dict[str, Any], path: Path, title: str | None = None) -> None:
    """Grouped bars per scope (pass@1, pass@n, pass^n) with 95% CI error bars, written atomically as PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to a file only
    import matplotlib.pyplot as plt

    groups = chart_bars(summary["metrics"])
    if not groups:
        raise ValueError("the summary has no metrics to chart")
    width = 0.8 / max(len(g["bars"]) for g in groups)
    colors = {"pass@1": "#4C72B0", "pass@n": "#55A868", "pass^n": "#C44E52"}
    ns = {g["n"] for g in groups}
    n_text = str(ns.pop()) if len(ns) == 1 else "n"  # one n for every group: name it in the legend
    legend = {"pass@1": "pass@1", "pass@n": f"pass@{n_text} (any of {n_text})",
              "pass^n": f"pass^{n_text} (all of {n_text})"}
    fig_width = max(8.0, 2.2 * len(groups))
    behaviour = {scope: b for scope, b in (summary.get("behaviour") or {}).items() if b.get("episodes")}
    if behaviour:  # a second panel: the behaviour monitors' shares per scope
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(fig_width, 8.5), gridspec_kw={"height_ratios": [5, 3.5]})
        behaviour_panel(bx, behaviour)
    else:
        fig, ax = plt.subplots(figsize=(fig_width, 5.0))
    labelled: set[str] = set()
    for x, g in enumerate(groups):
        for j, (name, entry) in enumerate(g["bars"]):
            kind = "pass@1" if name == "pass@1" else ("pass@n" if name.startswith("pass@") else "pass^n")
            lo, hi = entry["ci"]
            v = entry["value"]
            pos = x + (j - (len(g["bars"]) - 1) / 2) * width
            ax.bar(pos, v, width, color=colors[kind], yerr=[[v - lo], [hi - v]], capsize=3,
                   label=None if kind in labelled else legend[kind])
            labelled.add(kind)
            ax.text(pos, hi + 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), [f"{g['label']}\nn={g['n']}; {g['counts']}" for g in groups], fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("rate (95% bootstrap CI over tasks)")
    ax.set_title(chart_title(summary["settings"], title, int(fig_width * 14)), fontsize=9)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())


def behaviour_panel(ax: Any, behaviour: dict[str, Any]) -> None:
    """Grouped bars per scope: each BEHAVIOUR_BARS share (a missing one, e.g. no success yet, is left out)."""
    width = 0.8 / len(BEHAVIOUR_BARS)
    for j, (key, label) in enumerate(BEHAVIOUR_BARS):
        xs = [x for x, b in enumerate(behaviour.values()) if b.get(key) is not None]
        values = [b[key] for b in behaviour.values() if b.get(key) is not None]
        ax.bar([x + (j - (len(BEHAVIOUR_BARS) - 1) / 2) * width for x in xs], values, width, label=label)
    ax.set_xticks(range(len(behaviour)), [f"{scope}\nE={b['episodes']} eps" for scope, b in behaviour.items()],
                  fontsize=8)
    ax.set_ylim(0, 1.45)  # the legend's two rows sit above 1
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("share of scored episodes\n(last: of successes)", fontsize=8)
    ax.set_title("Behaviour monitors", fontsize=9)
    ax.legend(loc="upper center", fontsize=7, ncol=3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-render the Pass@k chart of a saved eval_passk summary.")
    parser.add_argument("--summary", required=True, type=Path, help="summary JSON written by tau2_rl_pipeline/eval/eval_passk.py")
    parser.add_argument("--chart", required=True, type=Path, help="PNG to write")
    parser.add_argument("--title", default=None, help="chart title (default: 'tau2 Pass@k')")
    parser.add_argument("--copy-summary", type=Path, default=None, help="also copy the summary JSON here")
    args = parser.parse_args(argv)
    try:
        summary = json.loads(args.summary.read_text())
        render_chart(summary, args.chart, args.title)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot chart {args.summary}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.copy_summary is not None:
        atomic_write_text(args.copy_summary, json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.chart}" + (f" and {args.copy_summary}" if args.copy_summary else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
