"""Pass@K evaluator: each (task, sample) is a tau2 episode, run concurrently, saved when done.

    # at scale: an SGLang server holds the policy; the tokenizer comes from the same checkpoint
    python -m eval.eval_passk --backend sglang --sglang-url http://127.0.0.1:30000 \
        --hf-checkpoint Qwen/Qwen3-4B-Instruct-2507 --domains airline,retail,telecom --task-split test \
        --num-samples 4 --output outputs/eval/qwen3-4b.json
    # on one machine: the in-process engine, offline scripted user (a plumbing check, not a tau2 score)
    python -m eval.eval_passk --backend local --model outputs/tiny --user scripted --domains mock \
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
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rich.console import Console

import tau2_rl_pipeline  # noqa: F401  (offline litellm and quiet tau2 logging before tau2 loads)
from eval import backends
from eval.backends import SetupError
from eval.episodes_file import EpisodesFile, EpisodesFileError, Key, atomic_write_text, pick_records, secret_values
from eval.runner import run_episodes, run_episodes_on_sglang
from eval.shards import ShardError, run_sharded
from eval.submission import SubmissionError, add_submission_args, check_submittable, submit
from tau2_rl_pipeline import judge
from tau2_rl_pipeline.config import ConfigError, Tau2Config, add_config_args, command_parser, config_from_args
from tau2_rl_pipeline.engines import SamplingParams
from tau2_rl_pipeline.gc_policy import settled
from tau2_rl_pipeline.tasks import TaskLookupError, check_split, load_tasks
from tau2_rl_pipeline.tau2_version import VERSION, benchmark_id, check_retrieval_variant, needs_judge
from tau2_rl_pipeline.users import (USER_KINDS, UserConfigError, llm_user_args, make_user_factory,
                                    user_client_kind)

BOOTSTRAP_SEED = 0  # fixed, so the same episodes always give the same CIs (a resumed run included)


# ---------------------------------------------------------------------------------------------------
# Command line

def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "tau2-rl-eval", __doc__.split("\n\n")[0],
        epilog="Writes --output (summary JSON), <output>.episodes.jsonl (a rerun resumes it), tau2 results files "
               "and a PNG chart. On this machine, a demo checkpoint: tau2-rl-eval --backend local --model "
               "outputs/demo/sft --user scripted --domains mock --task-split base")
    g = p.add_argument_group("policy")
    g.add_argument("--backend", choices=("sglang", "local"), default="sglang",
                   help="sglang = an SGLang server (--sglang-url); local = the in-process engine on --model")
    g.add_argument("--sglang-url", default=None, help="SGLang server or router, e.g. http://127.0.0.1:30000")
    g.add_argument("--hf-checkpoint", default=None,
                   help="checkpoint evaluated: local dir or hub id in the HF cache (sglang: its tokenizer; local: "
                        "its weights unless --model)")
    g.add_argument("--model", default=None, help="local backend: model directory or hub id to load")
    g.add_argument("--tokenizer", default=None, help="tokenizer dir or hub id; unset = the checkpoint's")
    g.add_argument("--device", default="auto", help="local backend: torch device (auto: cuda if any)")
    g = p.add_argument_group("tasks")
    g.add_argument("--domains", default="airline,retail,telecom", help="comma-separated tau2 domains")
    g.add_argument("--task-split", default="test",
                   help="split of every domain ('base' only: mock, banking_knowledge)")
    g.add_argument("--task-ids", default=None,
                   help="comma-separated task ids (default: all)")
    g.add_argument("--num-samples", type=int, default=4, help="episodes per task: n in pass@k / pass^k, k <= n")
    g = p.add_argument_group("sampling (default: Qwen3-4B-Instruct-2507's recommended settings)")
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--top-p", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=20, help="-1 = whole vocabulary")
    g.add_argument("--max-new-tokens", type=int, default=1024, help="per policy turn")
    g.add_argument("--seed", type=int, default=300,
                   help="run seed; each episode's seed derives from it (a resumed run reproduces an uninterrupted one)")
    g = p.add_argument_group("run")
    g.add_argument("--user", choices=USER_KINDS, default="llm",
                   help="llm = tau2's user simulator; scripted = offline ScriptedUser (plumbing check, not a tau2 score)")
    g.add_argument("--concurrency", type=int, default=32, help="episodes in flight at once (over all --procs)")
    g.add_argument("--procs", type=int, default=1,
                   help="rollout processes sharing episodes and concurrency (--backend sglang; bench/README.md, P2)")
    g.add_argument("--output", type=Path, default=Path("outputs/eval/passk.json"), help="summary JSON path")
    g.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue <output>.episodes.jsonl: finished episodes kept, aborted ones retried")
    add_submission_args(p)
    add_config_args(p)
    return p


def _csv(text: str) -> list[str]:
    return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


def _safe_url(url: str | None) -> str | None:
    """A URL without user:password@ (never write credentials into a result)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


