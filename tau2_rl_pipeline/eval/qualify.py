"""tau2-rl-qualify-user: how often does a user simulator sink a perfect agent?

    tau2-rl-qualify-user --user scripted --domains mock,airline,retail,telecom --output outputs/qualify/scripted.json
    TAU2_USER_MODEL=openai/Qwen/Qwen3-8B TAU2_USER_API_BASE=http://127.0.0.1:30001/v1 \
        tau2-rl-qualify-user --user llm --domains telecom --num-samples 4 --output outputs/qualify/qwen3-8b.json

The oracle agent (benchmark/oracle_play.py: it asks for the facts the gold actions need that the scenario states and
checks each answer, then plays tau2's gold actions in order, device steps asked for, the closing message) plays every
task x --num-samples against the user simulator the evaluator and the GRPO rollout would use (--user scripted, or
llm: tau2's user over litellm or the asynchronous client, an SGLang user server included, as TAU2_USER_* say). The
agent is perfect, so every failure is the simulator's or the task's, and the user-side monitors
(benchmark/user_monitors.py) flag a misbehaving user even in an episode that scored 1.0: per domain, the rate of bad
(failed or flagged) episodes with a 95% bootstrap CI over tasks, broken down by cause, and apart from it the tasks
set aside: those that fail under every simulator (every --against run too) and again when their gold actions are
replayed without a user: a task fault, or, for a task that gives no gold actions at all (mock's
update_task_with_history_and_env_assertions: an agent that completes the task scores 1.0), a task the oracle
cannot play. Each failing task is replayed once, one after another, which makes a failing user's run slower than a
good one's (a second or so per airline task); the replays stop as soon as the verdict is settled (the failure rate
is over the bound even if every task not yet replayed were set aside), and the tasks left unreplayed count as the
user's failures. Per domain it also shows the user's words per message beside the reference user's (the scripted
user on the same tasks): a long-winded user is not refused, since the rewards stay right, but its messages fill the
policy's context. Writes the evaluator's files (<output>, <output>.episodes.jsonl, <stem>.<domain>.tau2.json) and
prints a one-screen verdict: QUALIFIED when the rate over all tasks but those set aside is at most
--max-failure-rate.
scripts/train_grpo.sh can require it (GRPO_USER_QUALIFICATION, GRPO_MAX_USER_FAILURE_RATE: `--check`, which
eval/qualify_gate.py runs against the whole user configuration, tau2 version, domains and splits of the run).
Exit codes: 0 qualified, 1 not qualified, 2 bad setup (nothing written).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tau2.data_model.tasks import Task
from tau2.utils.utils import get_now

import tau2_rl_pipeline  # noqa: F401  (offline litellm and quiet tau2 logging before tau2 loads)
from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.episode import Episode, UserSideError, build_environment
from tau2_rl_pipeline.benchmark.oracle import gold_actions, replay_gold_actions
from tau2_rl_pipeline.benchmark.oracle_play import CAUSES, aplay, episode_causes, last_user_text, play
from tau2_rl_pipeline.benchmark.scenario import scenario_of
from tau2_rl_pipeline.benchmark.tasks import TaskLookupError
from tau2_rl_pipeline.benchmark.tau2_version import benchmark_id, needs_judge
from tau2_rl_pipeline.benchmark.user_monitors import user_monitors
from tau2_rl_pipeline.benchmark.users import ScriptedUser, UserConfigError, make_user_factory
from tau2_rl_pipeline.config import ConfigError, config_from_args
from tau2_rl_pipeline.eval.args import csv_list
from tau2_rl_pipeline.eval.episodes_file import EpisodesFile, atomic_write_text, read_episodes, secret_values
from tau2_rl_pipeline.eval.plan import make_plan, output_paths
from tau2_rl_pipeline.eval.qualify_cli import main  # noqa: F401  (python -m runs it; its parser is light)
from tau2_rl_pipeline.eval.qualify_gate import FORMAT, QualificationError, check, run_scope, user_settings
from tau2_rl_pipeline.eval.runner import episode_seed
from tau2_rl_pipeline.eval.tau2_results import results_info, results_json, tau2_results
from tau2_rl_pipeline.files import unwritable_reason
from tau2_rl_pipeline.http_post import first_unreachable
from tau2_rl_pipeline.metrics import bootstrap_ci, is_success

MAX_EXAMPLES = 5
TASK_FAULT = "task fault"  # its own gold actions, replayed without a user, fail its check
ORACLE_CANNOT_PLAY = "oracle cannot play"  # it gives no gold actions, and its check wants the state changed
LONG_WINDED = 5.0  # words per message, as a multiple of the reference user's, from which the report says so

# ---------------------------------------------------------------------------------------------------
# Pure: records -> failure rates, causes, tasks set aside, verdict

def failing_tasks(records: Sequence[dict]) -> set[tuple[str, str]]:
    """(domain, task id) of the tasks whose every scored episode failed."""
    outcomes: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in records:
        if r["status"] != "aborted":
            outcomes[(r["domain"], r["task_id"])].append(is_success(r["reward"]))
    return {key for key, wins in outcomes.items() if not any(wins)}


def bad_episode(record: dict) -> bool:
    """Failed, or flagged by a user-side cause although it scored 1.0."""
    return not is_success(record["reward"]) or bool(record.get("qualify_cause"))


def failure_rate(records: Sequence[dict]) -> dict[str, Any]:
    """Share of bad (failed or flagged) scored episodes with its 95% bootstrap CI over tasks (an episode-level rate
    whose uncertainty comes from which tasks were drawn, as metrics.bootstrap_ci with episode weights)."""
    by_task: dict[tuple[str, str], list[bool]] = defaultdict(list)
    for r in records:
        by_task[(r["domain"], r["task_id"])].append(bad_episode(r))
    if not by_task:
        return {"value": None, "ci": None, "failed": 0, "n_episodes": 0, "n_tasks": 0}
    rates = [sum(f) / len(f) for f in by_task.values()]
    weights = [len(f) for f in by_task.values()]
    failed = sum(sum(f) for f in by_task.values())
    lo, hi = bootstrap_ci(rates, weights=weights)
    return {"value": failed / sum(weights), "ci": [lo, hi], "failed": failed, "n_episodes": sum(weights),
            "n_tasks": len(by_task)}


def settled(records: Sequence[dict], unsure: set[tuple[str, str]], max_failure_rate: float) -> bool:
    """Whether the verdict is NOT QUALIFIED whichever of the `unsure` tasks are set aside: the failure rate without
    all of them is already over the bound (a task left in whose every episode failed only raises it)."""
    rest = failure_rate([r for r in records if r["status"] != "aborted" and (r["domain"], r["task_id"]) not in unsure])
    return rest["value"] is not None and rest["value"] > max_failure_rate


def mean_words(records: Sequence[dict]) -> float | None:
    said = [r["user_monitors"].get("user_mean_words", 0.0) for r in records if r.get("user_monitors")]
    return sum(said) / len(said) if said else None


def qualification(records: Sequence[dict], set_aside: Mapping[tuple[str, str], str], max_failure_rate: float,
                  not_replayed: Iterable[tuple[str, str]] = (),
                  reference_words: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Per domain and overall: failure rate over the tasks not set aside, the causes of those failures (episodes,
    example task ids), the tasks set aside by why (TASK_FAULT, ORACLE_CANNOT_PLAY), the failing tasks never replayed
    (counted as failures), the user's words per message and the reference user's; the verdict against
    `max_failure_rate`."""
    scored = [r for r in records if r["status"] != "aborted"]
    skipped = set(not_replayed)
    domains: dict[str, Any] = {}
    for domain in sorted({r["domain"] for r in records}):
        mine = [r for r in scored if r["domain"] == domain]
        kept = [r for r in mine if (domain, r["task_id"]) not in set_aside]
        causes = {}
        for cause in CAUSES:
            hits = [r["task_id"] for r in kept if r["qualify_cause"] == cause]
            if hits:
                causes[cause] = {"episodes": len(hits), "example_task_ids": list(dict.fromkeys(hits))[:MAX_EXAMPLES]}
        domains[domain] = {
            "failure_rate": failure_rate(kept), "causes": causes,
            "task_faults": sorted(t for (d, t), why in set_aside.items() if d == domain and why == TASK_FAULT),
            "oracle_cannot_play": sorted(t for (d, t), why in set_aside.items()
                                         if d == domain and why == ORACLE_CANNOT_PLAY),
            "not_replayed": sorted(t for d, t in skipped if d == domain),
            "user_words_per_message": mean_words(kept),
            "reference_words_per_message": (reference_words or {}).get(domain),
            "aborted": sum(r["domain"] == domain and r["status"] == "aborted" for r in records)}
    overall = failure_rate([r for r in scored if (r["domain"], r["task_id"]) not in set_aside])
    qualified = overall["value"] is not None and overall["value"] <= max_failure_rate
    return {"domains": domains, "overall": overall, "max_failure_rate": max_failure_rate, "qualified": qualified}


