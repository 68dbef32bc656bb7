"""SFT rows for slime's SFT rollout: the seed data or oracle demonstrations (a CLI).

SFT rows for slime's SFT rollout (`--input-key messages --tool-key tools`): the published seed data, validated and
normalized, or oracle demonstrations built offline from tau2's train split.

    python -m tau2_rl_pipeline.learning.sft_data seed --dataset Jarrodbarnes/tau2-sft-seed-v3 --out data/seed.jsonl
    python -m tau2_rl_pipeline.learning.sft_data seed --dataset path/to/file.jsonl_or_dir --out data/seed.jsonl
    python -m tau2_rl_pipeline.learning.sft_data oracle --domains airline,retail,telecom --split train --out data/seed.jsonl

A row is `{"messages": [...], "tools": [...], "metadata": {"domain", "task_id", "source", ...}}`: the system turn is
tau2's agent prompt for the row's domain and `tools` are that domain's schemas, exactly what the rollout shows the
policy, so SFT teaches the protocol the policy is later run and scored with (native Qwen3 tool calls, tool results in
`tool` turns). A message may carry `"step_loss_mask": 0` (slime's per-message mask): it stays in the context but is
not trained on (the fixed greeting, which the rollout puts in the prompt; a completion the parser rejected).

The published dataset uses the original cookbook's protocol: tool calls as `<tool_call>` text inside assistant turns,
`respond` / `done` pseudo-tools for talking and ending, tool results as user turns `Tool result for name(args):\\n...`.
Rows in that protocol or in OpenAI chat format (`tool_calls`, `tool` turns) are both read and rewritten to the rollout's
protocol; a row that cannot be is reported with its line number and left out.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, check_split, write_jsonl
from tau2_rl_pipeline.learning.oracle_demos import oracle_demos
from tau2_rl_pipeline.learning.seed_data import SEED_DATASET, SEED_FILE, SeedDataError, load_seed


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _domain_counts(rows: list[dict]) -> str:
    counts = Counter(r["metadata"]["domain"] for r in rows)
    return ", ".join(f"{d} {n}" for d, n in sorted(counts.items()))


def _seed(args: argparse.Namespace) -> int:
    rows, rejected = load_seed(args.dataset, args.file)
    for r in rejected:
        print(f"{r.file} line {r.line}: {r.reason}", file=sys.stderr)
    rejected_path = Path(args.out + ".rejected.jsonl")
    write_jsonl(rejected_path, [{"file": r.file, "line": r.line, "reason": r.reason} for r in rejected])
    if not rows:
        print(f"error: no valid rows in {args.dataset} ({len(rejected)} rejected, see {rejected_path})",
              file=sys.stderr)
        return 1
    write_jsonl(Path(args.out), rows)
    print(f"wrote {len(rows)} rows ({_domain_counts(rows)}) to {args.out}; rejected {len(rejected)} "
          f"(see {rejected_path})")
    return 0


def _oracle(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    domains = _csv(args.domains)
    for domain in domains:
        check_split(domain, args.split)
    table = Table(title=f"oracle demonstrations ({args.split})")
    for col in ("domain", "tasks", "rows", "left out (reward)"):
        table.add_column(col)
    rows: list[dict] = []
    for domain in domains:
        demos = oracle_demos(domain, args.split)
        kept = [d.row for d in demos if d.row is not None]
        dropped = ", ".join(f"{d.task_id} ({d.reward:.2f})" for d in demos if d.row is None) or "-"
        table.add_row(domain, str(len(demos)), str(len(kept)), dropped)
        rows += kept
    Console().print(table)
    if not rows:
        print("error: no oracle demonstration reached reward 1.0", file=sys.stderr)
        return 1
    write_jsonl(Path(args.out), rows)
    print(f"wrote {len(rows)} rows ({_domain_counts(rows)}) to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build SFT rows (messages + tools) for slime's SFT rollout.")
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed", help="validate and normalize the published seed data")
    seed.add_argument("--dataset", default=SEED_DATASET, help="hub dataset id, or a local .jsonl/.json/.parquet "
                      "file or directory")
    seed.add_argument("--file", default=SEED_FILE, help="which data files of a directory or hub dataset to read "
                      "(a glob)")
    seed.add_argument("--out", required=True, help="output JSONL; rejected rows go to OUT.rejected.jsonl")
    oracle = sub.add_parser("oracle", help="oracle demonstrations from tau2's gold actions, kept at reward 1.0")
    oracle.add_argument("--domains", default="airline,retail,telecom", help="comma-separated domains")
    oracle.add_argument("--split", default="train", help="task split (mock has only base)")
    oracle.add_argument("--out", required=True, help="output JSONL")
    args = parser.parse_args(argv)
    try:
        return _seed(args) if args.command == "seed" else _oracle(args)
    except (SeedDataError, TaskLookupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