# ---------------------------------------------------------------------------------------------------
# The plan: which (domain, task, sample) episodes this run owes

@dataclass
class Plan:
    tasks: dict[str, list[Any]]  # domain -> tau2 tasks, in tau2's order
    num_samples: int

    def episodes(self) -> list[tuple[str, Any, int]]:
        """(domain, task, sample) for every episode the run owes, in a stable order."""
        return [(d, t, s) for d, ts in self.tasks.items() for t in ts for s in range(self.num_samples)]

    def keys(self) -> list[Key]:
        return [(d, t.id, s) for d, t, s in self.episodes()]


def make_plan(domains: Sequence[str], split: str, task_ids: Sequence[str] | None, num_samples: int) -> Plan:
    """Tasks per domain; unknown domains, splits and task ids are one-line TaskLookupErrors."""
    if not domains:
        raise TaskLookupError("--domains is empty; pass e.g. airline,retail,telecom")
    if num_samples < 1:
        raise TaskLookupError(f"--num-samples must be >= 1, got {num_samples}")
    tasks = {d: load_tasks(d, check_split(d, split)) for d in domains}
    if task_ids:
        known = {t.id for ts in tasks.values() for t in ts}
        unknown = [i for i in task_ids if i not in known]
        if unknown:
            raise TaskLookupError(f"unknown task id(s) {', '.join(map(repr, unknown))} in "
                                  f"{', '.join(domains)} / split {split!r}")
        tasks = {d: [t for t in ts if t.id in task_ids] for d, ts in tasks.items()}
        empty = [d for d, ts in tasks.items() if not ts]
        if empty:
            raise TaskLookupError(f"none of --task-ids is in domain(s) {', '.join(empty)}; drop them from --domains")
    return Plan(tasks, num_samples)


# Settings that change what an episode produces: a resumed run must match them (the episode file header).
EPISODE_SETTINGS = ("backend", "model", "tokenizer", "user", "user_model", "user_temperature", "task_split",
                    "sampling", "seed", "max_turns", "max_steps", "max_errors", "max_context_len", "partial", "judge")


def judge_settings(plan: Plan, cfg: Tau2Config) -> dict[str, Any] | None:
    """The NL-assertion judge a run's rewards depend on (tau2 1.0.1 retail), or None when no planned task has one."""
    if not any(needs_judge(t) for ts in plan.tasks.values() for t in ts):
        return None
    public = judge.JudgeSettings.from_config(cfg).public()
    return {**public, "api_base": _safe_url(public["api_base"])}


