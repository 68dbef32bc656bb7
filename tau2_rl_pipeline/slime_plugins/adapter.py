"""slime plug-ins (written against slime main at 624b824, August 2026); the episode loop knows nothing of slime.

    --custom-generate-function-path        tau2_rl_pipeline.slime_plugins.adapter.generate
    --custom-reward-post-process-path      tau2_rl_pipeline.slime_plugins.adapter.reward_post_process
    --rollout-function-path                tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async   (async GRPO)

(the dynamic filter and the rollout log are in slime_plugins/batch.py)

slime loads these by dotted path inside its Ray job, so this package must be on the job's PYTHONPATH (the stage
scripts put it there). slime is imported only inside the functions slime calls, where it is always there; `_slime`
names everything this module uses of it, so a slime upgrade is checked in one place (and by tests/contract, which
runs slime's own rollout code against these plug-ins).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.episode import build_environment
from tau2_rl_pipeline.benchmark.monitors import monitors
from tau2_rl_pipeline.benchmark.scenario import scenario_of
from tau2_rl_pipeline.benchmark.tasks import get_task, split_benchmark
from tau2_rl_pipeline.benchmark.tau2_version import BenchmarkMismatch, check_same_benchmark
from tau2_rl_pipeline.benchmark.user_monitors import user_monitors
from tau2_rl_pipeline.benchmark.users import make_user_factory
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.curriculum import CurriculumTracker, rollouts_kept, state_path
from tau2_rl_pipeline.learning.judge_reward import JudgeClient, judge_trajectory
from tau2_rl_pipeline.learning.reward import format_penalty, partial_score, post_process, shaped_reward
from tau2_rl_pipeline.rollout.abort_storm import AbortStormGuard
from tau2_rl_pipeline.rollout.engines import SamplingParams, SGLangEngine
from tau2_rl_pipeline.rollout.episode_loop import (
    ABORTED,
    ENGINE_ABORT,
    ROLLOUT_STOPPED,
    TRUNCATED,
    Driver,
    EpisodeSpec,
    Trajectory,
    run_episode,
)
from tau2_rl_pipeline.rollout.gc_policy import settle
from tau2_rl_pipeline.rollout.offpolicy import mask_older_turns, versions_of
from tau2_rl_pipeline.slime_plugins.awsft import is_awsft
from tau2_rl_pipeline.slime_plugins.batch import scored_raw_rewards
from tau2_rl_pipeline.slime_plugins.offpolicy_guard import notice, refuse_unguarded
from tau2_rl_pipeline.slime_plugins.partial_rollout import LiveEpisodes
from tau2_rl_pipeline.slime_plugins.staleness import SCHEDULE_LAG, AdmissionGate, StalenessRefused, bound_rollout
from tau2_rl_pipeline.slime_plugins.staleness import refusal as staleness_refusal

logger = logging.getLogger(__name__)
STORM_POLL_S = 0.5  # how often the asynchronous rollout looks whether an abort storm stopped the run
TASK_INDEX_REMEDY = "write the task index again with this tau2 (python -m tau2_rl_pipeline.benchmark.tasks)"


def _slime() -> SimpleNamespace:
    """What this module uses of slime 624b824 (imported when slime calls us, inside its own process)."""
    from slime.rollout import fully_async_rollout, sample_hooks
    from slime.rollout.base_types import RolloutFnTrainOutput
    from slime.rollout.sglang_rollout import GenerateState
    from slime.utils.async_utils import run
    from slime.utils.http_utils import get_rollout_num_engines

    return SimpleNamespace(GenerateState=GenerateState, RolloutFnTrainOutput=RolloutFnTrainOutput,
                           get_rollout_num_engines=get_rollout_num_engines, run=run,
                           # slime's worker drops a group whose generate raised; its private coroutine is what
                           # generate_rollout_fully_async runs, so the storm check can stand beside it.
                           fully_async_rollout=fully_async_rollout.generate_rollout_fully_async,
                           fully_async_coroutine=fully_async_rollout._generate_rollout_async,
                           # its one worker (None before the first rollout): `running`, `worker_thread` and the
                           # `get_completed_groups` its rollout polls are what _stop_slime_worker reaches
                           fully_async_worker=lambda: fully_async_rollout._global_worker,
                           # the rollout RolloutManager.generate is making: it sets this before calling the rollout
                           # function and then, in the same call, the reward post-process (None outside a generate)
                           current_rollout_id=lambda: sample_hooks._current_rollout_id)


@functools.cache
def _config() -> Tau2Config:
    return Tau2Config.from_env()


@functools.cache
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.cache
def _settle_gc() -> None:
    """TAU2_SLIME_GC_POLICY=1: at the first episode, what slime, torch and tau2 have loaded lives as long as the
    process (rollout/gc_policy.py: why, the numbers, and the cost). Off by default: the actor is slime's."""
    settle()


