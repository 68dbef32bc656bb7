"""Running Pass@K episodes concurrently on one event loop, one record per episode as it ends.

Running Pass@K episodes: each (domain, task, sample) an independent tau2 episode with its own sampling seed,
at most `concurrency` in flight on one event loop, each turned into one episode record as it ends.

Framework-free: it knows the rollout and the engine interface, not the CLI or the files (eval_passk.py).
A record holds what `tau2_rl_pipeline.metrics.summarize` reads (domain, task_id, sample, status, reward,
partial, termination_reason, counters, turns) and what a person needs to look into the episode (tau2 messages,
reward_info, error, timings, token counts); never the token ids, which would make lines huge.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tau2.utils.utils import get_now

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.episode import build_environment
from tau2_rl_pipeline.benchmark.monitors import monitors
from tau2_rl_pipeline.benchmark.scenario import scenario_of
from tau2_rl_pipeline.benchmark.user_monitors import user_monitors
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.reward import partial_score
from tau2_rl_pipeline.rollout.engines import SamplingParams, SGLangEngine
from tau2_rl_pipeline.rollout.episode_loop import (
    Driver,
    EpisodeSpec,
    Trajectory,
    episode_threads,
    off_loop,
    run_episode,
    shared_executor,
)

logger = logging.getLogger("eval_passk")
EPISODE_ERROR = "episode_error"  # termination reason of an episode that raised (recorded as aborted)


def episode_seed(seed: int, domain: str, task_id: str, sample: int) -> int:
    """The sampling seed of one episode: a function of the run seed and the episode only (31 bits for SGLang)."""
    digest = hashlib.sha256(f"{seed}\0{domain}\0{task_id}\0{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def episode_record(traj: Trajectory, *, sample: int, seed: int, started_at: str, ended_at: str,
                   cfg: Tau2Config, monitors: dict[str, Any] | None = None) -> dict[str, Any]:
    """One finished episode as one JSON-ready record; partial is 0 for an episode with no tau2 evaluation;
    `monitors`: its behaviour monitors (benchmark/monitors.py)."""
    partial = partial_score(traj.reward_info, traj.domain, cfg)[0] if traj.reward_info is not None else 0.0
    return {
        "domain": traj.domain, "task_id": traj.task_id, "sample": sample, "seed": seed, "status": traj.status,
        "reward": traj.reward, "partial": partial, "termination_reason": traj.termination_reason,
        "turns": traj.turns, "parse_errors": traj.parse_errors, "refused_calls": traj.refused_calls,
        "unknown_tool_calls": traj.unknown_tool_calls, "user_tool_calls_by_agent": traj.user_tool_calls_by_agent,
        "refused_call_ids": list(traj.refused_call_ids), "error": traj.error,
        "tokens": {"prompt": len(traj.prompt_ids), "response": len(traj.response_ids),
                   "policy": sum(traj.loss_mask)},
        "timings": traj.timings, "started_at": started_at, "ended_at": ended_at, "judge": traj.judge,
        "monitors": monitors,
        "reward_info": traj.reward_info.model_dump(mode="json") if traj.reward_info is not None else None,
        "messages": [m.model_dump(mode="json") for m in traj.messages],
    }


def failed_record(domain: str, task_id: str, sample: int, seed: int, error: str, started_at: str,
                  ended_at: str, seconds: float) -> dict[str, Any]:
    """An episode that raised (e.g. tau2's evaluator on a broken task): aborted, out of the metrics."""
    return {
        "domain": domain, "task_id": task_id, "sample": sample, "seed": seed, "status": "aborted",
        "reward": 0.0, "partial": 0.0, "termination_reason": EPISODE_ERROR, "turns": 0, "parse_errors": 0,
        "refused_calls": 0, "unknown_tool_calls": 0, "user_tool_calls_by_agent": 0, "refused_call_ids": [],
        "error": error, "tokens": {"prompt": 0, "response": 0, "policy": 0}, "timings": {"total_s": seconds},
        "started_at": started_at, "ended_at": ended_at, "reward_info": None, "messages": [], "monitors": None,
    }


async def run_episodes(pending: Sequence[tuple[str, Any, int]], *, engine: Any, tokenizer: Any,
                       user_factory: Callable, sampling: SamplingParams, cfg: Tau2Config, seed: int,
                       concurrency: int, on_done: Callable[[dict], None]) -> None:
    """Run (domain, task, sample) episodes, at most `concurrency` at once; `on_done(record)` as each ends.

    An episode that raises (tau2's evaluator does on some broken tasks) becomes an aborted record with the error,
    and the others go on.
    """
    blocking_user = getattr(user_factory, "blocks", False)
    executor = shared_executor(episode_threads(cfg.episode_workers, cfg.fast_env, blocking_user,
                                               {d for d, _, _ in pending}))
    judge.configure_for(cfg, (task for _, task, _ in pending))  # tau2 1.0.1's NL assertions: this run's judge
    gate = asyncio.Semaphore(concurrency)

    async def one(domain: str, task: Any, sample: int) -> None:
        async with gate:
            ep_seed = episode_seed(seed, domain, task.id, sample)
            started, t0 = get_now(), time.perf_counter()
            try:
                environment = await off_loop(executor, lambda: build_environment(
                    domain, cfg.fast_env, task=task, retrieval_variant=cfg.retrieval_variant))
                spec = EpisodeSpec.from_config(domain, task, user_factory(task, environment), cfg,
                                               environment=environment)
                traj = await run_episode(spec, Driver.from_config(engine, tokenizer, replace(sampling, seed=ep_seed),
                                                                  cfg, executor=executor))
                record = episode_record(traj, sample=sample, seed=ep_seed, started_at=started, ended_at=get_now(),
                                        cfg=cfg, monitors=monitors(domain, task, traj.messages,
                                                                   traj.termination_reason))
            except Exception as e:  # noqa: BLE001 -- one broken episode is recorded, the others go on
                error = f"{type(e).__name__}: {e}".splitlines()[0][:500]
                record = failed_record(domain, task.id, sample, ep_seed, error, started, get_now(),
                                       time.perf_counter() - t0)
            if record["status"] != "aborted":  # the user simulator's side (benchmark/user_monitors.py)
                record["user_monitors"] = user_monitors(traj.messages, scenario_of(task), traj.termination_reason)
            if record["status"] == "aborted":
                logger.warning("aborted %s task %s sample %d: %s (%s)", domain, task.id, sample,
                               record["termination_reason"], record["error"])
            on_done(record)

    try:
        await asyncio.gather(*(one(d, t, s) for d, t, s in pending))
    finally:
        closing = getattr(user_factory, "aclose", None)  # the async user client's session belongs to this loop
        if closing is not None:
            await closing()


async def run_episodes_on_sglang(sglang_url: str, pending: Sequence[tuple[str, Any, int]], *, concurrency: int,
                                 cfg: Tau2Config, **kwargs: Any) -> None:
    """`run_episodes` against an SGLangEngine made and closed on this event loop (its HTTP session belongs to
    the loop), with at most `concurrency` requests in flight."""
    engine = SGLangEngine(sglang_url, max_in_flight=concurrency, max_retries=cfg.engine_max_retries,
                          timeout_s=cfg.engine_timeout_s)
    try:
        await run_episodes(pending, engine=engine, concurrency=concurrency, cfg=cfg, **kwargs)
    finally:
        await engine.aclose()