def run_settings(args: argparse.Namespace, cfg: Tau2Config, sampling: SamplingParams, model: str,
                 tokenizer: str, plan: Plan) -> dict[str, Any]:
    llm = args.user == "llm"
    user_args = {k: v for k, v in llm_user_args(cfg).items() if k != "api_key"} if llm else None
    if user_args and "api_base" in user_args:
        user_args["api_base"] = _safe_url(user_args["api_base"])
    return {
        "benchmark": benchmark_id(plan.tasks, cfg.retrieval_variant), "judge": judge_settings(plan, cfg),
        "backend": args.backend, "model": model, "tokenizer": tokenizer, "sglang_url": _safe_url(args.sglang_url),
        "user": args.user, "user_model": cfg.user_model if llm else None,
        "user_api_base": _safe_url(cfg.user_api_base) if llm else None, "user_llm_args": user_args,
        "user_temperature": cfg.user_temperature if llm else None,
        "user_client": user_client_kind(cfg) if llm else None,  # informational: both send the same requests
        "domains": list(args.domain_list), "task_split": args.task_split, "task_ids": args.task_id_list,
        "num_samples": args.num_samples,
        "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                     "max_new_tokens": sampling.max_new_tokens, "stop_token_ids": list(sampling.stop_token_ids)},
        "seed": args.seed, "max_turns": cfg.max_turns, "max_steps": cfg.max_steps, "max_errors": cfg.max_errors,
        "max_context_len": cfg.max_context_len, "concurrency": args.concurrency, "procs": args.procs,
        "partial": {"weights": list(cfg.partial_weights), "telecom_weights": list(cfg.telecom_partial_weights),
                    "use_telecom_weights": cfg.use_telecom_weights},
    }


# ---------------------------------------------------------------------------------------------------
# Running

async def _evaluate(pending: Sequence[tuple[str, Any, int]], args: argparse.Namespace, setup: dict[str, Any],
                    cfg: Tau2Config, sampling: SamplingParams, on_done: Callable[[dict], None]) -> None:
    common = dict(tokenizer=setup["tokenizer"], user_factory=setup["user_factory"], sampling=sampling, cfg=cfg,
                  seed=args.seed, concurrency=args.concurrency, on_done=on_done)
    if args.backend == "sglang":
        await run_episodes_on_sglang(args.sglang_url, pending, **common)
    else:
        await run_episodes(pending, engine=setup["engine"], **common)


# ---------------------------------------------------------------------------------------------------
# Setup: every check that can fail runs before anything is written

def output_paths(output: Path, domains: Sequence[str]) -> dict[str, Any]:
    stem = output.with_suffix("") if output.suffix == ".json" else output
    return {"summary": output, "episodes": output.with_name(output.name + ".episodes.jsonl"),
            "chart": stem.with_name(stem.name + ".png"),
            "tau2": {d: stem.with_name(f"{stem.name}.{d}.tau2.json") for d in domains}}


def resolve_policy(args: argparse.Namespace) -> dict[str, Any]:
    """Where the policy runs and its tokenizer, checked (the server answers, the files exist) but not yet loaded:
    loading weights is the slow part, and a run refused for other reasons should not wait for it."""
    if args.backend == "local":
        source = args.model or args.hf_checkpoint
        if not source:
            raise SetupError("--backend local needs --model DIR (or --hf-checkpoint DIR_OR_HUB_ID)")
        flag = "--model" if args.model else "--hf-checkpoint"
        model_dir = backends.resolve_checkpoint(source, tokenizer_only=False, flag=flag)
        backends.check_model_dir(model_dir, flag)
        device = backends.resolve_device(args.device)
        tok_source, tok_flag = (args.tokenizer, "--tokenizer") if args.tokenizer else (str(model_dir), flag)
    else:
        if not args.sglang_url:
            raise SetupError("--backend sglang needs --sglang-url URL of a running SGLang server "
                             "(or use --backend local --model DIR)")
        source = args.tokenizer or args.hf_checkpoint
        if not source:
            raise SetupError("--backend sglang needs --hf-checkpoint (the served checkpoint, for its tokenizer)")
        backends.check_sglang(args.sglang_url)
        model_dir, device = None, None
        tok_source, tok_flag = source, ("--tokenizer" if args.tokenizer else "--hf-checkpoint")
    tokenizer = backends.load_tokenizer(
        backends.resolve_checkpoint(tok_source, tokenizer_only=True, flag=tok_flag), tok_flag)
    return {"tokenizer": tokenizer, "model_dir": model_dir, "device": device, "flag": flag if model_dir else None,
            "model": args.hf_checkpoint or source, "tokenizer_name": args.tokenizer or source}


