"""The local pipeline's report: each stage's Pass@K numbers with their counts, the GRPO steps with and without
learning signal, and two charts (axes from zero, counts on them)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

STAGES = ("base", "sft", "rft", "grpo")


def stage_numbers(summary: dict, domain: str) -> dict:
    """pass@1, pass@k, pass^k (k = samples per task) and mean partial of one domain, each with its counts."""
    metrics = summary["metrics"]["domains"][domain]["metrics"]
    ks = sorted(int(name.split("@")[1]) for name in metrics if name.startswith("pass@"))
    k = ks[-1]
    return {"k": k, "pass@1": metrics["pass@1"], f"pass@{k}": metrics[f"pass@{k}"],
            f"pass^{k}": metrics[f"pass^{k}"], "mean_partial": metrics["mean_partial"]}


def has_signal(step: dict) -> bool:
    """A GRPO step trained on something: at least one sequence with a non-zero advantage."""
    return step["trained_sequences"] > 0


def grpo_summary(history: list[dict]) -> dict:
    """The GRPO history with how many of its steps had a learning signal (and groups, episodes behind them)."""
    return {"history": history, "steps": len(history), "steps_with_signal": sum(map(has_signal, history)),
            "groups": sum(h["groups"] for h in history),
            "groups_with_signal": sum(h["groups"] - h["groups_without_signal"] for h in history),
            "episodes": sum(h["episodes"] for h in history)}


def write_charts(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    history = report.get("grpo", {}).get("history", [])
    if history:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        steps = [h["step"] for h in history]
        ax.plot(steps, [h["raw_reward_mean"] for h in history], marker="o", label="task reward (tau2)")
        ax.plot(steps, [h["shaped_reward_mean"] for h in history], marker="s", label="shaped reward")
        # shaped rewards reach 1 + alpha; the counts sit in a band above the highest point
        top = max(1.0, *(h["shaped_reward_mean"] for h in history), *(h["raw_reward_mean"] for h in history)) + 0.2
        quiet = [h["step"] for h in history if not has_signal(h)]
        for i, step in enumerate(quiet):
            ax.axvspan(step - 0.4, step + 0.4, color="0.85", zorder=0,
                       label="no signal: nothing trained" if i == 0 else None)
        for h in history:  # the counts behind each point: episodes, and groups with signal of all groups
            ax.annotate(f"E={h['episodes']}\n{h['groups'] - h['groups_without_signal']}/{h['groups']}",
                        (h["step"], top), ha="center", va="top", fontsize=7)
        ax.set_ylim(0, top)
        ax.set_xticks(steps)
        ax.set_xlabel("GRPO step (each draws its own tasks; E episodes, groups with signal / groups)")
        ax.set_ylabel("mean reward over the step's episodes")
        paths.append(_finish(fig, ax, f"GRPO on {report['domain']} (scripted user: plumbing check)",
                             out / "grpo_reward.png"))
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
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)  # below: never over a point
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


def summary_lines(report: dict) -> list[str]:
    """The closing lines: SFT against the untrained model, and how many GRPO steps learned anything."""
    lines = []
    if all(s in report["stages"] for s in ("base", "sft")):
        base_p1, sft_p1 = (report["stages"][s]["pass@1"]["value"] for s in ("base", "sft"))
        lines.append(f"SFT pass@1 {sft_p1:.3f} vs untrained pass@1 {base_p1:.3f}: SFT is "
                     f"{'above' if sft_p1 > base_p1 else 'NOT above'} the untrained model")
    grpo = report.get("grpo")
    if grpo:
        lines.append(f"GRPO: {grpo['steps_with_signal']}/{grpo['steps']} steps with signal "
                     f"({grpo['groups_with_signal']}/{grpo['groups']} groups, {grpo['episodes']} episodes)")
    return lines