def verdict_lines(result: dict[str, Any], user: str) -> list[str]:
    """The one-screen verdict: per domain the failure rate, its causes, the tasks set aside and the user's message
    length, then QUALIFIED or not."""
    def rate(entry: dict[str, Any]) -> str:
        if entry["value"] is None:
            return "no scored episode"
        lo, hi = entry["ci"]
        return (f"{entry['failed']}/{entry['n_episodes']} episodes = {entry['value']:.3f} [95% CI {lo:.3f}, {hi:.3f}]"
                f" over {entry['n_tasks']} tasks")

    lines = [f"User simulator {user}, played against the oracle agent (facts probed, gold actions, the closing "
             "message; failed or flagged episodes):"]
    for domain, d in result["domains"].items():
        lines.append(f"  {domain}: failure {rate(d['failure_rate'])}"
                     + (f", {d['aborted']} aborted (infrastructure, not counted)" if d["aborted"] else ""))
        for cause, c in d["causes"].items():
            lines.append(f"    {cause}: {c['episodes']} episodes, e.g. {', '.join(c['example_task_ids'])}")
        if d["task_faults"]:
            lines.append(f"    task faults (fail under every simulator, gold replay included; not counted): "
                         f"{', '.join(d['task_faults'])}")
        if d.get("oracle_cannot_play"):
            lines.append(f"    the oracle cannot play (no gold actions to play; fail under every simulator; not "
                         f"counted): {', '.join(d['oracle_cannot_play'])}")
        if d.get("not_replayed"):
            lines.append(f"    failing tasks not replayed (the verdict was settled without them; counted as the "
                         f"user's failures): {len(d['not_replayed'])}")
        lines += length_lines(d)
    overall = result["overall"]
    verdict = "QUALIFIED" if result["qualified"] else "NOT QUALIFIED"
    lines.append(f"{verdict}: failure {rate(overall)} (tasks set aside apart) vs at most {result['max_failure_rate']}")
    return lines