def prepare(args: argparse.Namespace) -> tuple[Plan, Tau2Config, SamplingParams, dict[str, Any]]:
    """Everything that can be checked before writing: raises ConfigError, TaskLookupError, UserConfigError,
    SetupError or ValueError, each with a one-line message."""
    cfg = config_from_args(args)
    args.domain_list = _csv(args.domains)
    args.task_id_list = _csv(args.task_ids) if args.task_ids else None
    if args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.procs < 1 or args.procs > args.concurrency:
        raise ValueError(f"--procs must be between 1 and --concurrency ({args.concurrency}), got {args.procs}")
    if args.procs > 1 and args.backend != "sglang":
        raise ValueError("--procs > 1 needs --backend sglang (the local engine lives in one process)")
    if args.output.is_dir():
        raise ValueError(f"--output {args.output} is a directory; pass a file path such as {args.output}/passk.json")
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens)  # bad values: one-line error
    plan = make_plan(args.domain_list, args.task_split, args.task_id_list, args.num_samples)
    if args.submission is not None:
        check_submittable(VERSION, list(plan.tasks))  # SubmissionError: 26.3, or no leaderboard domain
    check_retrieval_variant(list(plan.tasks), cfg.retrieval_variant)  # banking_knowledge: RetrievalVariantError
    user_factory = make_user_factory(args.user, cfg)  # llm without an API key: UserConfigError
    if judge_settings(plan, cfg) is not None:
        judge.check_judge(cfg)  # a remote judge without an API key: JudgeConfigError
    setup = resolve_policy(args)
    setup["user_factory"] = user_factory
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.max_new_tokens,
                              stop_token_ids=backends.stop_token_ids(setup["tokenizer"]))
    return plan, cfg, sampling, setup


# ---------------------------------------------------------------------------------------------------
# Outputs

def build_summary(metrics: dict[str, Any], settings: dict[str, Any], records: Sequence[dict],
                  outside_plan: int, paths: dict[str, Any], ran: int, wall_s: float) -> dict[str, Any]:
    aborted = [{k: r[k] for k in ("domain", "task_id", "sample", "termination_reason", "error")}
               for r in records if r["status"] == "aborted"]
    usage = judge.JudgeUsage()
    for r in records:
        usage.add(judge.JudgeUsage(**r.get("judge", {})))
    return {
        "format": "tau2_rl_pipeline.eval_passk/1",
        "benchmark": settings["benchmark"],
        "settings": settings,
        "judge": {"settings": settings["judge"], "usage_over_recorded_episodes": usage.to_dict()},
        "episodes": {"file": str(paths["episodes"]), "planned": len(records), "ran_this_invocation": ran,
                     "aborted": aborted, "outside_plan_not_counted": outside_plan},
        "metrics": metrics,
        "outputs": {"chart": str(paths["chart"]), "tau2_results": {d: str(p) for d, p in paths["tau2"].items()}},
        "wall_s": wall_s,
    }


def write_outputs(summary: dict[str, Any], records: Sequence[dict], plan: Plan, paths: dict[str, Any],
                  secrets: Sequence[str]) -> None:
    from eval.report import render_chart
    from eval.tau2_results import results_info, results_json, tau2_results

    settings = summary["settings"]
    for domain, tasks in plan.tasks.items():
        results = tau2_results(domain, records, tasks, results_info(domain, settings, plan.num_samples))
        atomic_write_text(paths["tau2"][domain], results_json(results, settings["benchmark"]), secrets)
    render_chart(summary, paths["chart"])
    atomic_write_text(paths["summary"], json.dumps(summary, indent=2) + "\n", secrets)  # last: the run is done


def remove_stale(paths: dict[str, Any]) -> None:
    """Results of an earlier run at this --output must not outlive a run that fails before writing new ones."""
    for path in (paths["summary"], paths["chart"], *paths["tau2"].values()):
        path.unlink(missing_ok=True)