@functools.cache
def _engine(ip: str, port: int, concurrency: int, max_retries: int, timeout_s: float) -> SGLangEngine:
    return SGLangEngine.from_router(ip, port, max_in_flight=concurrency, max_retries=max_retries,
                                    timeout_s=timeout_s)


def in_flight_cap(args) -> int:
    """slime's own bound on generate calls in flight: --sglang-server-concurrency per rollout engine
    (slime/rollout/sglang_rollout.py GenerateState.semaphore)."""
    return int(args.sglang_server_concurrency) * max(1, _slime().get_rollout_num_engines(args))


@functools.cache
def _storm_guard(window: int, fraction: float, patience: int) -> AbortStormGuard:
    return AbortStormGuard(window, fraction, patience)


def storm_guard(args, cfg: Tau2Config) -> AbortStormGuard:
    """One guard per process and run shape; a window is one rollout's episodes."""
    window = int(args.rollout_batch_size) * int(args.n_samples_per_prompt)
    return _storm_guard(window, cfg.abort_storm_fraction, cfg.abort_storm_patience)


@functools.cache
def _live_episodes(capacity: int) -> LiveEpisodes:
    return LiveEpisodes(capacity)


def live_episodes(args) -> LiveEpisodes:
    """The process's cut episodes (partial rollout), room for twice what one rollout can cut: every sample in
    flight, in slime's synchronous rollout (batch plus an over-sampling round) or its fully asynchronous one, whose
    worker keeps up to the in-flight cap of *groups* going (slime/rollout/fully_async_rollout.py; a cap of samples
    here let a weight update cut more episodes than were kept, and those started again: bench/README.md P6)."""
    groups = max(int(args.rollout_batch_size) + int(getattr(args, "over_sampling_batch_size", None) or 0),
                 in_flight_cap(args))
    return _live_episodes(2 * groups * int(args.n_samples_per_prompt))


def resumes_episodes(args, cfg: Tau2Config, evaluation: bool) -> bool:
    """Cut episodes go on when slime hands them back: under slime's --partial-rollout, TAU2_PARTIAL_RESUME on."""
    return bool(getattr(args, "partial_rollout", False)) and cfg.partial_resume and not evaluation


@functools.cache
def _judge(cfg: Tau2Config) -> JudgeClient:
    return JudgeClient(cfg)


@functools.cache
def _user_factory(cfg: Tau2Config):
    return make_user_factory("llm", cfg)


def sampling_from_slime(sampling_params: dict[str, Any], tokenizer) -> SamplingParams:
    """slime's SGLang sampling_params dict as SamplingParams; turns always stop at the end-of-turn token."""
    stop_ids = set(sampling_params.get("stop_token_ids") or ()) | {tokenizer.eos_token_id}
    return SamplingParams(
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=int(sampling_params.get("top_k", -1)),
        max_new_tokens=int(sampling_params.get("max_new_tokens", 1024)),
        stop=tuple(sampling_params.get("stop") or ()),
        stop_token_ids=tuple(sorted(stop_ids)),
        seed=sampling_params.get("sampling_seed"),
        return_top_p=bool((sampling_params.get("custom_params") or {}).get("return_top_p_token_ids")),
    )


