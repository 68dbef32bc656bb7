"""Episodes over several rollout processes (tau2_rl_pipeline/eval/shards.py): the same records as one process, made in child
processes, handed to the parent as they end; a failing shard is reported, not hidden."""

from __future__ import annotations

import asyncio
import multiprocessing

import pytest
from support.loopback_server import LoopbackServer

from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.users import make_user_factory
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.eval.plan import make_plan
from tau2_rl_pipeline.eval.runner import run_episodes
from tau2_rl_pipeline.eval.shards import ShardError, run_sharded, split
from tau2_rl_pipeline.rollout.engines import SamplingParams, SGLangEngine

CFG = Tau2Config.from_env({}, max_turns=3, episode_workers=0)


def test_split_deals_episodes_round_robin_and_adds_up_the_concurrency():
    shards = split(list(range(10)), concurrency=5, procs=3)
    assert [episodes for episodes, _ in shards] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [n for _, n in shards] == [2, 2, 1]
    assert split([0], concurrency=4, procs=3) == [([0], 2)]  # shards without episodes are not started


def _outcome(record: dict) -> tuple:
    return (record["status"], record["reward"], record["turns"], record["seed"], record["tokens"],
            [m.get("content") for m in record["messages"]])


def test_two_rollout_processes_give_the_records_of_one(tiny_engine):
    pending = list(make_plan(["mock"], "base", None, 2).episodes())
    sampling = SamplingParams(max_new_tokens=12, stop_token_ids=(tiny_engine.tokenizer.eos_token_id,))
    with LoopbackServer(tiny_engine) as server:
        alone: list[dict] = []

        async def one_process() -> None:
            engine = SGLangEngine(server.base_url, max_in_flight=4)
            try:
                await run_episodes(pending, engine=engine, tokenizer=tiny_engine.tokenizer,
                                   user_factory=make_user_factory("scripted", CFG), sampling=sampling, cfg=CFG,
                                   seed=7, concurrency=4, on_done=alone.append)
            finally:
                await engine.aclose()

        asyncio.run(one_process())
        sharded, children = [], []

        def on_done(record: dict) -> None:  # called here, in the parent, while the shards run
            sharded.append(record)
            children.append(len(multiprocessing.active_children()))

        run_sharded(pending, procs=2, sglang_url=server.base_url, tokenizer=tiny_engine.tokenizer,
                    user_kind="scripted", cfg=CFG, sampling=sampling, seed=7, concurrency=4, on_done=on_done)
    key = lambda r: (r["domain"], r["task_id"], r["sample"])  # noqa: E731
    assert len(sharded) == len(alone) == len(pending) == 2 * len(load_tasks("mock", "base"))
    assert {key(r): _outcome(r) for r in sharded} == {key(r): _outcome(r) for r in alone}
    assert max(children) == 2  # both shards were alive in their own processes


def test_a_failing_shard_is_reported_with_its_cause(tiny_engine):
    pending = list(make_plan(["mock"], "base", ["create_task_1"], 2).episodes())
    with pytest.raises(ShardError, match=r"rollout process 0: UserConfigError: unknown user kind 'nobody'"):
        run_sharded(pending, procs=2, sglang_url="http://127.0.0.1:9", tokenizer=tiny_engine.tokenizer,
                    user_kind="nobody", cfg=CFG, sampling=SamplingParams(), seed=0, concurrency=2,
                    on_done=lambda record: None)
