"""public/bench.png: the rows of the P-tables in bench/README.md as ratios, each panel saying what it is against.

The numbers are read from bench/README.md itself (its markdown tables), so the chart shows what the README
reports; SPECS says, per benchmark, which columns are the row's label, its ratio and the two sides of the ratio.
A table that keeps its history (earlier commits, loaded machines) names its current rows in a line of its section,
`**Charted** (...): NAME = row 10; NAME = rows 28-29`: the chart then draws one bar per name, the mean of its runs
with their range and count, and leaves the history to the table. A README table whose columns no longer match its
spec, or a charted row it lacks, is an error naming the benchmark.
"""

from __future__ import annotations

import io
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tau2_rl_pipeline.files import atomic_write_bytes


@dataclass(frozen=True)
class BenchSpec:
    section: str  # "P1": the README section "## P1: ..."
    title: str  # what the ratio is, against what
    label: tuple[str, ...]  # columns joined into the row's label
    value: str  # the ratio column (first number in the cell: "**162x** / **174x**" -> 162)
    sides: tuple[str, ...]  # the columns the ratio compares (or one column to show), beside each bar
    unit: str  # "x" or "%"
    target: float | None = None  # drawn as a dashed line
    side_unit: str = ""  # appended to the sides when their cells carry no unit
    label_unit: str = ""  # appended to the label


SPECS = (
    BenchSpec("P1", "P1 environment cost: tau2's native setup + evaluation / fast_env's (CPU ms per episode, median)",
              ("domain",), "ratio (median / mean)", ("native setup+eval", "fast setup+eval"), "x", 20.0,
              side_unit=" ms"),
    BenchSpec("P2", "P2 harness efficiency: engine-bound ideal wall time / achieved (1024 episodes, 256 in flight)",
              ("variant (mock unless said)", "latency"), "efficiency", ("ideal", "achieved"), "%", 90.0),
    BenchSpec("P3", "P3 per-turn cost: re-render + re-tokenize the whole history / the token-delta step",
              ("history (tokens)",), "naive / delta", ("naive re-render + re-tokenize", "token-delta step"), "x",
              label_unit=" tokens of history"),
    BenchSpec("P4", "P4 vs. the original design: episodes one after another / 32 in flight (wall time)",
              ("evaluation",), "ratio", ("sequential", "concurrent (32 in flight)"), "x"),
    BenchSpec("P5", "P5 LLM user: ideal wall time / achieved (1024 episodes, 256 in flight, 1 s/call, quiet; "
              "CPU/episode)", ("run",), "efficiency (ideal / achieved)",
              ("CPU per episode",), "%", 90.0),
    BenchSpec("P6", "P6 the long tail: slime's synchronous rollout step / this mode's (wall time; 0.5 s per call)",
              ("mode",), "vs sync", ("wall per step (mean)",), "x"),
    BenchSpec("P12", "P12 async GRPO, staleness bound eta: trained tokens/s / eta 0's (the synchronous path)",
              ("eta",), "vs eta 0", ("trained tokens / s (steps 2-6)",), "x", side_unit=" tokens/s"),
)


LABEL_WIDTH = 52  # characters of a row label per line


@dataclass
class BenchRow:
    label: str
    value: float  # the mean of `runs` runs
    sides: tuple[str, ...]
    low: float | None = None  # the range of the runs, when there are several
    high: float | None = None
    runs: int = 1


def _section(text: str, section: str) -> str:
    match = re.search(rf"^## {section}\b.*?$(.*?)(?=^## |\Z)", text, flags=re.MULTILINE | re.DOTALL)
    if not match:
        raise ValueError(f"bench/README.md has no section '## {section}'")
    return match.group(1)


def charted(text: str, section: str) -> list[tuple[str, list[str]]] | None:
    """The section's `**Charted**` line as [(name, its row numbers)], or None when it has none (every row shown)."""
    match = re.search(r"^\*\*Charted\*\*(?:\s*\([^)]*\))?:(.+)$", _section(text, section), flags=re.MULTILINE)
    if not match:
        return None
    groups = []
    for part in match.group(1).split(";"):
        name, _, rows = part.partition("=")
        numbers = [str(n) for a, b in re.findall(r"(\d+)(?:-(\d+))?", rows) for n in range(int(a), int(b or a) + 1)]
        if not name.strip() or not numbers:
            raise ValueError(f"bench/README.md {section}: a **Charted** entry is not NAME = row N or rows N-M: "
                             f"{part.strip()!r}")
        groups.append((name.strip(), numbers))
    return groups


def _table(text: str, section: str) -> list[dict[str, str]]:
    """The first markdown table of `## <section>:` as dicts keyed by header."""
    lines = [ln.strip() for ln in _section(text, section).splitlines()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("|")), None)
    if start is None:
        raise ValueError(f"bench/README.md section {section} has no table")
    rows = []
    for ln in lines[start:]:
        if not ln.startswith("|"):
            break
        rows.append([cell.strip() for cell in ln.strip("|").split("|")])
    header, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]
    return [dict(zip(header, r)) for r in body]


def _number(cell: str) -> float:
    match = re.search(r"\d[\d,]*(?:\.\d+)?", cell)
    if not match:
        raise ValueError(f"no number in {cell!r}")
    return float(match.group(0).replace(",", ""))


