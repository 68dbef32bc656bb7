"""The local pipeline's policy stage: GRPO (PPO-clip) or AWSFT steps on sampled groups.

The local pipeline's policy stage: sample groups with the local engine, shape and normalize rewards as the slime
run does (reward.post_process, the curriculum; the judge component when TAU2_USE_JUDGE is on), then one PPO-clip
step (`grpo`) or one advantage-weighted SFT step (`awsft`: each episode weighted as learning/awsft.py says, over
the task's RFT-sampling pass rate) per rollout batch, on the tasks the difficulty filter keeps from the RFT stage's
pass rates (`difficulty_task_ids`). Both train every kept sample of the batch and reduce the loss as
TAU2_LOSS_REDUCTION says, as the slime run does.

Resumable step by step: after each step the weights, the optimizer state and the curriculum counts go to
`<grpo dir>/step_<k>/` and then `progress.json` names that step (the commit point). A rerun restores all three
and goes on at step k+1, so an interrupted run counts each episode in the curriculum once. Each step's task draw
and sampling seeds depend only on the seed and the step, so a resumed run draws what an uninterrupted one would.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.monitors import batch_monitors, monitors
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.files import atomic_write_bytes
from tau2_rl_pipeline.learning.awsft import BASELINE_KEY
from tau2_rl_pipeline.learning.curriculum import STATE_FILE, CurriculumTracker
from tau2_rl_pipeline.learning.judge_reward import JudgeClient, judge_trajectory
from tau2_rl_pipeline.learning.reward import post_process, task_key
from tau2_rl_pipeline.local.examples import TrainExample, examples_from_trajectory
from tau2_rl_pipeline.local.train_log import run_time
from tau2_rl_pipeline.local.trainer import LocalTrainer, TrainConfig
from tau2_rl_pipeline.metrics import is_success
from tau2_rl_pipeline.rollout.engines import SamplingParams, TransformersEngine
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, Driver, EpisodeSpec, run_episode
from tau2_rl_pipeline.selection.difficulty import FilterStats, filter_tasks, pass_rates
from tau2_rl_pipeline.slime_plugins.adapter import fill_sample

PROGRESS_FILE = "progress.json"
OPTIMIZER_FILE = "optimizer.pt"


# -- a Sample for the local path: the fields the shared reward code reads and writes ------------------------------
@dataclass
class LocalSample:
    class Status(Enum):
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"

    @dataclass
    class PrefixCacheInfo:  # slime's Sample.PrefixCacheInfo: SGLang's per-turn prefix-cache counts, summed
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

    prompt: str = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    reward: float | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    remove_sample: bool = False
    status: Status = Status.COMPLETED
    metadata: dict = field(default_factory=dict)
    weight_versions: list[str] = field(default_factory=list)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)


@dataclass(frozen=True)
class GrpoSettings:
    domain: str
    split: str
    steps: int
    tasks_per_step: int
    n: int  # samples per task: the GRPO group
    lr: float
    temperature: float
    max_new_tokens: int
    kl_coef: float
    entropy_coef: float
    micro_batch_size: int
    seed: int
    device: str = "cpu"
    wandb_project: str | None = None
    algorithm: str = "grpo"  # one of demo_report.ALGORITHMS: grpo (PPO-clip) or awsft (advantage-weighted SFT)
    task_ids: tuple[str, ...] | None = None  # the split's tasks to draw from (difficulty_task_ids); None = all
    baselines: tuple[tuple[str, float], ...] = ()  # (task id, RFT-sampling pass rate): AWSFT's V* (difficulty_task_ids)


def difficulty_task_ids(domain: str, split: str, rft_episodes: Path,
                        cfg: Tau2Config) -> tuple[list[str], FilterStats, dict[str, float]]:
    """The split's task ids whose pass rate over the RFT stage's sampled episodes lies in the
    TAU2_GRPO_{MIN,MAX}_PASS_RATE band (unsampled tasks kept), the counts of what each bound dropped, and each kept
    sampled task's pass rate (AWSFT's baseline V*, learning/awsft.py)."""
    from tau2_rl_pipeline.eval.episodes_file import read_episodes

    rates = pass_rates(read_episodes(rft_episodes).values()) if rft_episodes.exists() else {}
    kept, stats = filter_tasks([(domain, t.id) for t in load_tasks(domain, split)], rates, cfg)
    if not kept:
        raise SystemExit(f"error: {stats.line()}: no task left for the policy stage; widen TAU2_GRPO_MIN_PASS_RATE / "
                         "TAU2_GRPO_MAX_PASS_RATE")
    measured = {key[1]: rates[key][0] / rates[key][1] for key in kept if rates.get(key, (0, 0))[1]}
    return [tid for _, tid in kept], stats, measured


async def _rollouts(domain: str, engine, tokenizer, tasks, n: int, sampling: SamplingParams, cfg: Tau2Config,
                    seed: int):
    """n episodes per task, in task order (slime's group layout), each with its own sampling seed; judged when
    TAU2_USE_JUDGE is on."""
    judge.configure_for(cfg, tasks)  # tau2 1.0.1's NL assertions: this run's judge
    trajs = await asyncio.gather(*[
        run_episode(EpisodeSpec.from_config(domain, task, ScriptedUser(task), cfg),
                    Driver.from_config(engine, tokenizer,
                                       SamplingParams(**{**sampling.__dict__, "seed": seed + g * n + i}), cfg))
        for g, task in enumerate(tasks) for i in range(n)])
    if not cfg.use_judge:
        return trajs
    async with JudgeClient(cfg) as client:
        return await asyncio.gather(*[judge_trajectory(t, str(tasks[k // n].user_scenario), client)
                                      for k, t in enumerate(trajs)])


def step_record(step: int, samples: list, raw: list[float], group_size: int, groups_without_signal: int,
                trained_sequences: int) -> dict[str, Any]:
    """What one GRPO step reports: rewards with the episode and group counts behind them."""
    return {"step": step, "tasks": [task_key(s.metadata) for s in samples[::group_size]],
            "episodes": len(samples), "raw_reward_mean": sum(raw) / len(raw),
            "shaped_reward_mean": sum(s.reward for s in samples) / len(samples),
            "success_rate": sum(r == 1.0 for r in raw) / len(raw),
            "groups": len(samples) // group_size, "groups_without_signal": groups_without_signal,
            "trained_sequences": trained_sequences}


def step_behaviour(domain: str, trajs: list, tasks: list) -> dict[str, Any]:
    """The behaviour monitors' rates (benchmark/monitors.py) over a step's scored episodes, `tasks` each one's."""
    scored = [(t, task) for t, task in zip(trajs, tasks) if t.status != ABORTED]
    return batch_monitors([monitors(domain, task, t.messages, t.termination_reason) for t, task in scored],
                          [is_success(t.reward) for t, _ in scored])


class GrpoProgress:
    """The last finished step under `root`: its number, the history so far, and its checkpoint directory."""

    def __init__(self, root: Path):
        self.root = root
        self.path = root / PROGRESS_FILE
        state = json.loads(self.path.read_text()) if self.path.exists() else {"step": 0, "history": []}
        self.step: int = state["step"]
        self.history: list[dict] = state["history"]

    def step_dir(self, step: int | None = None) -> Path:
        return self.root / f"step_{self.step if step is None else step}"

    def commit(self, step: int, history: list[dict]) -> None:
        """Name `step` as the last finished one, then drop every other step directory."""
        atomic_write_bytes(self.path, json.dumps({"step": step, "history": history}, indent=1).encode())
        self.step, self.history = step, history
        self.clean()

    def clean(self) -> None:
        """Remove step directories (and staging left by a killed save) other than the committed step's."""
        for p in self.root.glob("*step_*"):
            if p != self.step_dir():
                shutil.rmtree(p, ignore_errors=True)


def grpo_stage(settings: GrpoSettings, start: Path, dest: Path, root: Path, cfg: Tau2Config,
               log_jsonl: Path, report: Callable[[str], None] = print) -> list[dict]:
    """GRPO (or AWSFT: settings.algorithm) from checkpoint `start` for `settings.steps` steps, resuming at the last
    finished step under `root`; the final weights go to `dest`. Returns every step's record."""
    s = settings
    name = s.algorithm
    trainer = LocalTrainer(start, TrainConfig(
        log_jsonl=log_jsonl, lr=s.lr, device=s.device, seed=s.seed, micro_batch_size=s.micro_batch_size,
        weight_decay=0.0, kl_coef=s.kl_coef, entropy_coef=s.entropy_coef, rollout_temperature=s.temperature,
        wandb_project=s.wandb_project, loss_reduction=cfg.loss_reduction))  # KL reference: `start`, also on resume
    progress = GrpoProgress(root)
    progress.clean()
    tracker = CurriculumTracker(cfg)
    if progress.step:
        _restore(trainer, progress.step_dir())
        tracker = CurriculumTracker.restore(cfg, _tracker_path(cfg, progress.step_dir()))
        report(f"{name}: resuming after step {progress.step} of {s.steps} (its weights, optimizer and curriculum)")
    engine = TransformersEngine(trainer.model, trainer.tokenizer, device=s.device)
    baselines = dict(s.baselines)
    wanted = None if s.task_ids is None else set(s.task_ids)
    tasks = {t.id: t for t in load_tasks(s.domain, s.split) if wanted is None or t.id in wanted}
    keys = [f"{s.domain}/{tid}" for tid in tasks]
    sampling = SamplingParams(temperature=s.temperature, max_new_tokens=s.max_new_tokens,
                              stop_token_ids=(trainer.tokenizer.eos_token_id,))
    history = list(progress.history)
    first, t_run = progress.step, time.perf_counter()
    for step in range(progress.step + 1, s.steps + 1):
        rng = random.Random(f"{name}-draw/{s.seed}/{step}")
        k = min(s.tasks_per_step, len(keys))
        chosen = tracker.draw(keys, k, rng) if cfg.task_sampler == "learning_value" else rng.sample(keys, k)
        trainer.model.eval()
        t0 = time.perf_counter()
        drawn = [tasks[c.split("/", 1)[1]] for c in chosen]
        trajs = asyncio.run(_rollouts(s.domain, engine, trainer.tokenizer, drawn, s.n, sampling, cfg,
                                      s.seed * 1000 + (step - 1) * 100))
        rollout_s = time.perf_counter() - t0
        # as slime's samples, each carries its task's V* from the difficulty stage (the task-index row's metadata)
        samples = [fill_sample(LocalSample(metadata=_baseline(baselines, t.task_id)), t, cfg, trainer.tokenizer)
                   for t in trajs]
        zero_before = tracker.zero_signal_groups
        raw, signal = post_process(samples, s.n, cfg, tracker, name)  # advantages, or AWSFT's weights
        # Every sample is trained as slime trains every sample of its batch: a zero GRPO advantage still counts in
        # the per-sample mean and carries the KL and entropy terms, and a removed one (aborted, or filtered by
        # TAU2_FILTER_ZERO_STD) stays in the batch at mask 0, one sample (and one token) in the means, as on slime.
        examples = [example_from_sample(smp, 0.0 if name == "awsft" else a, weight=a if name == "awsft" else 1.0)
                    for smp, a in zip(samples, signal)]
        trained = sum(not smp.remove_sample for smp in samples)
        record = {**step_record(step, samples, raw, s.n, tracker.zero_signal_groups - zero_before, trained),
                  "rollout_s": rollout_s, "aborted": sum(smp.status.name == "ABORTED" for smp in samples),
                  "judge_calls": sum(t.judge_calls for t in trajs),
                  "behaviour": step_behaviour(s.domain, trajs, [task for task in drawn for _ in range(s.n)]),
                  "episodes_with_baseline": sum(BASELINE_KEY in smp.metadata for smp in samples)}  # AWSFT's V*
        if any(e.num_targets for e in examples):  # nothing sampled (every episode aborted): no step
            trainer.model.train()
            update = trainer.awsft_step(examples) if name == "awsft" else trainer.grpo_step(examples)
            record.update({f"train_{key}": v for key, v in update.items() if isinstance(v, (int, float))})
        history.append(record)
        _save_step(trainer, progress.step_dir(step), tracker, cfg)
        progress.commit(step, history)
        timing = run_time(time.perf_counter() - t_run, step - first, s.steps - step)  # this run's pace: resumes too
        report(f"{name} step {step}/{s.steps}: reward {record['raw_reward_mean']:.3f} "
               f"(shaped {record['shaped_reward_mean']:.3f}) over {record['episodes']} episodes, "
               f"{record['groups_without_signal']}/{record['groups']} groups without signal, "
               f"trained on {trained} sequences ({timing})")
    if not dest.exists():  # saved whole or not at all: present means a run stopped just after saving it
        trainer.save(dest)
    trainer.close()
    return history


def example_from_sample(sample: LocalSample, advantage: float, weight: float) -> TrainExample:
    """A sample's books as slime trains them: a removed sample's mask all 0 (slime zeroes it in its train data)."""
    prompt, response = sample.tokens[:-sample.response_length], sample.tokens[-sample.response_length:]
    mask = [0] * len(response) if sample.remove_sample else list(sample.loss_mask)
    return examples_from_trajectory(prompt, response, mask, sample.rollout_log_probs, advantage, weight=weight)


def _baseline(baselines: dict[str, float], task_id: str) -> dict:
    return {BASELINE_KEY: baselines[task_id]} if task_id in baselines else {}


def _save_step(trainer: LocalTrainer, step_dir: Path, tracker: CurriculumTracker, cfg: Tau2Config) -> None:
    trainer.save(step_dir)
    torch.save({"optimizer": trainer.optimizer.state_dict(), "step": trainer.step}, step_dir / OPTIMIZER_FILE)
    path = _tracker_path(cfg, step_dir)
    if path is not None:
        tracker.save(path)


def _tracker_path(cfg: Tau2Config, step_dir: Path) -> Path | None:
    """The curriculum counts live in the step's own directory, so they always match its weights (never in a
    shared TAU2_CURRICULUM_STATE_PATH, which a step interrupted after writing it would leave one step ahead)."""
    return step_dir / STATE_FILE if cfg.curriculum_persist else None


def _restore(trainer: LocalTrainer, step_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(str(step_dir), dtype=torch.float32)
    trainer.model.load_state_dict(saved.state_dict())
    state = torch.load(step_dir / OPTIMIZER_FILE, map_location=trainer.device, weights_only=True)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.step = state["step"]