def print_report(console: Any, summary: dict[str, Any]) -> None:
    from eval.report import failures_table, metrics_table

    s = summary["settings"]
    title = (f"Pass@k: {s['model']} on {', '.join(s['domains'])} ({s['task_split']}), user {s['user']}, "
             f"tau2 {s['benchmark']['tau2_version']}")
    console.print(metrics_table(summary["metrics"], title))
    console.print(failures_table(summary["metrics"]))
    used = summary["judge"]["usage_over_recorded_episodes"]
    if summary["judge"]["settings"] is not None:
        console.print(f"NL-assertion judge {summary['judge']['settings']['model']}: {used['calls']} calls, "
                      f"{used['failed_attempts']} failed attempts, {used['prompt_tokens']} prompt + "
                      f"{used['completion_tokens']} completion tokens")
    if summary["episodes"]["aborted"]:
        console.print(f"{len(summary['episodes']['aborted'])} aborted episodes (infrastructure failures) are "
                      "left out of every metric; a rerun with the same --output retries them.")


# ---------------------------------------------------------------------------------------------------
# Main

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


def finish(plan: Plan, settings: dict[str, Any], log: EpisodesFile, done: dict[Key, dict], new: list[dict],
           paths: dict[str, Any], secrets: Sequence[str], wall_s: float, args: argparse.Namespace) -> int:
    """Metrics over the planned episodes, then every output (the summary last: its presence means done)."""
    from tau2_rl_pipeline.metrics import summarize

    merged = pick_records([*done.values(), *new])
    if log.lines > len(merged):  # retried aborted episodes left superseded lines: keep one per episode
        log.compact(merged.values())
    keys = plan.keys()
    records = [merged[k] for k in keys]
    try:
        metrics = summarize(records, seed=BOOTSTRAP_SEED)
    except ValueError as e:  # e.g. every episode aborted: no metric exists
        first = next((r["error"] for r in records if r["error"]), "")
        print(f"error: {e} (first error: {first}); fix the cause and rerun with the same --output", file=sys.stderr)
        return 1
    summary = build_summary(metrics, settings, records, len(merged) - len(keys), paths, len(new), wall_s)
    write_outputs(summary, records, plan, paths, secrets)
    print_report(Console(), summary)
    print(f"summary {paths['summary']}\nepisodes {paths['episodes']}\nchart {paths['chart']}\ntau2 results "
          + " ".join(str(p) for p in paths["tau2"].values()))
    if args.submission is not None:
        return submit(args, summary, paths, secrets)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        plan, cfg, sampling, setup = prepare(args)
        settings = run_settings(args, cfg, sampling, setup["model"], setup["tokenizer_name"], plan)
        paths = output_paths(args.output, list(plan.tasks))
        secrets = secret_values()
        log = EpisodesFile(paths["episodes"], {k: settings[k] for k in EPISODE_SETTINGS},
                           benchmark=settings["benchmark"], secrets=secrets)
        done = log.load() if args.resume else {}
        if setup["model_dir"] is not None:  # the slow part, once nothing else can refuse the run
            setup["engine"] = backends.load_local_engine(setup["model_dir"], setup["tokenizer"], setup["device"],
                                                         setup["flag"])
    except (ConfigError, TaskLookupError, UserConfigError, judge.JudgeConfigError, SetupError, EpisodesFileError,
            SubmissionError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    remove_stale(paths)
    t0 = time.perf_counter()
    finished = {k: r for k, r in done.items() if r["status"] != "aborted"}  # aborted ones run again
    pending = [(d, t, s) for d, t, s in plan.episodes() if (d, t.id, s) not in finished]
    planned = set(plan.keys())
    progress, advance = _progress(Console(stderr=True), len(planned),
                                  {k: r for k, r in finished.items() if k in planned})
    new: list[dict] = []

    def on_done(rec: dict) -> None:
        log.append(rec)  # durable before anything else
        new.append(rec)
        advance(rec)

    log.open_for_append(discard=not args.resume)
    try:
        with progress, settled():  # the rollout's GC policy (tau2_rl_pipeline/gc_policy.py)
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
    return finish(plan, settings, log, done, new, paths, secrets, time.perf_counter() - t0, args)


if __name__ == "__main__":
    sys.exit(main())