# A run's notes for the record (clock times, commits: "(16:51 UTC)", "main at e7572e0", "(f1061b8, --gc freeze)")
# belong in bench/README.md's table, not on a chart a reader scans.
_NOTEBOOK = (re.compile(r",? main at [0-9a-f]{7,40}"), re.compile(r"\b[0-9a-f]{7,40}\b[,:]?\s*"),
             re.compile(r"\s*\(\d{1,2}:\d{2}(?: UTC)?\)"), re.compile(r"\s*\(\s*\)"))


def _plain(cell: str) -> str:
    return cell.replace("**", "").replace("`", "").split(" / ")[0].strip()


def _label(cell: str) -> str:
    """A row's label without its lab-notebook notes."""
    text = _plain(cell)
    for pattern in _NOTEBOOK:
        text = pattern.sub("", text)
    return re.sub(r"\s{2,}", " ", text.replace("( ", "(").replace(" )", ")").replace(" :", ":")).strip(" ,")


def bench_rows(text: str, spec: BenchSpec) -> list[BenchRow]:
    """The panel's bars: one per charted name (its runs pooled), or, with no **Charted** line, one per row."""
    table = _table(text, spec.section)
    for row in table:
        for column in (*spec.label, spec.value, *spec.sides):
            if column not in row:
                raise ValueError(f"bench/README.md {spec.section}: no column {column!r} (has: {', '.join(row)})")
    if not table:
        raise ValueError(f"bench/README.md {spec.section}: the table has no rows")
    groups = charted(text, spec.section)
    if groups is None:
        return [BenchRow((f"{row['#']}. " if "#" in row else "") + ", ".join(_label(row[c]) for c in spec.label)
                         + spec.label_unit, _number(row[spec.value]),
                         tuple(_plain(row[c]) + spec.side_unit for c in spec.sides)) for row in table]
    by_number = {row.get("#"): row for row in table}
    out = []
    for name, numbers in groups:
        missing = [n for n in numbers if n not in by_number]
        if missing:
            raise ValueError(f"bench/README.md {spec.section}: **Charted** names row {missing[0]}, which its table "
                             "lacks")
        rows = [by_number[n] for n in numbers]
        values = [_number(row[spec.value]) for row in rows]
        sides = tuple(_span([_plain(row[c]) for row in rows]) + spec.side_unit for c in spec.sides)
        label = f"{name} ({len(rows)} run{'s' if len(rows) > 1 else ''}, row{'s' if len(rows) > 1 else ''} " \
                f"{', '.join(numbers)})"
        out.append(BenchRow(label, round(sum(values) / len(values), 3), sides, min(values), max(values), len(rows)))
    return out


def _span(cells: list[str]) -> str:
    """Cells such as "5.6 ms", "4.1 ms" as one: "4.1-5.6 ms" (or the cell, when they agree)."""
    if len(set(cells)) == 1:
        return cells[0]
    numbers = [_number(c) for c in cells]
    unit = re.sub(r"^\D*\d[\d,]*(?:\.\d+)?", "", cells[0]).strip()
    return f"{min(numbers):g}-{max(numbers):g}" + (f" {unit}" if unit else "")


def render(readme: Path, path: Path) -> None:
    """One horizontal-bar panel per benchmark, axes from zero, each bar labelled with its value and its two sides."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = readme.read_text()
    panels = [(spec, bench_rows(text, spec)) for spec in SPECS]
    labels = [[textwrap.fill(r.label, LABEL_WIDTH) for r in rows] for _, rows in panels]
    # inches per panel: its rows (taller when a label takes two lines), its title and its axis
    heights = [len(ls) * (0.25 + 0.13 * (max(lab.count("\n") for lab in ls))) + 0.5 for ls in labels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) + 0.4),
                             gridspec_kw={"height_ratios": heights})
    for ax, (spec, rows), names in zip(axes, panels, labels):
        ys = list(range(len(rows)))[::-1]
        values = [r.value for r in rows]
        ax.barh(ys, values, color="#4C72B0", height=0.65)
        top = max(values + ([spec.target] if spec.target else [])) * 1.5
        for y, r in zip(ys, rows):
            spread = ""
            if r.runs > 1:  # the runs' range around their mean
                ax.errorbar(r.value, y, xerr=[[r.value - r.low], [r.high - r.value]], fmt="none", ecolor="black",
                            capsize=3, linewidth=1)
                spread = f" (range {r.low:g}-{r.high:g})"
            ax.text((r.high or r.value) + top * 0.01, y, f"{r.value:g}{spec.unit}{spread}   ({' vs '.join(r.sides)})",
                    va="center", fontsize=8, bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3})
        if spec.target:
            ax.axvline(spec.target, color="#C44E52", linestyle="--", linewidth=1)
            ax.text(spec.target, len(rows) - 0.45, f" target {spec.target:g}{spec.unit}", color="#C44E52",
                    fontsize=7.5, va="bottom")
        ax.set_yticks(ys, names, fontsize=8)
        ax.set_xlim(0, top)
        if spec.unit == "%":  # a share of the ideal: ticks up to 100 only
            ax.set_xticks(range(0, 101, 20))
        ax.set_ylim(-0.6, len(rows) - 0.1)
        ax.set_title(spec.title, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Benchmarks (bench/README.md): each bar a ratio, both sides measured in one run (several: their "
                 "mean and range)", fontsize=11,
                 fontweight="bold", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # room for the suptitle above the panels
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