def length_lines(domain: Mapping[str, Any]) -> list[str]:
    """The user's words per message beside the reference user's, and a note when it is LONG_WINDED times longer."""
    mine, reference = domain.get("user_words_per_message"), domain.get("reference_words_per_message")
    if mine is None:
        return []
    if not reference:
        return [f"    user words per message: {mine:.1f}"]
    ratio = mine / reference
    lines = [f"    user words per message: {mine:.1f} (the reference scripted user on these tasks: {reference:.1f}; "
             f"{ratio:.1f}x)"]
    if ratio >= LONG_WINDED:
        lines.append(f"    note: {ratio:.0f}x the reference user's length: not refused (the oracle's episodes and "
                     "their rewards are right), but each message fills the policy's context")
    return lines


# ---------------------------------------------------------------------------------------------------
# Running the oracle against the user simulator

def record(domain: str, task: Any, sample: int, seed: int, episode: Episode, notes: Any, reward_info: Any,
           error: str | None, started: str, ended: str, seconds: float) -> dict[str, Any]:
    """One oracle episode in the evaluator's record format (tau2_results and the episodes file read it)."""
    aborted = error is not None
    reason = episode.termination_reason.value if episode.termination_reason else "max_steps"
    reward = float(reward_info.reward) if reward_info is not None else 0.0
    users = user_monitors(episode.messages, scenario_of(task), reason)
    causes = [] if aborted else episode_causes(notes, users, len(gold_actions(task)), reason,
                                               last_user_text(episode), is_success(reward))
    return {
        "domain": domain, "task_id": task.id, "sample": sample, "seed": seed,
        "status": "aborted" if aborted else "completed", "reward": reward, "partial": 0.0,
        "termination_reason": "user_simulator_error" if aborted else reason, "turns": 0, "parse_errors": 0,
        "refused_calls": episode.refused_calls, "unknown_tool_calls": 0, "user_tool_calls_by_agent": 0,
        "refused_call_ids": sorted(episode.refused_call_ids), "error": error, "timings": {"total_s": seconds},
        "started_at": started, "ended_at": ended,
        "qualify_cause": causes[0] if causes else None, "qualify_causes": causes, "user_monitors": users,
        "oracle": None if notes is None else {"probed": notes.probed, "wrong_facts": notes.wrong_facts,
                                              "lingered": notes.lingered},
        "reward_info": reward_info.model_dump(mode="json") if reward_info is not None else None,
        "messages": [m.model_dump(mode="json") for m in episode.messages],
    }


