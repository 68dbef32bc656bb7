"""Episodes over several rollout processes.

One Python process's CPU (tau2's environments and evaluation, the chat template and tokenizer, the HTTP client)
caps how many episodes it keeps moving, and its garbage collector pauses grow with the episodes it holds. With
`--procs N`, N processes each run 1/N of the episodes at 1/N of the concurrency against the same SGLang server
(bench/README.md, P2: two processes on 2 cores, airline at 2 s per call: 87.9% -> 94.1% of the engine-bound
ideal, max event-loop stall 102 -> 43 ms). Each sends a record to this process as its episode ends; this process
alone writes the episodes file, so resuming works as with one process.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue as queue_module
from collections.abc import Callable, Sequence
from typing import Any

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.engines import SamplingParams
from tau2_rl_pipeline.rollout.gc_policy import settle

POLL_S = 1.0  # how often a silent queue makes the parent check that every shard is still alive


class ShardError(RuntimeError):
    """A rollout process failed or died; the episodes it finished were still handed over."""


def split(pending: Sequence[Any], concurrency: int, procs: int) -> list[tuple[list[Any], int]]:
    """(episodes, concurrency) of each shard: episodes dealt round-robin (so each domain and task is spread over
    the shards), the concurrency split so it adds up; shards left with no episode are dropped."""
    shards = [(list(pending[i::procs]), concurrency // procs + (i < concurrency % procs)) for i in range(procs)]
    return [(episodes, max(1, n)) for episodes, n in shards if episodes]


def _shard(index: int, episodes: list, sglang_url: str, tokenizer: Any, user_kind: str, cfg: Tau2Config,
           sampling: SamplingParams, seed: int, concurrency: int, out: Any) -> None:
    """One rollout process: its episodes through `run_episodes`, each record onto `out`, then ("done", error)."""
    from tau2_rl_pipeline.benchmark.users import make_user_factory
    from tau2_rl_pipeline.eval.runner import run_episodes_on_sglang

    settle()  # a rollout process of its own (tau2_rl_pipeline/rollout/gc_policy.py)
    try:
        asyncio.run(run_episodes_on_sglang(
            sglang_url, episodes, concurrency=concurrency, tokenizer=tokenizer,
            user_factory=make_user_factory(user_kind, cfg), sampling=sampling, cfg=cfg, seed=seed,
            on_done=lambda record: out.put(("record", index, record))))
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group: the parent reports it
        return
    except BaseException as e:  # noqa: BLE001 -- reported to the parent, which ends the run with it
        out.put(("done", index, f"{type(e).__name__}: {e}".splitlines()[0][:500]))
        raise
    out.put(("done", index, None))


def run_sharded(pending: Sequence[tuple[str, Any, int]], *, procs: int, sglang_url: str, tokenizer: Any,
                user_kind: str, cfg: Tau2Config, sampling: SamplingParams, seed: int, concurrency: int,
                on_done: Callable[[dict], None]) -> None:
    """`run_episodes` over `procs` processes; `on_done(record)` here, in this process, as each episode ends.
    Raises ShardError once every shard has ended if any failed."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads and an event loop
    out = context.Queue()
    workers = [context.Process(target=_shard, name=f"tau2-rollout-{i}", daemon=True, args=(
        i, episodes, sglang_url, tokenizer, user_kind, cfg, sampling, seed, n, out))
        for i, (episodes, n) in enumerate(split(pending, concurrency, procs))]
    for worker in workers:
        worker.start()
    running, errors = set(range(len(workers))), []
    try:
        while running:
            try:
                kind, index, payload = out.get(timeout=POLL_S)
            except queue_module.Empty:
                for i in sorted(running):
                    if not workers[i].is_alive():  # killed, or crashed below Python
                        running.discard(i)
                        errors.append(f"rollout process {i} died (exit code {workers[i].exitcode})")
                continue
            if kind == "record":
                on_done(payload)
            else:
                running.discard(index)
                if payload is not None:
                    errors.append(f"rollout process {index}: {payload}")
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
            worker.join(timeout=10)
    if errors:
        raise ShardError("; ".join(errors))
