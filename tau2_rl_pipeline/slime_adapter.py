"""slime plug-ins (written against slime main at 624b824, August 2026); the episode loop knows nothing of slime.

    --custom-generate-function-path        tau2_rl_pipeline.slime_adapter.generate
    --custom-reward-post-process-path      tau2_rl_pipeline.slime_adapter.reward_post_process
    --dynamic-sampling-filter-path         tau2_rl_pipeline.slime_adapter.filter_zero_std_groups   (TAU2_FILTER_ZERO_STD=1)

slime loads these by dotted path inside its Ray job, so this package must be on the job's PYTHONPATH (the stage
scripts put it there). slime itself is never imported: the `Sample` class comes in with the sample
(`type(sample).Status`), so this module imports and tests without slime installed.
"""

from __future__ import annotations

import functools
import gc
import threading
from dataclasses import replace
from typing import Any

from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.curriculum import CurriculumTracker, state_path
from tau2_rl_pipeline.engines import SamplingParams, SGLangEngine
from tau2_rl_pipeline.env import build_environment
from tau2_rl_pipeline.judge import JudgeClient, judge_trajectory
from tau2_rl_pipeline.reward import (
    filter_equal_reward_groups,
    format_penalty,
    partial_score,
    post_process,
    shaped_reward,
)
from tau2_rl_pipeline.rollout import ABORTED, TRUNCATED, Trajectory, run_episode
from tau2_rl_pipeline.tasks import get_task
from tau2_rl_pipeline.users import make_user_factory


@functools.lru_cache(maxsize=None)
def _config() -> Tau2Config:
    return Tau2Config.from_env()


@functools.lru_cache(maxsize=None)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@functools.lru_cache(maxsize=None)
def _engine(ip: str, port: int, concurrency: int) -> SGLangEngine:
    # The first episode of the run: what slime, torch and tau2 have loaded by now lives as long as the process.
    # Out of the collector's full passes, which otherwise stall the event loop for ~0.4 s each with hundreds of
    # episodes in flight (bench/README.md, P2).
    gc.freeze()
    return SGLangEngine.from_router(ip, port, max_in_flight=concurrency)


@functools.lru_cache(maxsize=None)
def _judge(cfg: Tau2Config) -> JudgeClient:
    return JudgeClient(cfg)


@functools.lru_cache(maxsize=None)
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
    )


def episode_config(args) -> Tau2Config:
    """TAU2_* settings, with slime's own context limit when it sets one."""
    cfg = _config()
    if getattr(args, "rollout_max_context_len", None):
        cfg = replace(cfg, max_context_len=int(args.rollout_max_context_len))
    return cfg


def fill_sample(sample, traj: Trajectory, cfg: Tau2Config, tokenizer):
    """Write a trajectory into a slime Sample: tokens, mask, log-probs, shaped reward, status, metadata."""
    status_enum = type(sample).Status
    prompt_ids, response_ids = list(traj.prompt_ids), list(traj.response_ids)
    loss_mask, logprobs = list(traj.loss_mask), list(traj.rollout_logprobs)
    if traj.status == ABORTED and not response_ids:
        # slime trains on every returned sample's response; an episode that failed before its first turn gets
        # one masked end-of-turn token so lengths stay valid, and remove_sample keeps it out of the loss.
        prompt_ids = prompt_ids or tokenizer.encode(str(sample.prompt), add_special_tokens=False)
        response_ids, loss_mask, logprobs = [tokenizer.eos_token_id], [0], [0.0]
    sample.tokens = prompt_ids + response_ids
    sample.response_length = len(response_ids)
    sample.loss_mask = loss_mask
    sample.rollout_log_probs = logprobs
    sample.response = tokenizer.decode(response_ids, skip_special_tokens=False)
    partial, parts = partial_score(traj.reward_info, traj.domain, cfg, traj.judge_score) if traj.reward_info \
        else (0.0, {})
    format_errors = traj.parse_errors + traj.refused_calls
    penalty = format_penalty(format_errors, cfg)
    if traj.status == ABORTED:
        sample.status, sample.reward, sample.remove_sample = status_enum.ABORTED, 0.0, True
    else:
        sample.status = status_enum.TRUNCATED if traj.status == TRUNCATED else status_enum.COMPLETED
        sample.reward = shaped_reward(traj.reward, partial, traj.domain, cfg, penalty)
    sample.metadata = {
        **(sample.metadata or {}),
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
        "domain": traj.domain,
        "task_id": traj.task_id,
        "error": traj.error,
        "timings": traj.timings,
    }
    return sample


async def generate(args, sample, sampling_params: dict[str, Any], evaluation: bool = False):
    """slime's custom generate function: one tau2 episode per sample, against the SGLang router."""
    meta = sample.metadata or {}
    domain, task_id = meta["domain"], meta["task_id"]
    task = get_task(domain, task_id, meta.get("split"))
    cfg = episode_config(args)
    tokenizer = _tokenizer(args.hf_checkpoint)
    engine = _engine(args.sglang_router_ip, int(args.sglang_router_port),
                     int(getattr(args, "sglang_server_concurrency", None) or 512))
    environment = build_environment(domain, cfg.fast_env)
    user = _user_factory(cfg)(task, environment)
    traj = await run_episode(domain, task, engine, tokenizer, user, sampling_from_slime(sampling_params, tokenizer),
                             cfg, environment=environment)
    if cfg.use_judge:
        traj = await judge_trajectory(traj, str(task.user_scenario), _judge(cfg))
    return fill_sample(sample, traj, cfg, tokenizer)


# -- reward post-processing and the curriculum ------------------------------------------------------------
_tracker_lock = threading.Lock()
_trackers: dict[str, CurriculumTracker] = {}


def _tracker(args, cfg: Tau2Config) -> tuple[CurriculumTracker, Any]:
    """One tracker per run, restored from its state file next to the checkpoints on the first call."""
    path = state_path(cfg, getattr(args, "save", None))
    key = str(path)
    with _tracker_lock:
        if key not in _trackers:
            _trackers[key] = CurriculumTracker.restore(cfg, path)
        return _trackers[key], path


def reward_post_process(args, samples) -> tuple[list[float], list[float]]:
    """slime's custom reward post-process: (raw task rewards, group-normalized curriculum-weighted advantages)."""
    cfg = _config()
    cfg = replace(cfg, grpo_std_normalization=cfg.grpo_std_normalization
                  and getattr(args, "grpo_std_normalization", True))
    tracker, path = _tracker(args, cfg)
    raw, advantages = post_process(samples, int(args.n_samples_per_prompt), cfg, tracker)
    if path is not None:
        tracker.save(path)
    return raw, advantages


def filter_zero_std_groups(args, samples, **kwargs) -> bool:
    """slime's dynamic-sampling filter: keep a group only when its rewards differ (else GRPO has no signal).

    slime then samples another group in its place and counts the drop in its own metrics; the curriculum's
    zero-signal counter sees only groups that reach the post-process step.
    """
    rewards = [float(s.reward or 0.0) for s in samples]
    valid = [s.status.name != "ABORTED" and not s.remove_sample for s in samples]
    keep, _ = filter_equal_reward_groups(rewards, valid, len(samples))
    return any(keep)