def episode_config(args) -> Tau2Config:
    """TAU2_* settings, with slime's own context limit when it sets one."""
    cfg = _config()
    if getattr(args, "rollout_max_context_len", None):
        cfg = replace(cfg, max_context_len=int(args.rollout_max_context_len))
    return cfg


class TopPUnavailable(RuntimeError):
    """--rollout-top-p < 1 needs each token's top-p nucleus from SGLang, and the server returned none."""


def fill_sample(sample, traj: Trajectory, cfg: Tau2Config, tokenizer, *, top_p: bool = False):
    """Write a trajectory into a slime Sample: tokens, mask, log-probs, top-p replay (when slime asked for it),
    what SGLang reported per turn (prefix-cache counts, weight versions), shaped reward, status, metadata.

    The sample is rewritten whole from the trajectory, which holds the whole episode: for an episode resumed after
    slime's end-of-rollout abort (partial rollout), the turns before the cut too, with their own log-probs and
    weight versions (and masked, under --mask-offpolicy-in-partial-rollout, by the caller).

    An aborted sample's own books say it trains nothing: its loss mask is all 0 on the Sample (slime would zero it
    only through remove_sample when it builds train data), and its reward is 0.0 but never scored (post_process,
    the logged raw reward: reward_post_process). A cut episode's real mask stays with the episode kept for its
    resume, which rewrites the sample."""
    status_enum = type(sample).Status
    prompt_ids, response_ids = list(traj.prompt_ids), list(traj.response_ids)
    loss_mask, logprobs = list(traj.loss_mask), list(traj.rollout_logprobs)
    if traj.status == ABORTED and not response_ids:
        # slime trains on every returned sample's response; an episode that failed before its first turn gets
        # one masked end-of-turn token so lengths stay valid.
        prompt_ids = prompt_ids or tokenizer.encode(str(sample.prompt), add_special_tokens=False)
        response_ids, logprobs = [tokenizer.eos_token_id], [0.0]
    if traj.status == ABORTED:
        loss_mask = [0] * len(response_ids)
    sample.tokens = prompt_ids + response_ids
    sample.response_length = len(response_ids)
    sample.loss_mask = loss_mask
    sample.rollout_log_probs = logprobs
    if top_p:
        if traj.top_p is not None:
            sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets = traj.top_p.ids, traj.top_p.offsets
        elif not any(loss_mask):  # nothing sampled: every response token has an empty nucleus span
            sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets = [], [0] * (len(response_ids) + 1)
        else:
            raise TopPUnavailable(
                "--rollout-top-p below 1 asks SGLang for each sampled token's top-p nucleus (slime's top-p replay, "
                "custom_params return_top_p_token_ids) and the policy server returned none: run an SGLang that "
                "supports it (slime's image) or set --rollout-top-p 1.0")
    sample.weight_versions = [str(m["weight_version"]) for m in traj.turn_meta if "weight_version" in m]
    sample.prefix_cache_info = type(sample.prefix_cache_info)()
    for meta in traj.turn_meta:
        sample.prefix_cache_info.add(meta)
    sample.response = tokenizer.decode(response_ids, skip_special_tokens=False)
    partial, parts = partial_score(traj.reward_info, traj.domain, cfg, traj.judge_score) if traj.reward_info \
        else (0.0, {})
    format_errors = traj.parse_errors + traj.refused_calls
    penalty = format_penalty(format_errors, cfg)
    sample.remove_sample = traj.status == ABORTED  # a sample handed back after a cut is trained once it finishes
    if traj.status == ABORTED:
        sample.status, sample.reward = status_enum.ABORTED, 0.0
    else:
        sample.status = status_enum.TRUNCATED if traj.status == TRUNCATED else status_enum.COMPLETED
        sample.reward = shaped_reward(traj.reward, partial, traj.domain, cfg, penalty)
    # slime's start_rollout_id (the rollout a cut sample began in) holds while the episode goes on, not for a new one
    earlier = {k: v for k, v in (sample.metadata or {}).items() if traj.resumes or k != "start_rollout_id"}
    sample.metadata = {
        **earlier,
        "raw_reward": traj.reward,
        "partial_score": partial,
        "partial_parts": parts,
        "format_errors": format_errors,
        "format_penalty": penalty,
        "judge_calls": traj.judge_calls,
        "reward_info": traj.reward_info.model_dump(mode="json") if traj.reward_info else None,
        "termination_reason": traj.termination_reason,
        "episode_status": traj.status,
        "turns": traj.turns,
        "turn_spans": [list(span) for span in traj.turn_spans],  # each request's tokens and weight version:
        "turn_versions": versions_of(traj.turn_meta),  # what the staleness bound reads (slime_plugins/staleness.py)
        "resumes": traj.resumes,
        "domain": traj.domain,
        "task_id": traj.task_id,
        "error": traj.error,
        "timings": traj.timings,
    }
    return sample


