"""The multi-turn rollout: one tau2 episode against a policy engine, token in, token out.

    trajectory = await run_episode(domain, task, engine, tokenizer, user, sampling, cfg)

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
from dataclasses import dataclass, field, replace

from tau2.data_model.message import Message
from tau2.data_model.simulation import RewardInfo, TerminationReason
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.user.user_simulator import UserSimulator

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.episode import Episode, UserSideError
from tau2_rl_pipeline.benchmark.fast_env import has_fast_path
from tau2_rl_pipeline.benchmark.judge import JudgeError, JudgeUsage, episode_usage
from tau2_rl_pipeline.benchmark.prompting import to_agent_chat
from tau2_rl_pipeline.benchmark.tau2_version import BaseUser, needs_judge
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.engines import Engine, EngineError, SamplingParams
from tau2_rl_pipeline.rollout.tokens import ObservationTemplate, TokenBuffer, TopPSpans

COMPLETED, TRUNCATED, ABORTED = "completed", "truncated", "aborted"
ROLLOUT_STOPPED = "rollout_stopped"  # termination reason of an episode ended by its caller's stop_requested()
ENGINE_ABORT = "engine_abort"  # the engine aborted a request because it was told to (no error): resumable


@dataclass
class Trajectory:
    """Everything one episode produced; `prompt_ids + response_ids` is exactly what the policy saw and sampled."""

    domain: str
    task_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    chat: list[dict]  # the agent's view: system prompt, then the conversation as chat messages
    tools: list[dict]
    messages: list[Message]  # tau2's full trajectory (both sides, user device calls included)
    reward_info: RewardInfo | None
    termination_reason: str
    status: str  # completed | truncated | aborted
    turns: int
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    parse_errors: int = 0
    refused_calls: int = 0
    unknown_tool_calls: int = 0
    user_tool_calls_by_agent: int = 0
    refused_call_ids: list[str] = field(default_factory=list)  # never executed: left out of tau2's replay
    turn_meta: list[dict] = field(default_factory=list)  # per policy turn: prompt_tokens, cached_tokens, weight_version
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # per request: its tokens in response_ids
    top_p: TopPSpans | None = None  # each response token's top-p nucleus, when the engine was asked for it
    judge_score: float | None = None  # an LLM judge's rubric score in [0, 1] (TAU2_USE_JUDGE), else None
    judge_calls: int = 0  # rubric-judge requests made for this episode, retries included (TAU2_USE_JUDGE)
    judge: dict[str, int] = field(default_factory=dict)  # NL-assertion judge calls and tokens (tau2 1.0.1)
    resumes: int = 0  # times this episode went on after its caller had stopped it (slime's partial rollout)
    live: LiveEpisode | None = None  # the episode's state when its caller stopped it: pass as resume= to go on

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def reward(self) -> float:
        return float(self.reward_info.reward) if self.reward_info is not None else 0.0


AUTO_WORKERS = 64  # TAU2_EPISODE_WORKERS=-1 (auto) where a user turn blocks: sized for I/O-bound litellm calls


def user_blocks(user: BaseUser | None) -> bool:
    """Whether a user's turns block a thread: tau2's UserSimulator over litellm (a user strategy's too), not the
    scripted user nor the async client, whose model call is awaited on the loop."""
    return isinstance(user, UserSimulator) and not callable(getattr(user, "agenerate_next_message", None))


def episode_threads(cfg: Tau2Config, blocking_user: bool, domains: Iterable[str]) -> int:
    """TAU2_EPISODE_WORKERS with auto (-1) resolved: on the event loop (0) when nothing of an episode blocks on
    the network and fast_env keeps the tools and evaluation of every domain run to a few milliseconds; there,
    threads only cost GIL hand-offs that stall the loop (bench/README.md: P2, and P5's 66-68 ms stalls with 64
    threads against 29-36 ms with none). The NL-assertion judge's call goes to a thread whatever this says
    (`run_episode`)."""
    if cfg.episode_workers >= 0:
        return cfg.episode_workers
    quick = cfg.fast_env and all(has_fast_path(d) for d in domains)  # banking_knowledge has none
    return 0 if quick and not blocking_user else AUTO_WORKERS


@functools.lru_cache(maxsize=None)
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


class _Clock:
    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + seconds


@dataclass
class LiveEpisode:
    """An episode its caller stopped, with all it needs to go on: the tau2 conversation (environment, user
    simulator, messages), the token book, the turn count and the meta of every request so far."""

    episode: Episode
    system: dict
    buf: TokenBuffer
    asynchronous: bool  # the user's turns are awaited on the loop (user_client.py)
    turns: int = 0
    turn_meta: list[dict] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each request's sampled ids
    clock: _Clock = field(default_factory=_Clock)
    open_turn: list[int] | None = None  # ids of a turn the abort cut mid-way (maybe none yet): continued on resume
    resumes: int = 0

    def mask_earlier(self) -> None:
        """Out of the loss: every response token so far (slime's --mask-offpolicy-in-partial-rollout, which masks
        a returned sample's earlier response: it was sampled by older weights)."""
        self.buf.loss_mask = (0,) * len(self.buf.loss_mask)


async def run_episode(
    domain: str,
    task: Task,
    engine: Engine,
    tokenizer,
    user: BaseUser,
    sampling: SamplingParams,
    cfg: Tau2Config,
    *,
    environment: Environment | None = None,
    executor: Executor | None = None,
    stop_requested: Callable[[], bool] | None = None,
    resume: LiveEpisode | None = None,
) -> Trajectory:
    """One episode; `stop_requested()` is asked before every policy turn (slime's end-of-rollout abort): when it
    says yes, the episode ends aborted there instead of sending another request, and `Trajectory.live` holds it.
    With `resume` (a `live` of an earlier call), that episode goes on instead (`user` and `environment` unused)."""
    live = resume
    if executor is None:
        executor = shared_executor(episode_threads(cfg, user_blocks(user if live is None else live.episode.user),
                                                   (domain,)))
    clock = live.clock if live is not None else _Clock()
    t_start = time.perf_counter()

    async def blocking(key: str, fn, *args, waits: bool = False):
        """`fn` off the loop as `episode_workers` says; `waits`: it blocks on the network (tau2 1.0.1's judge
        over litellm, seconds), so never on the event loop, even with `episode_workers=0`."""
        t0 = time.perf_counter()
        try:
            if waits and executor is None:
                return await asyncio.to_thread(fn, *args)
            return await off_loop(executor, fn, *args)
        finally:
            clock.add(key, time.perf_counter() - t0)

    judged = needs_judge(task)
    if judged:
        judge.configure(cfg)  # tau2 1.0.1's NL assertions: this run's judge (kept when already installed)
    template = observation_template(tokenizer)
    status, reason, error = COMPLETED, None, None
    if live is None:
        episode = await blocking("env_s", lambda: Episode(domain, task, user, max_steps=cfg.max_steps,
                                                           max_errors=cfg.max_errors, environment=environment,
                                                           fast=cfg.fast_env,
                                                           retrieval_variant=cfg.retrieval_variant))
        if sampling.seed is not None and user is not None:
            user.set_seed(sampling.seed)  # as tau2's orchestrator seeds its user with the simulation's seed
        live = LiveEpisode(episode, {"role": "system", "content": episode.system_prompt}, TokenBuffer(),
                           callable(getattr(user, "agenerate_next_message", None)), clock=clock)
    else:
        live.resumes += 1
    episode, system, buf, asynchronous = live.episode, live.system, live.buf, live.asynchronous

    async def on_loop(key: str, coro_fn, *args):
        """An asynchronous user's turn: awaited here (its model call), the rest of the work on the loop."""
        await checkpoint()
        t0 = time.perf_counter()
        try:
            return await coro_fn(*args)
        finally:
            clock.add(key, time.perf_counter() - t0)

    try:
        if not buf.prompt_ids:
            view = await (on_loop("env_s", episode.astart) if asynchronous else blocking("env_s", episode.start))
            buf.set_prompt(await blocking("tokenize_s", template.first_prompt_ids, [system, *view], episode.tools))
        while not episode.done:
            room = cfg.max_context_len - len(buf)
            cut = live.open_turn  # None, or the ids a cut turn has so far: this request continues that turn
            if (cut is None and live.turns >= cfg.max_turns) or room <= 0:
                status, reason = TRUNCATED, ("max_context_len" if room <= 0 else "max_turns")
                break
            if cut is not None and len(cut) >= sampling.max_new_tokens:  # the cut turn had used all its tokens
                status, reason = TRUNCATED, "max_new_tokens"
                break
            await checkpoint()
            if stop_requested is not None and stop_requested():
                status, reason, error = ABORTED, ROLLOUT_STOPPED, "the rollout was stopped before this turn"
                break
            t0 = time.perf_counter()
            result = await engine.generate(buf.all_ids(), replace(
                sampling, max_new_tokens=min(sampling.max_new_tokens - len(cut or ()), room),
                seed=turn_seed(sampling.seed, len(live.turn_meta))))  # one seed per request (= per turn, uncut)
            clock.add("generate_s", time.perf_counter() - t0)
            live.turns += cut is None
            live.turn_meta.append(result.meta)
            start = len(buf.response_ids)
            buf.add_policy(result.output_ids, result.output_logprobs, result.top_p)
            live.turn_spans.append((start, len(buf.response_ids)))
            turn_ids, live.open_turn = [*(cut or ()), *result.output_ids], None
            if result.finish_reason == "abort":
                if result.abort_error is not None:  # the engine gave the request up: a failure, not a stop
                    status, reason, error = ABORTED, "engine_error", f"the engine aborted the request: " \
                                                                     f"{result.abort_error}"
                    break
                live.open_turn = turn_ids
                status, reason, error = ABORTED, ENGINE_ABORT, "the engine aborted the request (told to stop)"
                break
            if result.finish_reason == "length":
                status, reason = TRUNCATED, ("max_new_tokens" if len(buf) < cfg.max_context_len else "max_context_len")
                break
            text = tokenizer.decode(turn_ids, skip_special_tokens=False)
            step = await (on_loop("env_s", episode.aact, text) if asynchronous
                          else blocking("env_s", episode.act, text))
            if step.done:
                break
            closing = [] if turn_ids[-1:] == [template.end_of_turn_id] else [template.end_of_turn_id]
            buf.add_observation(closing + template.delta_ids(to_agent_chat(step.observations)))
    except EngineError as e:
        status, reason, error = ABORTED, "engine_error", str(e)  # the engine's message counts its attempts
    except UserSideError as e:
        status, reason, error = ABORTED, "user_simulator_error", str(e)

    reward_info = None
    judge_usage = JudgeUsage()
    if status != ABORTED:
        # tau2 scores every run not ended by an agent or user stop as 0; truncations go through the same rule.
        try:
            reward_info = await blocking("eval_s", _evaluate_counted, episode,
                                         None if episode.done else TerminationReason.MAX_STEPS, judge_usage,
                                         waits=judged)
        except JudgeError as e:  # tau2 1.0.1's NL-assertion judge failed for good: infrastructure, not scored
            status, reason, error = ABORTED, "judge_error", str(e)
    if episode.done and status != ABORTED:
        reason = episode.termination_reason.value
    if asynchronous:  # env_s holds the asynchronous user's waits: kept apart, as the user's own time
        clock.add("user_s", episode.user_wait_s)
        clock.add("env_s", -episode.user_wait_s)
    clock.add("total_s", time.perf_counter() - t_start)
    prompt_ids, response_ids, loss_mask, logprobs, top_p = buf.lists()
    return Trajectory(
        domain=domain,
        task_id=task.id,
        prompt_ids=prompt_ids,  # copies (buf.lists()): a live episode's book grows on when it is resumed
        response_ids=response_ids,
        loss_mask=loss_mask,
        rollout_logprobs=logprobs,
        chat=[system, *episode.agent_view()],
        tools=episode.tools,
        messages=list(episode.messages),  # dumped to JSON only where a record needs them (tau2_rl_pipeline/eval/runner.py)
        reward_info=reward_info,
        termination_reason=reason or "unknown",
        status=status,
        turns=live.turns,
        timings=dict(clock.totals),
        error=error,
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
        live=live if reason in (ROLLOUT_STOPPED, ENGINE_ABORT) else None,
    )


def _evaluate_counted(episode: Episode, reason: TerminationReason | None, usage: JudgeUsage) -> RewardInfo:
    """tau2's evaluation of `episode`, adding the judge calls it made (on this thread) to `usage`."""
    with episode_usage() as used:
        try:
            return episode.evaluate(reason)
        finally:
            usage.add(used)