async def run_oracle(pending: Sequence[tuple[str, Any, int]], user_factory: Any, cfg: Any, seed: int,
                     concurrency: int) -> list[dict]:
    """Every (domain, task, sample) oracle episode, at most `concurrency` at once; a user simulator that fails for
    good (UserSideError) makes an aborted record, as in the evaluator."""
    if any(needs_judge(task) for _, task, _ in pending):
        judge.configure(cfg)  # tau2 1.0.1's NL assertions: this run's judge, as the rollout does
    gate = asyncio.Semaphore(concurrency)

    async def one(domain: str, task: Any, sample: int) -> dict:
        async with gate:
            ep_seed = episode_seed(seed, domain, task.id, sample)
            started, t0 = get_now(), time.perf_counter()
            episode = oracle_episode(domain, task, user_factory, cfg)
            episode.user.set_seed(ep_seed)
            notes, reward_info, error = None, None, None
            try:
                if callable(getattr(episode.user, "agenerate_next_message", None)):
                    notes = await aplay(episode)
                else:
                    notes = await asyncio.to_thread(play, episode)
                reward_info = await asyncio.to_thread(episode.evaluate)
            except (UserSideError, judge.JudgeError) as e:  # infrastructure: aborted, never counted
                error = str(e)
            return record(domain, task, sample, ep_seed, episode, notes, reward_info, error, started, get_now(),
                          time.perf_counter() - t0)

    try:
        return list(await asyncio.gather(*(one(d, t, s) for d, t, s in pending)))
    finally:
        closing = getattr(user_factory, "aclose", None)
        if closing is not None:
            await closing()


def oracle_episode(domain: str, task: Any, user_factory: Any, cfg: Any) -> Episode:
    """A fresh episode of `task` with the user `user_factory(task, environment)` makes, as the run configures it."""
    environment = build_environment(domain, cfg.fast_env, task=task, retrieval_variant=cfg.retrieval_variant)
    return Episode(domain, task, user_factory(task, environment), max_steps=cfg.max_steps, max_errors=cfg.max_errors,
                   environment=environment, fast=cfg.fast_env, retrieval_variant=cfg.retrieval_variant)


def reference_words(plan_tasks: Mapping[str, Sequence[Any]], cfg: Any) -> dict[str, float]:
    """The reference user's mean words per message per domain: the scripted user against the oracle, one episode
    per task, not scored (tau2's evaluator is the slow part, and only the user's words are wanted)."""
    out = {}
    for domain, tasks in plan_tasks.items():
        said = []
        for task in tasks:
            episode = oracle_episode(domain, task, lambda task, environment: ScriptedUser(task), cfg)
            play(episode)
            said.append(user_monitors(episode.messages, scenario_of(task), "")["user_mean_words"])
        out[domain] = sum(said) / len(said) if said else 0.0
    return out


def set_aside_tasks(plan_tasks: Mapping[str, Sequence[Any]], failing: set[tuple[str, str]], records: Sequence[dict],
                    max_failure_rate: float | None) -> tuple[dict[tuple[str, str], str], list[tuple[str, str]]]:
    """Of the tasks failing here, those whose user-free gold replay (benchmark/oracle.py) fails as well, each with
    why (ORACLE_CANNOT_PLAY when the task gives no gold actions, else TASK_FAULT), replayed one by one until the
    verdict against `max_failure_rate` is settled (`settled`; None: every one); and the failing tasks left
    unreplayed then."""
    by_id = {(d, t.id): t for d, ts in plan_tasks.items() for t in ts}
    aside: dict[tuple[str, str], str] = {}
    pending = sorted(failing)
    while pending and not (max_failure_rate is not None
                           and settled(records, set(pending) | set(aside), max_failure_rate)):
        key = pending.pop(0)
        if gold_replay_fails(key[0], by_id[key].model_dump_json()):
            aside[key] = TASK_FAULT if gold_actions(by_id[key]) else ORACLE_CANNOT_PLAY
    return aside, pending


