"""Pass@K evaluator: each (task, sample) is a tau2 episode, run concurrently, saved when done.

    # at scale: an SGLang server holds the policy; the tokenizer comes from the same checkpoint
    python -m tau2_rl_pipeline.eval.eval_passk --backend sglang --sglang-url http://127.0.0.1:30000 \
        --hf-checkpoint Qwen/Qwen3-4B-Instruct-2507 --domains airline,retail,telecom --task-split test \
        --num-samples 4 --output outputs/eval/qwen3-4b.json
    # on one machine: the in-process engine, offline scripted user (a plumbing check, not a tau2 score)
    python -m tau2_rl_pipeline.eval.eval_passk --backend local --model outputs/tiny --user scripted --domains mock \
        --task-split base --num-samples 2 --output outputs/eval/demo.json

Writes, beside --output (summary JSON): <output>.episodes.jsonl (one line per episode, resumable: a rerun
skips finished episodes and retries aborted ones), <stem>.<domain>.tau2.json (tau2's own results format),
<stem>.png (chart). Metrics come from tau2_rl_pipeline.metrics.summarize: unbiased pass@k and tau2's pass^k
per domain and overall (micro and macro), 95% bootstrap CIs over tasks, aborted episodes counted apart.
Exit codes: 0 done, 1 the run failed (e.g. every episode aborted), 2 bad setup (nothing written).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import tau2_rl_pipeline  # noqa: F401  (offline litellm and quiet tau2 logging before tau2 loads)
from tau2_rl_pipeline.eval.args import build_parser

if TYPE_CHECKING:
    from tau2_rl_pipeline.config import Tau2Config
    from tau2_rl_pipeline.eval.episodes_file import Key
    from tau2_rl_pipeline.rollout.engines import SamplingParams


async def _evaluate(pending: Sequence[tuple[str, Any, int]], args: argparse.Namespace, setup: dict[str, Any],
                    cfg: Tau2Config, sampling: SamplingParams, on_done: Callable[[dict], None]) -> None:
    from tau2_rl_pipeline.eval.runner import run_episodes, run_episodes_on_sglang

    common = dict(tokenizer=setup["tokenizer"], user_factory=setup["user_factory"], sampling=sampling, cfg=cfg,
                  seed=args.seed, concurrency=args.concurrency, on_done=on_done)
    if args.backend == "sglang":
        await run_episodes_on_sglang(args.sglang_url, pending, **common)
    else:
        await run_episodes(pending, engine=setup["engine"], **common)


def _progress(console: Any, total: int, done: dict[Key, dict]) -> tuple[Any, Callable[[dict], None]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tau2_rl_pipeline.metrics import is_success

    stats = {"passed": 0, "scored": 0, "aborted": 0}

    def count(rec: dict) -> None:
        if rec["status"] == "aborted":
            stats["aborted"] += 1
        else:
            stats["scored"] += 1
            stats["passed"] += is_success(rec["reward"])

    def text() -> str:
        rate = stats["passed"] / stats["scored"] if stats["scored"] else 0.0
        return f"pass {stats['passed']}/{stats['scored']} = {rate:.3f}, aborted {stats['aborted']}"

    for rec in done.values():
        count(rec)
    progress = Progress(TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                        TimeElapsedColumn(), console=console)
    bar = progress.add_task("episodes", total=total, completed=len(done), rate=text())

    def advance(rec: dict) -> None:
        count(rec)
        progress.update(bar, advance=1, rate=text())

    return progress, advance


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """The evaluation the parsed command line asks for. tau2, litellm and the engines load here, not at import:
    --help and a refused command line answer at once."""
    from rich.console import Console

    from tau2_rl_pipeline.benchmark import judge
    from tau2_rl_pipeline.benchmark.tasks import TaskLookupError
    from tau2_rl_pipeline.benchmark.users import UserConfigError
    from tau2_rl_pipeline.config import ConfigError
    from tau2_rl_pipeline.eval import backends
    from tau2_rl_pipeline.eval.backends import SetupError
    from tau2_rl_pipeline.eval.compare import check_comparable
    from tau2_rl_pipeline.eval.compare_cli import load_run
    from tau2_rl_pipeline.eval.episodes_file import EpisodesFile, EpisodesFileError, secret_values
    from tau2_rl_pipeline.eval.plan import episode_settings, output_paths, prepare, run_settings
    from tau2_rl_pipeline.eval.shards import ShardError, run_sharded
    from tau2_rl_pipeline.eval.submission import SubmissionError
    from tau2_rl_pipeline.eval.summary import finish, remove_stale
    from tau2_rl_pipeline.rollout.gc_policy import settled

    try:
        plan, cfg, sampling, setup = prepare(args)
        settings = run_settings(args, cfg, sampling, setup["model"], setup["tokenizer_name"], plan)
        args.baseline = None
        if args.compare is not None:  # refused now, not after the run: a comparison that cannot be made
            args.baseline = load_run(args.compare)
            check_comparable(args.baseline["settings"], settings)
        paths = output_paths(args.output, list(plan.tasks))
        secrets = secret_values()
        log = EpisodesFile(paths["episodes"], episode_settings(settings),
                           benchmark=settings["benchmark"], secrets=secrets)
        done = log.load() if args.resume else {}
        if setup["model_dir"] is not None:  # the slow part, once nothing else can refuse the run
            setup["engine"] = backends.load_local_engine(setup["model_dir"], setup["tokenizer"], setup["device"],
                                                         setup["flag"])
    except (ConfigError, TaskLookupError, UserConfigError, judge.JudgeConfigError, SetupError, EpisodesFileError,
            SubmissionError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    try:
        remove_stale(paths)
        log.open_for_append(discard=not args.resume)
    except OSError as e:  # the folder could not be made or written after all (e.g. a read-only mount)
        print(f"error: --output {args.output}: cannot write {e.filename or args.output}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    finished = {k: r for k, r in done.items() if r["status"] != "aborted"}  # aborted ones run again
    pending = [(d, t, s) for d, t, s in plan.episodes() if (d, t.id, s) not in finished]
    planned = set(plan.keys())
    kept = {k: r for k, r in finished.items() if k in planned}
    if kept:
        print(f"resuming {len(kept)}/{len(planned)} episodes from {paths['episodes']} (--no-resume starts over)",
              file=sys.stderr, flush=True)
    progress, advance = _progress(Console(stderr=True), len(planned), kept)
    new: list[dict] = []

    def on_done(rec: dict) -> None:
        log.append(rec)  # durable before anything else
        new.append(rec)
        advance(rec)

    try:
        with progress, settled():  # the rollout's GC policy (tau2_rl_pipeline/rollout/gc_policy.py)
            if args.procs > 1:
                run_sharded(pending, procs=args.procs, sglang_url=args.sglang_url, tokenizer=setup["tokenizer"],
                            user_kind=args.user, cfg=cfg, sampling=sampling, seed=args.seed,
                            concurrency=args.concurrency, on_done=on_done)
            else:
                asyncio.run(_evaluate(pending, args, setup, cfg, sampling, on_done))
    except ShardError as e:
        print(f"error: {e}; the {len(new)} episodes finished in this run are saved in {paths['episodes']}: rerun the "
              "same command to resume", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: {len(new)} episodes finished in this run are saved in {paths['episodes']}; "
              "rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        log.close()
    try:
        return finish(plan, settings, log, done, new, paths, secrets, time.perf_counter() - t0, args)
    except OSError as e:  # the disk filled, the folder was removed or made read-only meanwhile
        print(f"error: writing the results failed: {e.filename or args.output}: {e.strerror or e}; the episodes are "
              f"kept in {paths['episodes']}: rerun the same command to write them", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