async def generate(args, sample, sampling_params: dict[str, Any], evaluation: bool = False):
    """slime's custom generate function: one tau2 episode per sample, against the SGLang router.

    An episode is cut when the rollout stops it: slime's end-of-rollout abort (GenerateState.aborted, then no
    further turn), or the engine aborting its request because it was told to stop, which is how a weight update
    reaches it (slime's update_weight_from_distributed calls SGLang's /pause_generation, which aborts every
    request in flight; slime's fully async worker never sets GenerateState.aborted). A cut episode ends aborted
    (`rollout_stopped`), never counts as a failure, and under slime's --partial-rollout is kept (partial_rollout.py)
    and goes on from there when slime hands its sample back. Under --mask-offpolicy-in-partial-rollout every turn
    sampled by weights older than the episode's last turn is out of the loss, in every rollout mode
    (rollout/offpolicy.py: an episode of the fully async rollout also crosses updates between two turns).
    Episodes that aborted for infrastructure reasons feed the abort-storm guard, which stops the run when
    rollout after rollout is mostly aborted (the error names the first failure); a task-index row written with
    another tau2 stops it at once (BenchmarkMismatch)."""
    if not evaluation:
        _refuse_unguarded(args)
    slime = _slime()
    meta = sample.metadata or {}
    domain, task_id = meta["domain"], meta["task_id"]
    cfg = episode_config(args)
    guard = storm_guard(args, cfg)
    try:  # prompt data written with another tau2 (or task set): the run stops, also the async one
        check_same_benchmark(meta.get("benchmark"), split_benchmark(domain, meta["split"]),
                             f"the task index row {sample.prompt!r}", TASK_INDEX_REMEDY)
    except BenchmarkMismatch as e:
        guard.stop(e)
    if guard.tripped is not None:
        raise guard.tripped
    task = get_task(domain, task_id, meta["split"])
    tokenizer = _tokenizer(args.hf_checkpoint)
    if cfg.slime_gc_policy:
        _settle_gc()
    engine = _engine(args.sglang_router_ip, int(args.sglang_router_port), in_flight_cap(args),
                     cfg.engine_max_retries, cfg.engine_timeout_s)
    state = slime.GenerateState(args)
    sampling = sampling_from_slime(sampling_params, tokenizer)
    resumes = resumes_episodes(args, cfg, evaluation)
    live = live_episodes(args).take(sample, (domain, task_id)) if resumes else None
    if live is None:
        environment = build_environment(domain, cfg.fast_env, task=task, retrieval_variant=cfg.retrieval_variant)
        user = _user_factory(cfg)(task, environment)
    else:
        environment, user = None, None
        if getattr(args, "mask_offpolicy_in_partial_rollout", False):
            live.mask_earlier()  # as slime's generate_and_rm masks a returned sample's earlier response
    judge.configure_for(cfg, [task])  # tau2 1.0.1's NL assertions: the judge of this run's config
    traj = await run_episode(EpisodeSpec.from_config(domain, task, user, cfg, environment=environment),
                             Driver.from_config(engine, tokenizer, sampling, cfg),
                             stop_requested=lambda: state.aborted, resume=live)
    if traj.termination_reason == ENGINE_ABORT or (traj.status == ABORTED and state.aborted):
        traj = replace(traj, termination_reason=ROLLOUT_STOPPED)  # a pause, or slime's abort: a cut
    if cfg.use_judge:  # a judge that fails aborts the episode: an infrastructure failure, as the guard counts it
        traj = await judge_trajectory(traj, str(task.user_scenario), _judge(cfg))
    if getattr(args, "mask_offpolicy_in_partial_rollout", False) and not evaluation:
        traj = replace(traj, loss_mask=mask_older_turns(traj.loss_mask, traj.turn_spans, versions_of(traj.turn_meta)))
    if not evaluation and traj.termination_reason != ROLLOUT_STOPPED:
        storm = guard.record(traj.status == ABORTED, traj.error)
        if storm is not None:
            logger.error("%s", storm)
            raise storm
    sample = fill_sample(sample, traj, cfg, tokenizer, top_p=sampling.return_top_p)
    sample.metadata["monitors"] = monitors(domain, task, traj.messages, traj.termination_reason)  # rollout_log.py
    if resumes and traj.termination_reason == ROLLOUT_STOPPED and traj.live is not None:
        live_episodes(args).keep(sample, traj.live, (domain, task_id))
    sample.metadata["user_monitors"] = user_monitors(traj.messages, scenario_of(task), traj.termination_reason)
    return sample


