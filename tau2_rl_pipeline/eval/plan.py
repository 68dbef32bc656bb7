"""Setting up an evaluation run, and every check that can refuse it, before anything is written.

Setting up an evaluation run: the episodes it owes (Plan), the settings that define its results, the policy
it runs, and every check that can refuse the run, all before anything is written."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, check_split, load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import VERSION, benchmark_id, check_retrieval_variant, needs_judge
from tau2_rl_pipeline.benchmark.users import llm_user_args, make_user_factory, user_client_kind
from tau2_rl_pipeline.config import Tau2Config, config_from_args
from tau2_rl_pipeline.eval import backends
from tau2_rl_pipeline.eval.args import csv_list, default_output
from tau2_rl_pipeline.eval.backends import SetupError
from tau2_rl_pipeline.eval.compare import USER_TRANSPORT_ARGS
from tau2_rl_pipeline.eval.episodes_file import Key
from tau2_rl_pipeline.eval.submission import check_submittable
from tau2_rl_pipeline.rollout.engines import SamplingParams


def _safe_url(url: str | None) -> str | None:
    """A URL (or a comma-separated list of them) without user:password@ (never write credentials into a result)."""
    if not url:
        return url
    safe = []
    for one in url.split(","):
        parts = urlsplit(one.strip())
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        safe.append(urlunsplit(parts._replace(netloc=netloc)))
    return ",".join(safe)


@dataclass
class Plan:
    tasks: dict[str, list[Any]]  # domain -> tau2 tasks, in tau2's order
    num_samples: int
    runs: int = 1  # --runs: run r owns samples r*num_samples .. (r+1)*num_samples - 1, each with its own seed

    @property
    def trials(self) -> int:
        """Episodes per task over all runs."""
        return self.num_samples * self.runs

    def episodes(self) -> list[tuple[str, Any, int]]:
        """(domain, task, sample) for every episode the run owes, in a stable order."""
        return [(d, t, s) for d, ts in self.tasks.items() for t in ts for s in range(self.trials)]

    def keys(self) -> list[Key]:
        return [(d, t.id, s) for d, t, s in self.episodes()]


def make_plan(domains: Sequence[str], split: str, task_ids: Sequence[str] | None, num_samples: int,
              runs: int = 1) -> Plan:
    """Tasks per domain; unknown domains, splits and task ids are one-line TaskLookupErrors."""
    if not domains:
        raise TaskLookupError("--domains is empty; pass e.g. airline,retail,telecom")
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
    return Plan(tasks, num_samples, runs)


# Settings that change what an episode produces: a resumed run must match them (the episode file header).
EPISODE_SETTINGS = ("backend", "model", "tokenizer", "user", "user_model", "user_temperature", "user_strategy",
                    "user_llm_args", "task_split", "sampling", "seed", "max_turns", "max_steps", "max_errors",
                    "max_context_len", "partial", "judge")


def episode_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The episode file header's settings (EPISODE_SETTINGS); of the user's LLM arguments only those that change
    its answers (compare.USER_TRANSPORT_ARGS say how it is reached, and may change on a resume)."""
    out = {k: settings[k] for k in EPISODE_SETTINGS}
    if out["user_llm_args"]:
        out["user_llm_args"] = {k: v for k, v in out["user_llm_args"].items() if k not in USER_TRANSPORT_ARGS}
    return out


def user_strategy(cfg: Tau2Config) -> dict[str, Any]:
    """TAU2_USER_STRATEGY with the checks it makes (verify and reflection regenerate up to max_checks times)."""
    if cfg.user_strategy in ("verify", "reflection"):
        return {"name": cfg.user_strategy, "max_checks": cfg.user_strategy_max_checks}
    return {"name": cfg.user_strategy}


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
        "user_strategy": user_strategy(cfg) if llm else None,
        "user_client": user_client_kind(cfg) if llm else None,  # informational: both send the same requests
        "domains": list(args.domain_list), "task_split": args.task_split, "task_ids": args.task_id_list,
        "num_samples": args.num_samples, "runs": args.runs,
        "sampling": {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k,
                     "max_new_tokens": sampling.max_new_tokens, "stop_token_ids": list(sampling.stop_token_ids)},
        "seed": args.seed, "max_turns": cfg.max_turns, "max_steps": cfg.max_steps, "max_errors": cfg.max_errors,
        "max_context_len": cfg.max_context_len, "concurrency": args.concurrency, "procs": args.procs,
        "partial": {"weights": list(cfg.partial_weights), "telecom_weights": list(cfg.telecom_partial_weights),
                    "use_telecom_weights": cfg.use_telecom_weights},
    }


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


def check_output(output: Path) -> None:
    """ValueError (one line) before any work when the summary cannot go there: a folder given, a file where a folder
    goes, a folder not writable. Nothing is created here (a refused run writes nothing)."""
    if output.is_dir():
        raise ValueError(f"--output {output} is a directory; pass a file path such as {output}/passk.json")
    existing = next(p for p in [output.parent, *output.parent.parents] if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--output {output}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK) or (output.exists() and not os.access(output, os.W_OK)):
        raise ValueError(f"--output {output}: {existing} is not writable; pass --output PATH in a folder you can "
                         "write")


def prepare(args: argparse.Namespace) -> tuple[Plan, Tau2Config, SamplingParams, dict[str, Any]]:
    """Everything that can be checked before writing: raises ConfigError, TaskLookupError, UserConfigError,
    SetupError or ValueError, each with a one-line message."""
    cfg = config_from_args(args)
    args.domain_list = csv_list(args.domains)
    args.task_id_list = csv_list(args.task_ids) if args.task_ids else None
    if args.procs > args.concurrency:  # each number's own bounds were checked as it was parsed (args.py)
        raise ValueError(f"--procs must be between 1 and --concurrency ({args.concurrency}), got {args.procs}")
    if args.procs > 1 and args.backend != "sglang":
        raise ValueError("--procs > 1 needs --backend sglang (the local engine lives in one process)")
    if args.output is None:
        args.output = default_output(args.model or args.hf_checkpoint, args.domain_list, args.task_split)
    check_output(args.output)
    plan = make_plan(args.domain_list, args.task_split, args.task_id_list, args.num_samples, args.runs)
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
