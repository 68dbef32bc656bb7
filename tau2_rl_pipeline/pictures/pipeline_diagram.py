"""public/pipeline.png: the slime pipeline's stages, servers, files and GPU layouts.

public/pipeline.png: the slime pipeline's stages, the servers each talks to, the files passed between them, and
the GPU layouts, all taken from the Plans that scripts/pipeline.sh's dry runs give (plan.py)."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

from tau2_rl_pipeline.files import atomic_write_bytes
from tau2_rl_pipeline.pictures.plan import SCRIPTS, Plan, Server, Stage

COLORS = {"slime": "#4C72B0", "start_policy_server": "#55A868", "start_user_sim": "#DD8452"}
OTHER_COLOR = "#8172B3"
STAGE_FILL = "#F2F2F2"
ROW_IN = 0.7  # inches per stage row (one data unit)
LINE = 0.19  # text line spacing in rows
X_SERVER, W_SERVER = 0.0, 23.0
X_STAGE, W_STAGE = 25.5, 34.0
X_FILES = 61.5
SMALL = 7.5
MONO = 7.0  # monospace runs wider: script and program names
FILES = 7.0


def _span(gpus: tuple[int, ...]) -> str:
    if len(gpus) > 1 and list(gpus) == list(range(gpus[0], gpus[-1] + 1)):
        return f"GPUs {gpus[0]}-{gpus[-1]}"
    return ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))


def server_lines(server: Server) -> list[str]:
    if server.kind == "sglang":
        return [f"{server.key}.sh", f"SGLang :{server.port}, {_span(server.gpus)}, TP{server.tp} x DP{server.dp}"]
    lines = [f"Megatron, {_span(server.gpus)}, TP{server.tp} x DP{server.dp}"]
    return lines + [line for entry, what in server.jobs.items() for line in textwrap.wrap(f"{entry}: {what}", 36)]


def stage_lines(stage: Stage, server_scripts: set[str]) -> list[str]:
    """The stage scripts (or, for a stage without one, the program it runs), then what they start. A script that
    starts a server is named in that server's box instead."""
    own = [s for s in stage.scripts if s not in server_scripts]
    scripts = textwrap.wrap(" + ".join(own), 44) if own else list(stage.programs[:1])
    return scripts + [p for p in stage.programs if p not in scripts]


def file_lines(stage: Stage) -> tuple[list[str], list[str]]:
    """'writes ...' and 'reads ...' lines; a read path names the stage that wrote it by number."""
    writes = textwrap.wrap("writes " + ", ".join(stage.outputs), 82)
    reads = textwrap.wrap("reads " + ", ".join(f"{path} ({by})" for path, by in stage.reads), 84) if stage.reads \
        else []
    return writes, reads


def _server_height(server: Server) -> float:
    return LINE * (len(server_lines(server)) + 1) + 0.12


def _server_rows(plan: Plan) -> dict[str, float]:
    """Each server's vertical centre (in rows): the mean row of the stages using it, pushed apart to not overlap."""
    wanted = []
    for key in plan.servers:
        rows = [i for i, s in enumerate(plan.stages) if key in s.servers]
        wanted.append((sum(rows) / len(rows) if rows else 0.0, key))
    placed: dict[str, float] = {}
    bottom = -10.0
    for centre, key in sorted(wanted):
        half = _server_height(plan.servers[key]) / 2
        centre = max(centre, bottom + half + 0.25)
        placed[key] = centre
        bottom = centre + half
    return placed


def _box(x, y, w, h, color, alpha=1.0, edge=None):
    from matplotlib.patches import FancyBboxPatch

    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.6", facecolor=color, alpha=alpha,
                          edgecolor=edge or color, linewidth=0.8, mutation_aspect=0.08)


def _draw_stages(ax, plan: Plan) -> None:
    server_scripts = {f"{key}.sh" for key in plan.servers}
    for i, stage in enumerate(plan.stages):
        y = -i
        ax.add_patch(_box(X_STAGE, y - 0.42, W_STAGE, 0.84, STAGE_FILL, edge="#999999"))
        lines = stage_lines(stage, server_scripts)[:3]
        top = y + LINE * len(lines) / 2
        ax.text(X_STAGE + 0.8, top, f"{stage.number}  {stage.name}", fontsize=9.5, fontweight="bold", va="center")
        for j, line in enumerate(lines):
            ax.text(X_STAGE + 0.8, top - (j + 1) * LINE, line, fontsize=MONO, family="monospace", va="center",
                    color="#333333")
        if i + 1 < len(plan.stages):
            ax.annotate("", xy=(X_STAGE + W_STAGE - 3, y - 0.58), xytext=(X_STAGE + W_STAGE - 3, y - 0.42),
                        arrowprops={"arrowstyle": "-|>", "color": "#777777", "lw": 0.8})
        writes, reads = file_lines(stage)
        lines2 = [(t, "#111111") for t in writes] + [(t, "#6b6b6b") for t in reads]
        top = y + LINE * (len(lines2) - 1) / 2
        for j, (text, color) in enumerate(lines2):
            ax.text(X_FILES, top - j * LINE, text, fontsize=FILES, va="center", color=color)