def generate_rollout_fully_async(args, rollout_id: int, data_buffer, evaluation: bool = False):
    """slime's fully asynchronous rollout (`--rollout-function-path` for scripts/train_grpo.sh's async mode), which
    also stops on an abort storm: slime's worker logs and drops a group whose generate raised, so without this the
    run would wait for groups that never come. Its groups come back with metrics (the aborted count is 0: slime's
    worker sends a group holding an aborted sample back to its buffer), which rollout_log.py adds to, and the
    staleness bound (TAU2_MAX_STALENESS, slime_plugins/staleness.py): new groups start only while it can hold, the
    turns that still lag past it are masked, and the rollout/staleness/* metrics are this rollout's."""
    slime = _slime()
    if evaluation:
        return slime.fully_async_rollout(args, rollout_id, data_buffer, evaluation=True)
    _refuse_unguarded(args)  # before slime's worker starts: it would log and drop the groups whose generate raised
    cfg = _config()
    gate = admission_gate(args, data_buffer, cfg.max_staleness)
    trained = gate.start_rollout(rollout_id)
    guard = storm_guard(args, cfg)
    groups = slime.run(_until_storm(slime.fully_async_coroutine(args, rollout_id, gate), guard))
    return slime.RolloutFnTrainOutput(samples=groups, metrics=bound_rollout(groups, trained, cfg.max_staleness))


@functools.cache
def _admission_gate(source, batch_groups: int, max_staleness: int, lag: int, interval: int) -> AdmissionGate:
    return AdmissionGate(source, batch_groups, max_staleness, lag, interval)


def admission_gate(args, data_buffer, max_staleness: int) -> AdmissionGate:
    """The one gate over slime's data source (slime's worker keeps the source it was first given), refusing in one
    line a bound the run's schedule cannot meet (staleness.py)."""
    reason = staleness_refusal(max_staleness)
    if reason is not None:
        logger.error("%s", reason)
        raise StalenessRefused(reason)
    return _admission_gate(data_buffer, int(args.rollout_batch_size), max_staleness, SCHEDULE_LAG,
                           int(getattr(args, "update_weights_interval", 1) or 1))


