"""The local pipeline's report: each stage's Pass@K with counts, learning signal, charts.

The local pipeline's report: each stage's Pass@K numbers with their counts, the policy stages' (GRPO, AWSFT)
steps with and without learning signal, and charts (axes from zero, counts on them). The stage chart and table
show every evaluated stage in report order, so an AWSFT stage shows beside GRPO's."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tau2_rl_pipeline.launch.recipe import STAGE_GRAPH

STAGES = ("base", "sft", "rft", "grpo")
ALGORITHMS = ("grpo", "awsft")  # the policy stage's loss: PPO-clip, or advantage-weighted SFT
# (baseline, candidate): each stage against the one it starts from (the recipe's stage graph)
COMPARISONS = tuple((stage.starts_from, stage.name) for stage in STAGE_GRAPH)


def stage_numbers(summary: dict, domain: str) -> dict:
    """pass@1, pass@k, pass^k (k = samples per task) and mean partial of one domain, each with its counts."""
    metrics = summary["metrics"]["domains"][domain]["metrics"]
    ks = sorted(int(name.split("@")[1]) for name in metrics if name.startswith("pass@"))
    k = ks[-1]
    return {"k": k, "pass@1": metrics["pass@1"], f"pass@{k}": metrics[f"pass@{k}"],
            f"pass^{k}": metrics[f"pass^{k}"], "mean_partial": metrics["mean_partial"]}


def has_signal(step: dict) -> bool:
    """A policy step trained on something (GRPO: at least one sequence with a non-zero advantage)."""
    return step["trained_sequences"] > 0


def grpo_summary(history: list[dict]) -> dict:
    """A policy stage's history with how many of its steps had a learning signal (and groups, episodes behind
    them)."""
    return {"history": history, "steps": len(history), "steps_with_signal": sum(map(has_signal, history)),
            "groups": sum(h["groups"] for h in history),
            "groups_with_signal": sum(h["groups"] - h["groups_without_signal"] for h in history),
            "episodes": sum(h["episodes"] for h in history)}


def write_charts(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths = [_reward_chart(report, algorithm, out) for algorithm in ALGORITHMS
             if report.get(algorithm, {}).get("history")]
    if report["stages"]:
        from tau2_rl_pipeline.pictures import stage_chart

        stage_chart.render(report, out / "stages_passk.png")
        paths.append(out / "stages_passk.png")
    return paths


def _reward_chart(report: dict, algorithm: str, out: Path) -> Path:
    import matplotlib.pyplot as plt

    history = report[algorithm]["history"]
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
    ax.set_ylim(min(0.0, *(h["shaped_reward_mean"] for h in history)), top)  # a format penalty goes below 0
    ax.set_xticks(steps)
    ax.set_xlabel(f"{algorithm.upper()} step (each draws its own tasks; E episodes, groups with signal / groups)")
    ax.set_ylabel("mean reward over the step's episodes")
    return _finish(fig, ax, f"{algorithm.upper()} on {report['domain']} (scripted user: plumbing check)",
                   out / f"{algorithm}_reward.png")


def _finish(fig, ax, title: str, path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)  # below: never over a point
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_stage_table(report: dict) -> None:
    """Each stage's checkpoint evaluated: every metric as value [95% CI], and the counts behind the row."""
    from rich.table import Table

    from tau2_rl_pipeline.eval.report import cell
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


def summary_lines(report: dict) -> list[str]:
    """The closing lines: SFT against the untrained model, and how many GRPO steps learned anything."""
    lines = []
    if all(s in report["stages"] for s in ("base", "sft")):
        base_p1, sft_p1 = (report["stages"][s]["pass@1"]["value"] for s in ("base", "sft"))
        lines.append(f"SFT pass@1 {sft_p1:.3f} vs untrained pass@1 {base_p1:.3f}: SFT is "
                     f"{'above' if sft_p1 > base_p1 else 'NOT above'} the untrained model")
    for algorithm in ALGORITHMS:
        policy = report.get(algorithm)
        if policy:
            lines.append(f"{algorithm.upper()}: {policy['steps_with_signal']}/{policy['steps']} steps with signal "
                         f"({policy['groups_with_signal']}/{policy['groups']} groups, {policy['episodes']} episodes)")
            if same_numbers(report["stages"].get("rft"), report["stages"].get(algorithm)):
                lines.append(f"{algorithm.upper()} changed nothing measurable: its row equals RFT's on every metric "
                             "(its updates flipped no evaluated episode)")
    return lines


def stage_comparisons(eval_dir: Path, stages: list[str]) -> dict[str, dict]:
    """Each evaluated stage against the stage it starts from (SFT vs base, RFT vs SFT, GRPO and AWSFT vs RFT): the
    paired comparison of their evaluation runs (tau2_rl_pipeline/eval/compare.py) over the same tasks, or why there is none (an
    evaluation run missing or unreadable, or runs that measure different things)."""
    from tau2_rl_pipeline.eval.compare import compare_runs
    from tau2_rl_pipeline.eval.compare_cli import load_run

    out: dict[str, dict] = {}
    for a, b in COMPARISONS:
        if a in stages and b in stages:
            try:
                out[f"{b} vs {a}"] = compare_runs(load_run(eval_dir / f"{a}.json"), load_run(eval_dir / f"{b}.json"))
            except ValueError as e:  # RunLoadError, NotComparable, no task scored in both
                out[f"{b} vs {a}"] = {"error": str(e)}
    return out


def stage_verdicts(report: dict) -> list[str]:
    """One line per comparison and domain: the differences with their CIs and p-values, and whether they are
    significant, said plainly."""
    from tau2_rl_pipeline.eval.compare import verdict_lines

    lines = []
    for name, result in report.get("comparisons", {}).items():
        b, a = (s.upper() for s in name.split(" vs "))
        lines += ([f"{b} vs {a}: no paired comparison ({result['error']})"] if "error" in result
                  else verdict_lines(a, b, result))
    return lines


def same_numbers(a: dict | None, b: dict | None) -> bool:
    """Two stages' rows hold the same value for every metric (the CIs follow from the same episodes' outcomes)."""
    if not a or not b:
        return False
    names = [n for n in a if isinstance(a[n], dict) and "value" in a[n]]
    return bool(names) and all(isinstance(b.get(n), dict) and b[n]["value"] == a[n]["value"] for n in names)