def _draw_servers(ax, plan: Plan) -> None:
    for key, centre in _server_rows(plan).items():
        server = plan.servers[key]
        color = COLORS.get(key, OTHER_COLOR)
        height = _server_height(server)
        yc, top = -centre, -centre + height / 2
        ax.add_patch(_box(X_SERVER, yc - height / 2, W_SERVER, height, color, alpha=0.13, edge=color))
        ax.text(X_SERVER + 0.8, top - 0.06 - LINE / 2, server.name, fontsize=9.5, fontweight="bold", va="center",
                color=color)
        for j, line in enumerate(server_lines(server)):
            ax.text(X_SERVER + 0.8, top - 0.06 - (j + 1.5) * LINE, line, fontsize=SMALL, va="center",
                    family="monospace" if line.endswith(".sh") else None)
        for i, stage in enumerate(plan.stages):
            if key in stage.servers:
                ax.annotate("", xy=(X_STAGE, -i), xytext=(X_SERVER + W_SERVER, yc),
                            arrowprops={"arrowstyle": "<|-|>", "color": color, "lw": 1.2, "shrinkA": 0,
                                        "shrinkB": 0, "mutation_scale": 8})


def _draw_gpus(ax, plans: dict[str, Plan]) -> None:
    """One row of GPUs per layout, coloured by the server using them; each group labelled with its shape."""
    ax.set_axis_off()
    ax.set_xlim(0, 100)
    ax.set_ylim(-len(plans) + 0.5, 1.0)
    ax.text(0, 0.7, "GPU layouts (TAU2_GPU_LAYOUT; the same dry run on each)", fontsize=10, fontweight="bold",
            va="center")
    for row, (layout, plan) in enumerate(plans.items()):
        y = -row
        ax.text(0, y, f"layout {layout}", fontsize=9, va="center")
        owner: dict[int, str] = {}  # a GPU two servers share (at different stages) takes the first one's colour
        for key, server in plan.servers.items():
            for g in server.gpus:
                owner.setdefault(g, key)
        for g in range(max(owner) + 1 if owner else 0):
            color = COLORS.get(owner[g], OTHER_COLOR) if g in owner else "white"
            ax.add_patch(_box(9 + g * 3.6, y - 0.32, 3.2, 0.64, color, alpha=0.9))
            ax.text(9 + g * 3.6 + 1.6, y, str(g), ha="center", va="center", fontsize=8, color="white",
                    fontweight="bold")
        groups: dict[tuple[int, ...], list[str]] = {}
        for server in plan.servers.values():
            shape = f"TP{server.tp} x DP{server.dp}"
            shape += "".join(f", {w.split(' + ', 1)[1]}" for w in server.jobs.values() if " + " in w)
            groups.setdefault(server.gpus, []).append(f"{server.name} {shape}")
        text = "\n".join(f"{_span(gpus)}: " + "; ".join(names) for gpus, names in groups.items())
        ax.text(39, y, text, fontsize=SMALL, va="center")


def scripts_outside(plan: Plan, scripts_dir: Path) -> list[str]:
    """Stage scripts (those that source common.sh) that pipeline.sh does not run, e.g. start_judge.sh: started by
    hand when needed, so the picture names them below the stages rather than leaving them out."""
    sourcing = sorted(p.name for p in scripts_dir.glob("*.sh") if p.name != "pipeline.sh"
                      and any(line.startswith("source ") and "common.sh" in line for line in p.read_text().splitlines()))
    return [name for name in sourcing if name not in plan.stage_scripts()]


def render(plans: dict[str, Plan], path: Path, main_layout: str = "8") -> list[str]:
    """Draw the picture (the main layout's stages and servers, then every layout's GPUs); returns every text drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = plans[main_layout]
    n = len(plan.stages)
    top_in, gpu_in = ROW_IN * (n + 0.6), 0.42 * (len(plans) + 1)
    fig = plt.figure(figsize=(11.5, top_in + gpu_in))
    grid = fig.add_gridspec(2, 1, height_ratios=[top_in, gpu_in], hspace=0.0)
    ax = fig.add_subplot(grid[0])
    ax.set_axis_off()
    ax.set_xlim(0, 100)
    ax.set_ylim(-(n - 1) - 0.5, 1.1)
    ax.text(0, 0.9, f"The staged recipe at scale: scripts/pipeline.sh, layout {main_layout} (drawn from its dry run)",
            fontsize=12, fontweight="bold", va="center")
    for x, text in ((X_SERVER, "servers a stage talks to"), (X_STAGE, "stages, in order"),
                    (X_FILES, "files under outputs/; (N) = written by stage N")):
        ax.text(x, 0.55, text, fontsize=9, color="dimgray", va="center", style="italic")
    _draw_stages(ax, plan)
    _draw_servers(ax, plan)
    outside = scripts_outside(plan, SCRIPTS)
    if outside:
        ax.set_ylim(-(n - 1) - 0.75, 1.1)
        ax.text(X_STAGE, -(n - 1) - 0.6, "run by hand when needed, not by pipeline.sh: " + ", ".join(outside)
                + " (tau2-bench 1.0.1's judge server)" * ("start_judge.sh" in outside), fontsize=SMALL,
                color="dimgray", va="center", style="italic")
    _draw_gpus(fig.add_subplot(grid[1]), plans)
    texts = [t.get_text() for a in fig.axes for t in a.texts]
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", pad_inches=0.12)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
    return texts
