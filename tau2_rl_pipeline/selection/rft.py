"""Rejection-sampling fine-tuning data: the current policy's good episodes as SFT rows.

Rejection-sampling fine-tuning data: sample episodes of the train tasks with the current policy, keep the good
ones as SFT rows, merge them with the seed data.

    python -m tau2_rl_pipeline.selection.rft --sglang-url http://127.0.0.1:30000 --hf-checkpoint outputs/sft-hf \
        --domains airline,retail,telecom --num-samples 8 --temperature 0.8 --out data/rft.jsonl \
        --merge-with data/seed.jsonl
    python -m tau2_rl_pipeline.selection.rft --episodes outputs/rft/eval.json.episodes.jsonl --out data/rft.jsonl  # reselect

Sampling is the Pass@K evaluator's run (tau2_rl_pipeline/eval/eval_passk.py) on the train split: options this module does not
define (--hf-checkpoint, --backend, --user, --top-p, TAU2_* settings, ...) are passed on to it, and its episode
file (<out>.eval.json.episodes.jsonl) is resumable. Selection per task follows the original cookbook: every
successful episode (tau2's rule: reward within 1e-6 of 1); for a task with none, its best completed episode by
partial score when that is at least --min-partial (--no-partial turns this off). A row is the episode's exact
conversation as the policy saw it (see sft_rows.sft_chat); identical conversations are kept once, also across the
merge with the seed rows.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from tau2.data_model.message import AssistantMessage, Message, ToolMessage, UserMessage

from tau2_rl_pipeline.benchmark.tasks import write_jsonl
from tau2_rl_pipeline.learning.seed_data import RowError, SeedDataError, normalize_row, read_rows
from tau2_rl_pipeline.learning.sft_rows import conversation_key, sft_chat, sft_row
from tau2_rl_pipeline.metrics import is_success

MIN_PARTIAL = 0.6
_MESSAGE_TYPES = {"assistant": AssistantMessage, "user": UserMessage, "tool": ToolMessage}


# ---------------------------------------------------------------------------------------------------------------
# Selection (pure over the evaluator's episode records)


def tau2_messages(dicts: Iterable[dict]) -> list[Message]:
    """tau2 messages back from the JSON the evaluator recorded (`Message.model_dump(mode="json")`)."""
    return [_MESSAGE_TYPES[d["role"]].model_validate(d) for d in dicts]


def rft_row(record: dict, selected: str) -> dict:
    chat = sft_chat(tau2_messages(record["messages"]))
    return sft_row(record["domain"], chat, {
        "task_id": record["task_id"], "source": "rft", "selected": selected, "sample": record["sample"],
        "reward": record["reward"], "partial": record["partial"]})


def select_rft(records: Iterable[dict], *, min_partial: float = MIN_PARTIAL, allow_partial: bool = True) -> list[dict]:
    """SFT rows from episode records: per task its successes, else (when allowed) its best completed episode by
    partial score if that reaches `min_partial`; aborted and truncated episodes never count. Identical
    conversations are kept once. Rows come out ordered by domain, task id (numbers in it compared as numbers) and
    sample, whatever order the episodes finished in: a rerun selects the same rows in the same order."""
    by_task: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for rec in records:
        if rec["status"] == "completed":
            by_task[(rec["domain"], rec["task_id"])].append(rec)
    rows: list[dict] = []
    for key in sorted(by_task, key=lambda k: (k[0], _natural(k[1]))):
        recs = sorted(by_task[key], key=lambda r: r["sample"])
        wins = [r for r in recs if is_success(r["reward"])]
        if wins:
            rows += [rft_row(r, "success") for r in wins]
        elif allow_partial:
            best = max(recs, key=lambda r: r["partial"])  # the first sample among equals
            if best["partial"] >= min_partial:
                rows.append(rft_row(best, "partial"))
    return dedupe(rows)[0]


def _natural(text: str) -> tuple:
    """Sort key reading the digit runs of a task id as numbers ("2" before "10"); ties keep the plain text."""
    parts = re.split(r"([0-9]+)", text)
    return tuple((0, int(p), "") if p.isascii() and p.isdigit() else (1, 0, p) for p in parts if p), text


def dedupe(rows: Sequence[dict]) -> tuple[list[dict], int]:
    """Rows with each conversation once (the first one wins), and how many were dropped."""
    seen: set[str] = set()
    kept: list[dict] = []
    for row in rows:
        key = conversation_key(row)
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept, len(rows) - len(kept)


def merge_rows(seed: Sequence[dict], new: Sequence[dict]) -> tuple[list[dict], int]:
    """Seed rows then new rows, each conversation once; returns the rows and how many duplicates were dropped."""
    return dedupe([*seed, *new])


def domain_stats(records: Iterable[dict], rows: Iterable[dict]) -> dict[str, dict[str, int]]:
    """Per domain: tasks, scored and aborted episodes, successes, tasks solved, rows selected by kind."""
    stats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    tasks: dict[str, set[str]] = defaultdict(set)
    solved: dict[str, set[str]] = defaultdict(set)
    for rec in records:
        d = rec["domain"]
        tasks[d].add(rec["task_id"])
        if rec["status"] == "aborted":
            stats[d]["aborted"] += 1
            continue
        stats[d]["episodes"] += 1
        if is_success(rec["reward"]):
            stats[d]["successes"] += 1
            solved[d].add(rec["task_id"])
    for row in rows:
        stats[row["metadata"]["domain"]][f"rows_{row['metadata']['selected']}"] += 1
    for d, s in stats.items():
        s["tasks"], s["tasks_solved"] = len(tasks[d]), len(solved[d])
    return {d: dict(s) for d, s in sorted(stats.items())}


# ---------------------------------------------------------------------------------------------------------------
# I/O


def load_rows(path: Path) -> list[dict]:
    """SFT rows of an earlier stage (seed or oracle output), each checked; a bad one is an error, not skipped."""
    rows = []
    for line, raw in read_rows(path):
        try:
            if isinstance(raw, RowError):
                raise raw
            normalize_row(raw)
        except RowError as e:
            raise SeedDataError(f"{path} line {line}: {e}") from None
        rows.append(raw)
    return rows


def sample_episodes(args: argparse.Namespace, passthrough: list[str]) -> tuple[int, Path]:
    """Run the Pass@K evaluator on the train tasks; returns its exit code and its episode file."""
    from tau2_rl_pipeline.eval import eval_passk
    from tau2_rl_pipeline.eval.plan import output_paths

    output = Path(args.eval_output or args.out + ".eval.json")
    argv = ["--domains", args.domains, "--task-split", args.task_split, "--num-samples", str(args.num_samples),
            "--temperature", str(args.temperature), "--output", str(output), *passthrough]
    if args.sglang_url:
        argv += ["--sglang-url", args.sglang_url]
    code = eval_passk.main(argv)
    return code, output_paths(output, [])["episodes"]


def print_table(stats: dict[str, dict[str, int]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("domain", "tasks solved", "successes", "rate", "rows", "partial rows", "aborted"):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for domain, s in stats.items():
        n, wins = s.get("episodes", 0), s.get("successes", 0)
        table.add_row(domain, f"{s['tasks_solved']}/{s['tasks']}", f"{wins}/{n}", f"{wins / n:.3f}" if n else "-",
                      str(s.get("rows_success", 0) + s.get("rows_partial", 0)), str(s.get("rows_partial", 0)),
                      str(s.get("aborted", 0)))
    Console().print(table)


def main(argv: Sequence[str] | None = None) -> int:
    from tau2_rl_pipeline.eval.episodes_file import EpisodesFileError, check_graded_by_installed_tau2, read_episodes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     epilog="Other options go to the evaluator, tau2-rl-eval (e.g. --hf-checkpoint).")
    parser.add_argument("--sglang-url", default=None, help="policy server (SGLang) to sample from")
    parser.add_argument("--domains", default="airline,retail,telecom", help="comma-separated domains")
    parser.add_argument("--task-split", default="train", help="tasks to sample (mock has only base)")
    parser.add_argument("--num-samples", type=int, default=8, help="episodes per task")
    parser.add_argument("--temperature", type=float, default=0.8, help="policy sampling temperature")
    parser.add_argument("--eval-output", default=None, help="evaluator summary path (default: OUT.eval.json)")
    parser.add_argument("--episodes", type=Path, default=None,
                        help="select from this evaluator episode file instead of sampling")
    parser.add_argument("--min-partial", type=float, default=MIN_PARTIAL,
                        help="a task without successes keeps its best episode if its partial score reaches this")
    parser.add_argument("--partial", action=argparse.BooleanOptionalAction, default=True,
                        help="keep a best partial episode for tasks without successes")
    parser.add_argument("--merge-with", type=Path, default=None, help="SFT rows to merge with (the seed data)")
    parser.add_argument("--out", required=True, help="output JSONL of SFT rows")
    args, passthrough = parser.parse_known_args(argv)
    if args.episodes is not None and passthrough:
        parser.error(f"--episodes selects from recorded episodes; unknown options {' '.join(passthrough)}")
    try:
        seed = load_rows(args.merge_with) if args.merge_with else []
        episodes = args.episodes
        if episodes is None:
            code, episodes = sample_episodes(args, passthrough)
            if code != 0:
                if code != 2:  # exit 2 is a setup error the evaluator already explained in one line
                    print(f"error: sampling failed (eval_passk exit {code}); see its messages above", file=sys.stderr)
                return code
        check_graded_by_installed_tau2(episodes)
        records = list(read_episodes(episodes).values())
        if args.episodes is None:  # the resumable episode file may also hold an earlier run's other domains
            domains = {d.strip() for d in args.domains.split(",")}
            records = [r for r in records if r["domain"] in domains and r["sample"] < args.num_samples]
    except (SeedDataError, EpisodesFileError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = select_rft(records, min_partial=args.min_partial, allow_partial=args.partial)
    merged, duplicates = merge_rows(seed, rows)
    print_table(domain_stats(records, rows), "RFT selection")
    write_jsonl(Path(args.out), merged)
    print(f"wrote {len(merged)} rows to {args.out}: {len(rows)} RFT rows (from {episodes}) + {len(seed)} seed "
          f"rows, {duplicates} duplicates dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
