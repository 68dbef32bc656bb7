"""The demo's per-stage Pass@K chart (public/demo_stages.png, and stages_passk.png beside the demo's report).

Read generically from the report scripts/demo.sh writes (outputs/demo/report.json): `report["stages"]` maps each
evaluated stage, in the order it ran, to its metric entries ({"value", "ci": [lo, hi], "n_tasks", "n_episodes"});
every entry a stage has is drawn, pass@/pass^ first, so a stage or metric added to the demo shows up unchanged.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from tau2_rl_pipeline.files import atomic_write_bytes

PALETTE = ["#4C72B0", "#55A868", "#C44E52", "#8172B3", "#CCB974", "#64B5CD"]
CAVEAT = "CPU plumbing check, not a tau2 score"


def _is_entry(value: Any) -> bool:
    return isinstance(value, dict) and "value" in value and "ci" in value


def stage_metrics(report: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(stages in report order, metric names: pass@/pass^ first, then the rest, each in first-seen order)."""
    stages = [s for s, m in report.get("stages", {}).items() if isinstance(m, dict) and any(map(_is_entry, m.values()))]
    if not stages:
        raise ValueError("the report has no evaluated stages (report['stages'] is empty)")
    names = list(dict.fromkeys(k for s in stages for k, v in report["stages"][s].items() if _is_entry(v)))
    return stages, sorted(names, key=lambda n: not n.startswith("pass"))


def _legend(name: str) -> str:
    if name.startswith("pass^"):
        return f"{name} (all {name[5:]} succeed, tau2)"
    if name.startswith("pass@") and name != "pass@1":
        return f"{name} (any of {name[5:]})"
    return "mean partial score" if name == "mean_partial" else name.replace("_", " ")


def render(report: dict[str, Any], path: Path) -> None:
    """Grouped bars per stage, 95% CI error bars, the value on each bar, task and episode counts under each group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages, names = stage_metrics(report)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(9, 4.4))
    for j, name in enumerate(names):
        for i, stage in enumerate(stages):
            entry = report["stages"][stage].get(name)
            if not _is_entry(entry):
                continue
            v, (lo, hi) = entry["value"], entry["ci"]
            x = i + (j - (len(names) - 1) / 2) * width
            ax.bar(x, v, width, color=PALETTE[j % len(PALETTE)], yerr=[[v - lo], [hi - v]], capsize=3,
                   label=_legend(name) if i == 0 else None)
            ax.text(x, hi + 0.015, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
    labels = []
    for stage in stages:
        entry = next(v for v in report["stages"][stage].values() if _is_entry(v))
        labels.append(f"{stage}\n{entry['n_tasks']} tasks, {entry['n_episodes']} episodes")
    ax.set_xticks(range(len(stages)), labels, fontsize=9)
    ax.set_ylim(0, 1.22)  # room above the bars for the legend
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("rate (95% bootstrap CI over tasks)")
    ax.legend(loc="upper center", fontsize=8, ncol=len(names), frameon=False)
    domain = report.get("domain", "?")
    split = report.get("eval_split")
    same = split is not None and report.get("train_split") == split
    ax.set_title(f"Demo, each stage's checkpoint evaluated: {domain} domain{f' ({split} split)' if split else ''}, "
                 f"tiny model, scripted user\n{CAVEAT}{'; trained and evaluated on the same tasks' if same else ''}",
                 fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
