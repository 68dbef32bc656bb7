"""The multi-turn rollout: one tau2 episode against a policy engine, token in, token out.

    trajectory = await run_episode(EpisodeSpec.from_config(domain, task, user, cfg),
                                   Driver.from_config(engine, tokenizer, sampling, cfg))

What the episode is (`EpisodeSpec`: domain, task, user, environment, tau2's limits) and what drives it (`Driver`:
engine, tokenizer, sampling, turn and context limits, where blocking work runs) are given apart; the loop itself
(`_play`) is one function over them, with the start before it and tau2's evaluation after. The NL-assertion judge
of tau2 1.0.1 is not configured here: its run configures it once (`judge.configure_for`), as it reads its config.

The first prompt is the chat template over tau2's agent system prompt, the tools, and the conversation start
as tau2's orchestrator makes it (the agent's greeting, the user's first message). Each policy turn appends the
sampled ids with their log-probs (mask 1); each observation appends the template's token delta (mask 0). The
episode ends as tau2 ends it (agent or user stop, max steps, max errors), or as truncated (a turn cut by
max_new_tokens, the context over max_context_len, max_turns), or as aborted when the engine, the user
simulator or tau2 1.0.1's NL-assertion judge fails for good: an infrastructure failure, recorded and never scored
as the model's.

The episode's blocking work (tau2 tools, litellm's user-simulator call, evaluation) runs on a thread pool, so
hundreds of episodes can be in flight on one event loop; with the scripted user and fast_env that work is a few
milliseconds of CPU, and `episode_workers=0` runs it on the loop itself, sparing the thread hops and the GIL
hand-offs that otherwise stall the loop (bench/README.md, P2 and P5); auto (-1, the default) does so whenever no
user turn blocks and fast_env is on. An asynchronous user (user_client.py) has its turns run on the loop whatever
`episode_workers` says: its model call is awaited there, not blocked on.

An episode stopped by its caller (slime's end-of-rollout abort), or whose request the engine aborted because it
was told to stop (`engine_abort`: slime's `/abort_request`, or the `/pause_generation` of a weight update), returns
its live state with the trajectory (`Trajectory.live`): handed back as `resume=`, the same episode goes on from
where it was cut (a turn the abort cut mid-way is continued from its last sampled token), its earlier tokens,
log-probs and per-request meta kept. An abort the engine reports with an error is an engine failure
(`engine_error`), like a request that failed after its retries.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from tau2.data_model.simulation import RewardInfo, TerminationReason
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.user.user_simulator import UserSimulator

from tau2_rl_pipeline.benchmark.episode import Episode, UserSideError
from tau2_rl_pipeline.benchmark.fast_env import has_fast_path
from tau2_rl_pipeline.benchmark.judge import JudgeError, JudgeUsage, episode_usage
from tau2_rl_pipeline.benchmark.prompting import to_agent_chat
from tau2_rl_pipeline.benchmark.tau2_version import BaseUser, needs_judge
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.engines import Engine, EngineError, SamplingParams
from tau2_rl_pipeline.rollout.tokens import ObservationTemplate, TokenBuffer
from tau2_rl_pipeline.rollout.trajectory import Clock, LiveEpisode, Trajectory

COMPLETED, TRUNCATED, ABORTED = "completed", "truncated", "aborted"
ROLLOUT_STOPPED = "rollout_stopped"  # termination reason of an episode ended by its caller's stop_requested()
ENGINE_ABORT = "engine_abort"  # the engine aborted a request because it was told to (no error): resumable
AUTO_WORKERS = 64  # TAU2_EPISODE_WORKERS=-1 (auto) where a user turn blocks: sized for I/O-bound litellm calls


def user_blocks(user: BaseUser | None) -> bool:
    """Whether a user's turns block a thread: tau2's UserSimulator over litellm (a user strategy's too), not the
    scripted user nor the async client, whose model call is awaited on the loop."""
    return isinstance(user, UserSimulator) and not callable(getattr(user, "agenerate_next_message", None))


def episode_threads(workers: int, fast_env: bool, blocking_user: bool, domains: Iterable[str]) -> int:
    """TAU2_EPISODE_WORKERS (`workers`) with auto (-1) resolved: on the event loop (0) when nothing of an episode
    blocks on the network and fast_env keeps the tools and evaluation of every domain run to a few milliseconds;
    there, threads only cost GIL hand-offs that stall the loop (bench/README.md: P2, and P5's 66-68 ms stalls with 64
    threads against 29-36 ms with none). The NL-assertion judge's call goes to a thread whatever this says
    (`run_episode`)."""
    if workers >= 0:
        return workers
    quick = fast_env and all(has_fast_path(d) for d in domains)  # banking_knowledge has none
    return 0 if quick and not blocking_user else AUTO_WORKERS


@functools.cache
def shared_executor(workers: int) -> Executor | None:
    """Threads for blocking episode work; sized for I/O-bound user-simulator calls, not for CPU count.
    None for 0 workers: the work runs on the event loop (`off_loop`)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tau2-episode") if workers else None


SLICE_S = 0.010  # episode work the event loop does at a stretch before it polls sockets and timers again


class _Slice:
    """The current stretch of work on one event loop, started when the loop last came round to its queue."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.renewing = False

    def renew(self) -> None:
        self.started, self.renewing = time.perf_counter(), False


_slices: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def checkpoint() -> None:
    """Give way once this loop iteration has run SLICE_S of episode work.

    asyncio runs every callback that is ready before it looks at sockets and timers again, so 256 episodes whose
    replies arrive together, each with a millisecond or two of work, would hold the loop for hundreds of ms.
    Past the slice, each episode re-queues itself (and re-checks when it comes round): the loop polls in between.
    """
    loop = asyncio.get_running_loop()
    current = _slices.get(loop)
    if current is None:
        current = _slices[loop] = _Slice()
    while time.perf_counter() - current.started >= SLICE_S:
        if not current.renewing:  # queued ahead of the episodes that give way: renews the next iteration's slice
            current.renewing = True
            loop.call_soon(current.renew)
        await asyncio.sleep(0)


async def off_loop(executor: Executor | None, fn, *args):
    """`fn(*args)` on the executor's threads, or right here on the event loop (at a checkpoint) when there is
    none."""
    if executor is None:
        await checkpoint()
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args))


@functools.lru_cache(maxsize=8)
def observation_template(tokenizer) -> ObservationTemplate:
    return ObservationTemplate(tokenizer)


def turn_seed(seed: int | None, turn: int) -> int | None:
    """Each turn its own sampling seed: one seed reused every turn would restart the same random stream each time."""
    return None if seed is None else (seed * 1_000_003 + turn) % (1 << 31)


@dataclass(frozen=True)
class EpisodeSpec:
    """What the episode is: a task of a domain, the user who plays it, the environment it runs in (None: made from
    the task), under tau2's own limits (steps, errors) and this run's tool implementation (fast_env, retrieval)."""

    domain: str
    task: Task
    user: BaseUser | None  # None when a live episode goes on (its own user goes with it)
    max_steps: int
    max_errors: int
    fast_env: bool
    retrieval_variant: str
    environment: Environment | None = None

    @classmethod
    def from_config(cls, domain: str, task: Task, user: BaseUser | None, cfg: Tau2Config, *,
                    environment: Environment | None = None) -> EpisodeSpec:
        return cls(domain, task, user, cfg.max_steps, cfg.max_errors, cfg.fast_env, cfg.retrieval_variant,
                   environment)

    def make(self) -> Episode:
        return Episode(self.domain, self.task, self.user, max_steps=self.max_steps, max_errors=self.max_errors,
                       environment=self.environment, fast=self.fast_env, retrieval_variant=self.retrieval_variant)


@dataclass(frozen=True)
class Driver:
    """What drives the episode: the policy engine and its tokenizer, the sampling, the limits that truncate it
    (policy turns, context tokens), and where its blocking work runs: `executor`, or else threads as
    TAU2_EPISODE_WORKERS (`workers`, -1 auto) says for this episode's user and domain."""

    engine: Engine
    tokenizer: Any
    sampling: SamplingParams
    max_turns: int
    max_context_len: int
    workers: int = -1
    executor: Executor | None = None

    @classmethod
    def from_config(cls, engine: Engine, tokenizer: Any, sampling: SamplingParams, cfg: Tau2Config, *,
                    executor: Executor | None = None) -> Driver:
        return cls(engine, tokenizer, sampling, cfg.max_turns, cfg.max_context_len, cfg.episode_workers, executor)


@dataclass
class _Ending:
    status: str = COMPLETED
    reason: str | None = None
    error: str | None = None

    def abort(self, reason: str, error: str) -> None:
        self.status, self.reason, self.error = ABORTED, reason, error


class _Work:
    """Where an episode's work runs, each stretch timed into its clock under a key (env_s, tokenize_s, eval_s)."""

    def __init__(self, executor: Executor | None, clock: Clock) -> None:
        self.executor, self.clock = executor, clock

    async def blocking(self, key: str, fn, *args, waits: bool = False):
        """`fn` off the loop as `episode_workers` says; `waits`: it blocks on the network (tau2 1.0.1's judge
        over litellm, seconds), so never on the event loop, even with `episode_workers=0`."""
        t0 = time.perf_counter()
        try:
            if waits and self.executor is None:
                return await asyncio.to_thread(fn, *args)
            return await off_loop(self.executor, fn, *args)
        finally:
            self.clock.add(key, time.perf_counter() - t0)

    async def on_loop(self, key: str, coro_fn, *args):
        """An asynchronous user's turn: awaited here (its model call), the rest of the work on the loop."""
        await checkpoint()
        t0 = time.perf_counter()
        try:
            return await coro_fn(*args)
        finally:
            self.clock.add(key, time.perf_counter() - t0)

    async def env(self, live: LiveEpisode, name: str, *args):
        """The episode's `name` (start, act) step: its asynchronous twin on the loop for an asynchronous user."""
        episode = live.episode
        if live.asynchronous:
            return await self.on_loop("env_s", getattr(episode, "a" + name), *args)
        return await self.blocking("env_s", getattr(episode, name), *args)


async def run_episode(spec: EpisodeSpec, driver: Driver, *, stop_requested: Callable[[], bool] | None = None,
                      resume: LiveEpisode | None = None) -> Trajectory:
    """One episode; `stop_requested()` is asked before every policy turn (slime's end-of-rollout abort): when it
    says yes, the episode ends aborted there instead of sending another request, and `Trajectory.live` holds it.
    With `resume` (a `live` of an earlier call), that episode goes on instead (`spec.user` and `spec.environment`
    unused). A task tau2 1.0.1 judges (NL assertions) is judged by the judge its run configured (`judge.configure`
    where the run reads its config)."""
    executor = driver.executor
    if executor is None:
        user = spec.user if resume is None else resume.episode.user
        executor = shared_executor(episode_threads(driver.workers, spec.fast_env, user_blocks(user), (spec.domain,)))
    work = _Work(executor, resume.clock if resume is not None else Clock())
    t_start = time.perf_counter()
    if resume is None:
        live = await _start(spec, driver, work)
    else:
        live = resume
        live.resumes += 1
    ending = await _play(live, driver, work, stop_requested)
    reward_info, judge_usage = await _score(live.episode, ending, work, judged=needs_judge(spec.task))
    if live.asynchronous:  # env_s holds the asynchronous user's waits: kept apart, as the user's own time
        work.clock.add("user_s", live.episode.user_wait_s)
        work.clock.add("env_s", -live.episode.user_wait_s)
    work.clock.add("total_s", time.perf_counter() - t_start)
    return _trajectory(spec, live, ending, reward_info, judge_usage)


async def _start(spec: EpisodeSpec, driver: Driver, work: _Work) -> LiveEpisode:
    """A new tau2 conversation for `spec`, its user seeded as tau2's orchestrator seeds it (the run's seed)."""
    episode = await work.blocking("env_s", spec.make)
    if driver.sampling.seed is not None and spec.user is not None:
        spec.user.set_seed(driver.sampling.seed)
    return LiveEpisode(episode, {"role": "system", "content": episode.system_prompt}, TokenBuffer(),
                       callable(getattr(spec.user, "agenerate_next_message", None)), clock=work.clock)


async def _play(live: LiveEpisode, driver: Driver, work: _Work,
                stop_requested: Callable[[], bool] | None) -> _Ending:
    """The loop: the first prompt (unless the episode has one), then policy turn and observation until tau2 ends
    the episode, a limit truncates it, or it is stopped or aborted."""
    episode, buf, sampling, end = live.episode, live.buf, driver.sampling, _Ending()
    template = observation_template(driver.tokenizer)
    try:
        if not buf.prompt_ids:
            view = await work.env(live, "start")
            buf.set_prompt(await work.blocking("tokenize_s", template.first_prompt_ids, [live.system, *view],
                                               episode.tools))
        while not episode.done:
            room = driver.max_context_len - len(buf)
            cut = live.open_turn  # None, or the ids a cut turn has so far: this request continues that turn
            if (cut is None and live.turns >= driver.max_turns) or room <= 0:
                end.status, end.reason = TRUNCATED, ("max_context_len" if room <= 0 else "max_turns")
                break
            if cut is not None and len(cut) >= sampling.max_new_tokens:  # the cut turn had used all its tokens
                end.status, end.reason = TRUNCATED, "max_new_tokens"
                break
            await checkpoint()
            if stop_requested is not None and stop_requested():
                end.abort(ROLLOUT_STOPPED, "the rollout was stopped before this turn")
                break
            t0 = time.perf_counter()
            result = await driver.engine.generate(buf.all_ids(), replace(
                sampling, max_new_tokens=min(sampling.max_new_tokens - len(cut or ()), room),
                seed=turn_seed(sampling.seed, len(live.turn_meta))))  # one seed per request (= per turn, uncut)
            work.clock.add("generate_s", time.perf_counter() - t0)
            live.turns += cut is None
            live.turn_meta.append(result.meta)
            start = len(buf.response_ids)
            buf.add_policy(result.output_ids, result.output_logprobs, result.top_p)
            live.turn_spans.append((start, len(buf.response_ids)))
            turn_ids, live.open_turn = [*(cut or ()), *result.output_ids], None
            if result.finish_reason == "abort":
                if result.abort_error is not None:  # the engine gave the request up: a failure, not a stop
                    end.abort("engine_error", f"the engine aborted the request: {result.abort_error}")
                    break
                live.open_turn = turn_ids
                end.abort(ENGINE_ABORT, "the engine aborted the request (told to stop)")
                break
            if result.finish_reason == "length":
                end.status = TRUNCATED
                end.reason = "max_new_tokens" if len(buf) < driver.max_context_len else "max_context_len"
                break
            step = await work.env(live, "act", driver.tokenizer.decode(turn_ids, skip_special_tokens=False))
            if step.done:
                break
            closing = [] if turn_ids[-1:] == [template.end_of_turn_id] else [template.end_of_turn_id]
            buf.add_observation(closing + template.delta_ids(to_agent_chat(step.observations)))
    except EngineError as e:
        end.abort("engine_error", str(e))  # the engine's message counts its attempts
    except UserSideError as e:
        end.abort("user_simulator_error", str(e))
    return end


async def _score(episode: Episode, end: _Ending, work: _Work, *,
                 judged: bool) -> tuple[RewardInfo | None, JudgeUsage]:
    """tau2's evaluation of an episode not aborted (tau2 scores every run not ended by an agent or user stop as 0;
    truncations go through the same rule), with the NL-assertion judge's calls; `end` takes tau2's reason."""
    reward_info, usage = None, JudgeUsage()
    if end.status != ABORTED:
        try:
            reward_info = await work.blocking("eval_s", _evaluate_counted, episode,
                                              None if episode.done else TerminationReason.MAX_STEPS, usage,
                                              waits=judged)
        except JudgeError as e:  # tau2 1.0.1's NL-assertion judge failed for good: infrastructure, not scored
            end.abort("judge_error", str(e))
    if episode.done and end.status != ABORTED:
        end.reason = episode.termination_reason.value
    return reward_info, usage


def _trajectory(spec: EpisodeSpec, live: LiveEpisode, end: _Ending, reward_info: RewardInfo | None,
                judge_usage: JudgeUsage) -> Trajectory:
    episode = live.episode
    prompt_ids, response_ids, loss_mask, logprobs, top_p = live.buf.lists()
    return Trajectory(
        domain=spec.domain,
        task_id=spec.task.id,
        prompt_ids=prompt_ids,  # copies (buf.lists()): a live episode's book grows on when it is resumed
        response_ids=response_ids,
        loss_mask=loss_mask,
        rollout_logprobs=logprobs,
        chat=[live.system, *episode.agent_view()],
        tools=episode.tools,
        messages=list(episode.messages),  # dumped to JSON only where a record needs them (eval/runner.py)
        reward_info=reward_info,
        termination_reason=end.reason or "unknown",
        status=end.status,
        turns=live.turns,
        timings=dict(live.clock.totals),
        error=end.error,
        parse_errors=episode.parse_errors,
        refused_calls=episode.refused_calls,
        unknown_tool_calls=episode.unknown_tool_calls,
        user_tool_calls_by_agent=episode.user_tool_calls_by_agent,
        refused_call_ids=sorted(episode.refused_call_ids),
        turn_meta=list(live.turn_meta),
        turn_spans=list(live.turn_spans),
        top_p=top_p,
        judge=judge_usage.to_dict(),
        resumes=live.resumes,
        live=live if end.reason in (ROLLOUT_STOPPED, ENGINE_ABORT) else None,
    )


def _evaluate_counted(episode: Episode, reason: TerminationReason | None, usage: JudgeUsage) -> RewardInfo:
    """tau2's evaluation of `episode`, adding the judge calls it made (on this thread) to `usage`."""
    with episode_usage() as used:
        try:
            return episode.evaluate(reason)
        finally:
            usage.add(used)
