"""The local pipeline's report: each stage's pass rates (with their counts), the charts, the table.

The stage chart and table are tau2_rl_pipeline.pictures.stage_chart's (every evaluated stage in report order, so
an AWSFT stage shows beside GRPO's); the reward curves start at zero (or below, when a format penalty takes the
shaped reward under it).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

ALGORITHMS = ("grpo", "awsft")  # the policy stage's loss: PPO-clip, or advantage-weighted SFT


def stage_numbers(summary: dict, domain: str) -> dict:
    """pass@1, pass@k, pass^k (k = samples per task) and mean partial of one domain, each with its counts."""
    metrics = summary["metrics"]["domains"][domain]["metrics"]
    ks = sorted(int(name.split("@")[1]) for name in metrics if name.startswith("pass@"))
    k = ks[-1]
    return {"k": k, "pass@1": metrics["pass@1"], f"pass@{k}": metrics[f"pass@{k}"],
            f"pass^{k}": metrics[f"pass^{k}"], "mean_partial": metrics["mean_partial"]}


def write_charts(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for algorithm in ALGORITHMS:
        history = report.get(algorithm, {}).get("history", [])
        if not history:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        steps = [h["step"] for h in history]
        ax.plot(steps, [h["raw_reward_mean"] for h in history], marker="o", label="task reward (tau2)")
        ax.plot(steps, [h["shaped_reward_mean"] for h in history], marker="s", label="shaped reward")
        ax.set_xlabel(f"{algorithm.upper()} step")
        ax.set_ylabel("mean reward over the step's episodes")
        ax.set_ylim(bottom=min(0.0, *(h["shaped_reward_mean"] for h in history)))
        paths.append(_finish(fig, ax, f"{algorithm.upper()} on {report['domain']} (scripted user: plumbing check)",
                             out / f"{algorithm}_reward.png"))
    if report["stages"]:
        from tau2_rl_pipeline.pictures import stage_chart

        stage_chart.render(report, out / "stages_passk.png")
        paths.append(out / "stages_passk.png")
    return paths


def _finish(fig, ax, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_stage_table(report: dict) -> None:
    """Each stage's checkpoint evaluated: every metric as value [95% CI], and the counts behind the row."""
    from rich.table import Table

    from eval.report import cell
    from tau2_rl_pipeline.pictures.stage_chart import stage_metrics

    stages, names = stage_metrics(report)
    table = Table(title=f"{report['domain']}: pass rates per stage (scripted user: plumbing check, not a tau2 score)",
                  caption="value [95% bootstrap CI over tasks]; pass@k: any of k succeeds, pass^k: all k (tau2)")
    for name in ("stage", *names, "tasks / episodes"):
        table.add_column(name, justify="left" if name == "stage" else "right")
    for s in stages:
        row = report["stages"][s]
        counts = next(row[n] for n in names if n in row)
        table.add_row(s, *[cell(row.get(n)) for n in names], f"{counts['n_tasks']} / {counts['n_episodes']}")
    Console().print(table)