def _refuse_unguarded(args) -> None:
    """The run stops at its first call when slime's args would train older weights' turns uncorrected or unbounded
    (offpolicy_guard.py), with the reason in one line in the log too (slime's actor prints the traceback); a rollout
    function the guard does not know is named in one line, once."""
    try:
        refuse_unguarded(args)
    except ValueError as e:
        logger.error("%s", e)
        _stop_slime_worker(e)
        raise
    line = notice(args)
    if line is not None:
        _log_once(line)


@functools.cache
def _log_once(line: str) -> None:
    logger.warning("%s", line)


def _stop_slime_worker(error: Exception) -> None:
    """Called inside slime's fully async worker (slime's own rollout function runs our generate there), a refusal
    would only lose its group: the worker logs it, starts another group, and its rollout waits for ever. There the
    worker takes no further group and the rollout, which polls it for finished groups, raises `error` to slime's
    caller instead: the run stops with the refusal."""
    worker = _slime().fully_async_worker()
    if worker is None or threading.current_thread() is not worker.worker_thread:
        return  # raised to whoever called: slime's synchronous rollout, or ours before its worker starts

    def refused(limit: int | None = None) -> list:
        raise error

    worker.running = False
    worker.get_completed_groups = refused


async def _until_storm(coro, guard: AbortStormGuard):
    task = asyncio.ensure_future(coro)
    while True:
        done, _ = await asyncio.wait({task}, timeout=STORM_POLL_S)
        if done:
            return task.result()
        if guard.tripped is not None:
            task.cancel()
            raise guard.tripped


# -- reward post-processing and the curriculum ------------------------------------------------------------
_tracker_lock = threading.Lock()
_trackers: dict[str, CurriculumTracker] = {}


def _tracker(args, cfg: Tau2Config) -> tuple[CurriculumTracker, Any]:
    """One tracker per run, restored from its state file next to the checkpoints on the first call, set at the
    rollout slime is making (CurriculumTracker.begin_rollout: a resumed run's counts are those of its checkpoint)."""
    path = state_path(cfg, getattr(args, "save", None))
    key = str(path)
    rollout = _slime().current_rollout_id()
    with _tracker_lock:
        if key not in _trackers:
            _trackers[key] = CurriculumTracker.restore(cfg, path)
        tracker = _trackers[key]
        note = tracker.begin_rollout(rollout, rollouts_kept(getattr(args, "save_interval", None)))
    if path is not None and note is not None:
        logger.warning("curriculum state %s, rollout %s: %s", path, rollout, note)
    if path is not None and rollout is None:
        _log_once(f"curriculum state {path}: slime gave no rollout id (its RolloutManager.generate sets one), so "
                  "the counts are kept without rollouts and a resumed run cannot take back what it generates again")
    return tracker, path


def reward_post_process(args, samples) -> tuple[list[float], list[float]]:
    """slime's custom reward post-process: (raw task rewards, group-normalized curriculum-weighted advantages), or,
    when slime trains with our AWSFT loss, each sample's AWSFT weight in place of the advantage (learning/awsft.py).
    slime calls it once per rollout, in RolloutManager.generate (synchronous, asynchronous and fully asynchronous
    training alike): the episodes are counted as that rollout's, and the state file saved."""
    cfg = _config()
    cfg = replace(cfg, grpo_std_normalization=cfg.grpo_std_normalization
                  and getattr(args, "grpo_std_normalization", True))
    tracker, path = _tracker(args, cfg)
    raw, advantages = post_process(samples, int(args.n_samples_per_prompt), cfg, tracker,
                                   "awsft" if is_awsft(args) else "grpo")
    if path is not None:
        tracker.save(path)
    scored_raw_rewards(samples)  # what slime logs of an aborted sample: batch.py
    return raw, advantages
