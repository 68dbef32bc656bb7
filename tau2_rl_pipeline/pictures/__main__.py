"""Draw the project's pictures from the project itself (tau2-rl-pictures).

Draw the project's pictures from the project itself (also: python -m tau2_rl_pipeline.pictures), into
outputs/pictures/ (or --out); --public refreshes the tracked copies in public/ instead (for the maintainers).

  pipeline.png     scripts/pipeline.sh's stages, servers, files and GPU layouts, drawn from its dry runs
  demo_stages.png  the demo's Pass@K per stage, from outputs/demo/report.json (bash scripts/demo.sh), copied
                   beside it as demo_report.json; where the demo has not run, from public/demo_report.json
  bench.png        bench/README.md's P-tables, each row a ratio
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tau2_rl_pipeline.config import HelpFormatter, command_parser
from tau2_rl_pipeline.files import atomic_write_bytes
from tau2_rl_pipeline.pictures import bench_chart, pipeline_diagram, stage_chart
from tau2_rl_pipeline.pictures.plan import ROOT, dry_run_plan, gpu_layouts

REFERENCE_TITLE = "tau2 Pass@k (reference run)"
PUBLIC = ROOT / "public"


class _Formatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """The description as written (a table of the pictures)."""


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("tau2-rl-pictures", __doc__, formatter_class=_Formatter)
    p.add_argument("--out", type=Path, default=None, help="folder the pictures go to (default: outputs/pictures)")
    p.add_argument("--public", action="store_true",
                   help="refresh the tracked pictures and demo_report.json in public/ (instead of --out)")
    p.add_argument("--report", type=Path, default=None,
                   help="the demo's report (default: outputs/demo/report.json, else <out>/demo_report.json)")
    p.add_argument("--bench", type=Path, default=None, help="the benchmarks' README (default: bench/README.md)")
    p.add_argument("--reference", type=Path, default=None,
                   help="also chart this tau2-rl-eval summary (a trained checkpoint on a test split) as "
                        "<out>/passk_reference.png, with a copy in <out>/passk_reference.json")
    return p


def _write_json(path: Path, data: dict) -> None:
    atomic_write_bytes(path, (json.dumps(data, indent=1) + "\n").encode())


def make_pictures(out: Path, report_path: Path, bench: Path, reference: Path | None = None) -> list[Path]:
    """Write every picture into `out`; returns the files written."""
    written = []
    plans = {layout: dry_run_plan(layout) for layout in gpu_layouts()}
    pipeline_diagram.render(plans, out / "pipeline.png")
    written.append(out / "pipeline.png")
    copy = out / "demo_report.json"
    source = report_path if report_path.is_file() else PUBLIC / "demo_report.json"
    if not source.is_file():
        raise FileNotFoundError(f"no demo report at {report_path} nor {source}: run bash scripts/demo.sh first")
    report = json.loads(source.read_text())
    stage_chart.render(report, out / "demo_stages.png")
    written.append(out / "demo_stages.png")
    if source != copy:
        _write_json(copy, report)
        written.append(copy)
    bench_chart.render(bench, out / "bench.png")
    written.append(out / "bench.png")
    if reference is not None:
        written += reference_chart(reference, out)
    return written


def reference_chart(reference: Path, out: Path) -> list[Path]:
    """A tau2-rl-eval summary's Pass@k chart as <out>/passk_reference.png, and the summary copied beside it."""
    from tau2_rl_pipeline.eval.report import render_chart

    summary = json.loads(reference.read_text())
    render_chart(summary, out / "passk_reference.png", REFERENCE_TITLE)
    _write_json(out / "passk_reference.json", summary)
    return [out / "passk_reference.png", out / "passk_reference.json"]


def out_dir(args: argparse.Namespace) -> Path:
    """Where the pictures go: the user's folder; public/ (tracked) only when asked with --public."""
    if args.public and args.out is not None:
        raise ValueError("--public writes into public/; drop --out")
    return PUBLIC if args.public else args.out or Path("outputs") / "pictures"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.reference is not None and not args.reference.is_file():
        print(f"error: reference summary not found: {args.reference} (pass a tau2-rl-eval --output)", file=sys.stderr)
        return 2
    try:
        written = make_pictures(out_dir(args), args.report or ROOT / "outputs" / "demo" / "report.json",
                                args.bench or ROOT / "bench" / "README.md", args.reference)
    except OSError as e:  # an unwritable --out, a file where a folder goes
        print(f"error: cannot write {e.filename or 'the pictures'}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"error: the report has no {e} (give a report.json written by tau2-rl-demo)", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