@functools.cache
def gold_replay_fails(domain: str, task_json: str) -> bool:
    """Whether the task's gold actions, replayed without a user, fail its check (once per task and process: the
    replay does not depend on the user)."""
    return not is_success(replay_gold_actions(domain, Task.model_validate_json(task_json)).reward)


# ---------------------------------------------------------------------------------------------------
# Command line

def run(args: argparse.Namespace) -> int:
    """The qualification (or, with --check, the gate) the parsed command line asks for (qualify_cli.py parses it)."""
    try:
        cfg = config_from_args(args)
        if args.check is not None:
            scope = run_scope(args.run_tasks, csv_list(args.domains), args.task_split)
            print(check(args.check, args.max_failure_rate, cfg, scope))
            return 0
        problem = unwritable_reason(args.output)
        if problem:
            raise ValueError(f"--output {args.output}: {problem}")
        domains = csv_list(args.domains)
        plan = make_plan(domains, args.task_split, csv_list(args.task_ids) if args.task_ids else None,
                         args.num_samples)
        user_factory = make_user_factory(args.user, cfg)
        down = first_unreachable(cfg.user_api_base) if args.user == "llm" and cfg.user_api_base else None
        if down:  # else every episode's every request retries before failing (2000 lines, minutes)
            raise UserConfigError(f"no user simulator answers at {down}: start it (scripts/start_user_sim.sh) or "
                                  "point TAU2_USER_API_BASE at one; nothing written")
        if any(needs_judge(t) for ts in plan.tasks.values() for t in ts):
            judge.check_judge(cfg)  # a remote judge without an API key: one line, before anything runs
        others = [read_episodes(output_paths(p, [])["episodes"]).values() for p in args.against]
    except (ConfigError, TaskLookupError, UserConfigError, judge.JudgeConfigError, QualificationError, ValueError,
            OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, QualificationError) else 2
    if args.output.exists():
        print(f"note: {args.output} holds an earlier qualification; this run replaces it when it finishes "
              "(--output elsewhere keeps it)", file=sys.stderr)
    records = asyncio.run(run_oracle(plan.episodes(), user_factory, cfg, args.seed, args.concurrency))
    failing = failing_tasks(records)
    for other in others:
        failing &= failing_tasks(list(other))
    aside, unreplayed = set_aside_tasks(plan.tasks, failing, records, args.max_failure_rate)
    reference = None if args.user == "scripted" else reference_words(plan.tasks, cfg)
    result = qualification(records, aside, args.max_failure_rate, unreplayed, reference)
    write_outputs(args, cfg, plan, records, result)
    print("\n".join(verdict_lines(result, args.user if args.user == "scripted" else cfg.user_model)))
    return 0 if result["qualified"] else 1


def write_outputs(args: argparse.Namespace, cfg: Any, plan: Any, records: list[dict], result: dict) -> None:
    """The evaluator's files: the episodes, tau2's results per domain, the summary last."""
    paths = output_paths(args.output, list(plan.tasks))
    secrets = secret_values()
    settings = {"benchmark": benchmark_id(plan.tasks, cfg.retrieval_variant), "model": "oracle (gold actions)",
                **user_settings(args.user, cfg), "user_llm_args": None,
                "domains": list(plan.tasks), "task_split": args.task_split, "num_samples": args.num_samples,
                "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 0},
                "seed": args.seed, "max_steps": cfg.max_steps, "max_errors": cfg.max_errors}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    log = EpisodesFile(paths["episodes"], {"seed": args.seed, "user": args.user}, benchmark=settings["benchmark"],
                       secrets=secrets)
    log.open_for_append(discard=True)
    for r in records:
        log.append(r)
    log.close()
    for domain, tasks in plan.tasks.items():
        results = tau2_results(domain, records, tasks, results_info(domain, settings, plan.num_samples))
        atomic_write_text(paths["tau2"][domain], results_json(results, settings["benchmark"]), secrets)
    summary = {"format": FORMAT, "settings": settings, "qualification": result,
               "outputs": {"episodes": str(paths["episodes"]),
                           "tau2_results": {d: str(p) for d, p in paths["tau2"].items()}}}
    atomic_write_text(paths["summary"], json.dumps(summary, indent=2) + "\n", secrets)


if __name__ == "__main__":
    sys.exit(main())
