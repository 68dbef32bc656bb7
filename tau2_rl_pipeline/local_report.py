"""The local pipeline's report: each stage's pass rates (with their counts), the charts, the table.

Charts are honest: rates on a 0-1 axis with 95% bootstrap CIs and the task / episode counts under each stage;
reward curves from zero (or below, when a format penalty takes the shaped reward under it).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

ALGORITHMS = ("grpo", "awsft")  # the policy stage's loss: PPO-clip, or advantage-weighted SFT
STAGES = ("base", "sft", "rft", *ALGORITHMS)


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
    stages = [s for s in STAGES if s in report["stages"]]
    if stages:
        k = report["stages"][stages[0]]["k"]
        names = ["pass@1", f"pass@{k}", f"pass^{k}"]
        fig, ax = plt.subplots(figsize=(7, 3.8))
        width = 0.8 / len(names)
        for j, name in enumerate(names):
            entries = [report["stages"][s][name] for s in stages]
            values = [e["value"] for e in entries]
            errs = [[v - e["ci"][0] for v, e in zip(values, entries)], [e["ci"][1] - v for v, e in zip(values, entries)]]
            ax.bar([i + j * width for i in range(len(stages))], values, width, yerr=errs, capsize=3, label=name)
        labels = [f"{s}\n(T={report['stages'][s]['pass@1']['n_tasks']}, E={report['stages'][s]['pass@1']['n_episodes']})"
                  for s in stages]
        ax.set_xticks([i + width * (len(names) - 1) / 2 for i in range(len(stages))], labels)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("rate (95% bootstrap CI over tasks)")
        paths.append(_finish(fig, ax, f"{report['domain']}: each stage's checkpoint (scripted user, not a tau2 score)",
                             out / "stages_passk.png"))
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
    from rich.table import Table

    from tau2_rl_pipeline.metrics import format_metric

    table = Table(title=f"{report['domain']}: pass rates per stage (scripted user: plumbing check, not a tau2 score)")
    table.add_column("stage")
    stages = [s for s in STAGES if s in report["stages"]]
    k = report["stages"][stages[0]]["k"] if stages else 1
    for name in ("pass@1", f"pass@{k}", f"pass^{k}", "mean_partial"):
        table.add_column(name)
    for s in stages:
        row = report["stages"][s]
        table.add_row(s, *[format_metric(row[name]) for name in ("pass@1", f"pass@{k}", f"pass^{k}", "mean_partial")])
    Console().print(table)
