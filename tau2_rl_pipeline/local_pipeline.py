"""The embedded default: the staged recipe (SFT -> RFT -> GRPO, each evaluated) on one machine, CPU or one GPU.

    python -m tau2_rl_pipeline.local_pipeline --domain mock --out outputs/demo      # what scripts/demo.sh runs
    python -m tau2_rl_pipeline.local_pipeline --algorithm grpo,awsft   # both policy stages from the RFT checkpoint

It runs the same episode, rollout, reward shaping, curriculum and group normalization as the slime run; only the
engine (in-process transformers instead of SGLang) and the trainer (tau2_rl_pipeline.trainer instead of Megatron)
differ. The user side is the offline ScriptedUser, so the numbers are a plumbing and learning-signal check, not
tau2 scores. Each stage writes its output under --out and is skipped when that output exists (rerun to resume).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from rich.console import Console

from tau2_rl_pipeline.config import Tau2Config, add_config_args, command_parser, config_from_args
from tau2_rl_pipeline.curriculum import CurriculumTracker
from tau2_rl_pipeline.difficulty import filter_tasks, pass_rates
from tau2_rl_pipeline.engines import SamplingParams, TransformersEngine
from tau2_rl_pipeline.judge_reward import JudgeClient, judge_trajectory
from tau2_rl_pipeline.local_report import ALGORITHMS, print_stage_table, stage_numbers, write_charts
from tau2_rl_pipeline.reward import post_process, task_key
from tau2_rl_pipeline.rft import select_rft
from tau2_rl_pipeline.rollout import run_episode
from tau2_rl_pipeline.sft_data import oracle_demonstrations
from tau2_rl_pipeline.slime_adapter import fill_sample
from tau2_rl_pipeline.tasks import DOMAINS, TaskLookupError, check_split, load_tasks
from tau2_rl_pipeline.trainer import LocalTrainer, TrainConfig, examples_from_trajectory, sft_example_from_chat
from tau2_rl_pipeline.users import ScriptedUser

DEMO_MAX_TURNS = 8  # unless --max-turns or TAU2_MAX_TURNS say otherwise: mock tasks take 2-3 policy turns
console = Console(stderr=True)


# -- a Sample for the local path: the fields the shared reward code reads and writes ------------------------------
@dataclass
class PrefixCacheCounts:
    """Per-episode prefix-cache counts that fill_sample adds up turn by turn (slime's Sample.PrefixCacheInfo)."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    def add(self, meta: dict) -> None:
        self.cached_tokens += meta.get("cached_tokens", 0)
        self.total_prompt_tokens += meta.get("prompt_tokens", 0)


@dataclass
class LocalSample:
    class Status(Enum):
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"

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
    prefix_cache_info: PrefixCacheCounts = field(default_factory=PrefixCacheCounts)


# -- stages ----------------------------------------------------------------------------------------------------
def prepare_model(args, out: Path) -> Path:
    """The starting checkpoint: --model as given, or a tiny Qwen3 built (cached) with a tokenizer trained here."""
    if args.model:
        return Path(args.model)
    from transformers import AutoTokenizer

    from tau2_rl_pipeline.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer

    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = train_small_tokenizer(domain_corpus([args.domain]), out / "tokenizer", vocab_size=args.vocab_size)
    return build_tiny_qwen3(out / "base", tokenizer, hidden_size=args.hidden_size, num_layers=args.num_layers,
                            num_heads=4, num_kv_heads=2, intermediate_size=args.hidden_size * 3, seed=args.seed)


def train_config(args, out: Path, lr: float, epochs: int = 1) -> TrainConfig:
    return TrainConfig(log_jsonl=out / "metrics.jsonl", lr=lr, epochs=epochs, device=args.device, seed=args.seed,
                       micro_batch_size=args.micro_batch_size, grad_accum_steps=1, weight_decay=0.0,
                       wandb_project=args.wandb_project)


def sft_stage(args, start: Path, rows: list[dict], dest: Path, out: Path, lr: float, epochs: int) -> dict:
    trainer = LocalTrainer(start, train_config(args, out, lr, epochs))
    examples = [sft_example_from_chat(trainer.tokenizer, row["messages"], row.get("tools")) for row in rows]
    before = trainer.evaluate(examples)
    trainer.sft(examples)
    after = trainer.evaluate(examples)
    trainer.save(dest)
    trainer.close()
    return {"examples": len(examples), "loss_before": before, "loss_after": after}


def evaluate_stage(args, model_dir: Path, out: Path, stage: str, num_samples: int, temperature: float,
                   split: str, output_name: str | None = None) -> dict:
    """Run eval/eval_passk.py on a checkpoint (its own process: the same CLI users run)."""
    output = out / "eval" / f"{output_name or stage}.json"
    cmd = [sys.executable, "-m", "eval.eval_passk", "--backend", "local", "--model", str(model_dir),
           "--device", args.device, "--user", "scripted", "--domains", args.domain, "--task-split", split,
           "--num-samples", str(num_samples), "--temperature", str(temperature), "--top-p", "1.0", "--top-k", "-1",
           "--max-new-tokens", str(args.max_new_tokens), "--max-turns", str(args.max_turns),
           "--seed", str(args.seed), "--concurrency", "8", "--output", str(output)]
    console.print(f"[bold]evaluate {stage}[/bold]: python {' '.join(cmd[1:])}")
    subprocess.run(cmd, check=True)  # in the caller's directory, where the relative --out and --model paths are
    return json.loads(output.read_text())


def rft_stage(args, sft_dir: Path, out: Path, split: str) -> tuple[list[dict], dict]:
    """Sample N episodes per training task from the SFT model (the evaluator's machinery), keep the successes."""
    from eval.episodes_file import read_episodes

    summary = evaluate_stage(args, sft_dir, out, "rft-sampling", args.rft_samples, args.rft_temperature, split,
                             output_name="rft_samples")
    records = list(read_episodes(out / "eval" / "rft_samples.json.episodes.jsonl").values())
    rows = select_rft(records, allow_partial=False)
    return rows, {"sampled_episodes": len(records), "kept": len(rows),
                  "sampling": stage_numbers(summary, args.domain)}


async def _grpo_rollouts(domain: str, engine, tokenizer, tasks, n: int, sampling: SamplingParams,
                         cfg: Tau2Config, seed: int):
    """n episodes per task, in task order (slime's group layout), each with its own sampling seed; judged when
    TAU2_USE_JUDGE is on."""
    trajs = await asyncio.gather(*[
        run_episode(domain, task, engine, tokenizer, ScriptedUser(task),
                    SamplingParams(**{**sampling.__dict__, "seed": seed + g * n + i}), cfg)
        for g, task in enumerate(tasks) for i in range(n)])
    if not cfg.use_judge:
        return trajs
    async with JudgeClient(cfg) as judge:
        return await asyncio.gather(*[judge_trajectory(t, str(tasks[k // n].user_scenario), judge)
                                      for k, t in enumerate(trajs)])


def grpo_task_ids(args, out: Path, cfg: Tau2Config, split: str) -> tuple[list[str], dict]:
    """The split's task ids whose RFT-sampling pass rate is in the TAU2_GRPO_*_PASS_RATE band, and the counts."""
    task_ids = [t.id for t in load_tasks(args.domain, split)]
    episodes = out / "eval" / "rft_samples.json.episodes.jsonl"
    from eval.episodes_file import read_episodes

    rates = pass_rates(read_episodes(episodes).values()) if episodes.exists() else {}
    kept, stats = filter_tasks([(args.domain, tid) for tid in task_ids], rates, cfg)
    if not kept:
        raise SystemExit(f"error: {stats.line()}: no task left for the policy stage; widen TAU2_GRPO_MIN_PASS_RATE / "
                         "TAU2_GRPO_MAX_PASS_RATE")
    console.print(stats.line())
    return [tid for _, tid in kept], dataclasses.asdict(stats)


def policy_stage(args, algorithm: str, start: Path, dest: Path, out: Path, cfg: Tau2Config,
                 task_ids: list[str], split: str) -> list[dict]:
    """GRPO or AWSFT on the local engine: sample groups, shape and normalize rewards as slime does, then one
    PPO-clip step (grpo) or one advantage-weighted SFT step (awsft) per batch of groups."""
    trainer = LocalTrainer(start, TrainConfig(
        log_jsonl=out / "metrics.jsonl", lr=args.grpo_lr, device=args.device, seed=args.seed,
        micro_batch_size=args.micro_batch_size, weight_decay=0.0, kl_coef=args.kl_coef,
        entropy_coef=args.entropy_coef, rollout_temperature=args.grpo_temperature,
        wandb_project=args.wandb_project))
    engine = TransformersEngine(trainer.model, trainer.tokenizer, device=args.device)
    wanted = set(task_ids)
    tasks = {t.id: t for t in load_tasks(args.domain, split) if t.id in wanted}
    keys = [f"{args.domain}/{tid}" for tid in tasks]
    tracker_path = out / algorithm / "curriculum_state.json"
    tracker = CurriculumTracker.restore(cfg, tracker_path if tracker_path.exists() else None)
    rng = random.Random(args.seed)
    stop = (trainer.tokenizer.eos_token_id,)
    sampling = SamplingParams(temperature=args.grpo_temperature, max_new_tokens=args.max_new_tokens,
                              stop_token_ids=stop)
    history = []
    for step in range(args.grpo_steps):
        if cfg.task_sampler == "learning_value":
            chosen = tracker.draw(keys, min(args.grpo_tasks_per_step, len(keys)), rng)
        else:
            chosen = rng.sample(keys, min(args.grpo_tasks_per_step, len(keys)))
        batch = [tasks[k.split("/", 1)[1]] for k in chosen]
        trainer.model.eval()
        t0 = time.perf_counter()
        trajs = asyncio.run(_grpo_rollouts(args.domain, engine, trainer.tokenizer, batch, args.grpo_n, sampling, cfg,
                                           args.seed * 1000 + step * 100))
        rollout_s = time.perf_counter() - t0
        samples = [fill_sample(LocalSample(), t, cfg, trainer.tokenizer) for t in trajs]
        zero_before = tracker.zero_signal_groups
        raw, advantages = post_process(samples, args.grpo_n, cfg, tracker)
        # GRPO: a zero advantage adds nothing but tokens to the mean. AWSFT trains on every kept sample, as slime
        # does (weight 1 at advantage 0); TAU2_FILTER_ZERO_STD removes equal-reward groups on both paths.
        examples = [examples_from_trajectory(t.prompt_ids, t.response_ids, t.loss_mask, t.rollout_logprobs, a)
                    for t, s, a in zip(trajs, samples, advantages)
                    if not s.remove_sample and (a != 0.0 or algorithm == "awsft")]
        record = {"step": step + 1, "tasks": [task_key(s.metadata) for s in samples[::args.grpo_n]],
                  "raw_reward_mean": sum(raw) / len(raw),
                  "shaped_reward_mean": sum(s.reward for s in samples) / len(samples),
                  "success_rate": sum(r == 1.0 for r in raw) / len(raw),
                  "groups": len(batch), "groups_without_signal": tracker.zero_signal_groups - zero_before,
                  "trained_sequences": len(examples), "rollout_s": rollout_s,
                  "aborted": sum(s.status.name == "ABORTED" for s in samples),
                  "judge_calls": sum(t.judge_calls for t in trajs)}
        if examples:  # GRPO: every group all-equal (all solved or all failed) leaves nothing to learn from
            trainer.model.train()
            update = trainer.awsft_step(examples) if algorithm == "awsft" else trainer.grpo_step(examples)
            record.update({f"train_{k}": v for k, v in update.items() if isinstance(v, (int, float))})
        tracker.save(tracker_path)
        history.append(record)
        console.print(f"{algorithm} step {step + 1}/{args.grpo_steps}: reward {record['raw_reward_mean']:.3f} "
                      f"(shaped {record['shaped_reward_mean']:.3f}), {record['groups_without_signal']}/{len(batch)} "
                      f"groups without signal, trained on {len(examples)} sequences")
    trainer.save(dest)
    trainer.close()
    (out / f"{algorithm}_history.json").write_text(json.dumps(history, indent=1))
    return history


# -- CLI -----------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "tau2-rl-demo", __doc__.split("\n\n")[0],
        epilog="Writes <out>/report.json (every stage's numbers with counts), charts and each stage's Pass@K run, "
               "then prints the stage table; a stage whose output exists is skipped (rerun to resume). Scripted "
               "user: a plumbing and learning-signal check, not a tau2 score.")
    p.add_argument("--domain", default="mock", choices=DOMAINS)
    p.add_argument("--split", default=None, help="task split trained and evaluated on (default: mock base, else train)")
    p.add_argument("--eval-split", default=None, help="split evaluated on (default: mock base, else test)")
    p.add_argument("--out", type=Path, default=Path("outputs/demo"))
    p.add_argument("--model", default=None, help="starting HF model directory (default: build a tiny Qwen3)")
    p.add_argument("--tokenizer", default=None, help="tokenizer for the tiny model (default: train one locally)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("tiny model")
    g.add_argument("--hidden-size", type=int, default=128)
    g.add_argument("--num-layers", type=int, default=2)
    g.add_argument("--vocab-size", type=int, default=1024)
    g = p.add_argument_group("episodes")
    g.add_argument("--max-new-tokens", type=int, default=96, help="per policy turn")
    g.add_argument("--eval-samples", type=int, default=4, help="episodes per task at evaluation (k <= this)")
    g.add_argument("--eval-temperature", type=float, default=0.7)
    g = p.add_argument_group("SFT and RFT")
    g.add_argument("--sft-epochs", type=int, default=40)
    g.add_argument("--sft-lr", type=float, default=3e-3)
    g.add_argument("--micro-batch-size", type=int, default=4)
    g.add_argument("--rft-samples", type=int, default=4, help="episodes per training task sampled for RFT")
    g.add_argument("--rft-temperature", type=float, default=0.8)
    g.add_argument("--rft-epochs", type=int, default=10)
    g.add_argument("--rft-lr", type=float, default=1e-3)
    g = p.add_argument_group("GRPO / AWSFT (the policy stage)")
    g.add_argument("--algorithm", default="grpo", type=_algorithms,
                   help="the policy stage's loss: grpo (PPO-clip), awsft (advantage-weighted SFT), or both "
                        "(grpo,awsft: each from the RFT checkpoint, reported side by side)")
    g.add_argument("--grpo-steps", type=int, default=6)
    g.add_argument("--grpo-tasks-per-step", type=int, default=3)
    g.add_argument("--grpo-n", type=int, default=4, help="samples per task (the GRPO group)")
    g.add_argument("--grpo-lr", type=float, default=1e-4)
    g.add_argument("--grpo-temperature", type=float, default=1.0)
    g.add_argument("--kl-coef", type=float, default=0.01, help="low_var_kl to the starting checkpoint")
    g.add_argument("--entropy-coef", type=float, default=0.001)
    g.add_argument("--wandb-project", default=None, help="also log training to wandb (offline without a key)")
    add_config_args(p)
    return p


def _algorithms(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in ALGORITHMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(ALGORITHMS)} (comma-separated)")
    return names


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_turns is None and "TAU2_MAX_TURNS" not in os.environ:
        args.max_turns = DEMO_MAX_TURNS
    cfg = config_from_args(args)
    split = args.split or ("base" if args.domain == "mock" else "train")
    eval_split = args.eval_split or ("base" if args.domain == "mock" else "test")
    try:
        check_split(args.domain, split)
        check_split(args.domain, eval_split)
    except TaskLookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.model and not (Path(args.model) / "config.json").is_file():
        print(f"error: --model {args.model}: no config.json there; give a Hugging Face model directory, or leave "
              "--model out to build the tiny demo model", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    report.update({"domain": args.domain, "train_split": split, "eval_split": eval_split,
                   "note": "offline scripted user and a tiny model: a plumbing and learning-signal check, "
                           "not a tau2 score"})
    report.setdefault("stages", {})
    args.max_turns = cfg.max_turns
    t_start = time.perf_counter()

    def save() -> None:
        report["wall_s"] = report.get("wall_s", 0.0) + time.perf_counter() - save.t
        save.t = time.perf_counter()
        tmp = report_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(report_path)

    save.t = t_start
    base = prepare_model(args, out)
    checkpoints = {"base": base, "sft": out / "sft", "rft": out / "rft",
                   **{a: out / a / "model" for a in ALGORITHMS}}

    def evaluated(stage: str) -> None:
        if stage not in report["stages"]:
            summary = evaluate_stage(args, checkpoints[stage], out, stage, args.eval_samples, args.eval_temperature,
                                     eval_split)
            report["stages"][stage] = stage_numbers(summary, args.domain)
            save()

    evaluated("base")
    demos = None
    if not checkpoints["sft"].exists():
        console.rule("SFT on oracle demonstrations")
        demos = oracle_demonstrations(args.domain, split)
        report["sft"] = {**sft_stage(args, base, demos, checkpoints["sft"], out, args.sft_lr, args.sft_epochs),
                         "demonstrations": len(demos)}
        save()
    evaluated("sft")
    if not checkpoints["rft"].exists():
        console.rule("RFT: sample, keep successes, fine-tune")
        rows, stats = rft_stage(args, checkpoints["sft"], out, split)
        demos = demos if demos is not None else oracle_demonstrations(args.domain, split)
        merged = rows + demos  # RFT data merged with the seed (here: the oracle demonstrations)
        report["rft"] = {**stats, **sft_stage(args, checkpoints["sft"], merged, checkpoints["rft"], out,
                                              args.rft_lr, args.rft_epochs)}
        save()
    evaluated("rft")
    for algorithm in args.algorithm:
        if not checkpoints[algorithm].exists():
            console.rule(algorithm.upper())
            task_ids, report["grpo_tasks"] = grpo_task_ids(args, out, cfg, split)
            report[algorithm] = {"history": policy_stage(args, algorithm, checkpoints["rft"], checkpoints[algorithm],
                                                         out, cfg, task_ids, split)}
            save()
        evaluated(algorithm)
    report["charts"] = [str(p) for p in write_charts(report, out)]
    save()
    print_stage_table(report)
    base_p1, sft_p1 = (report["stages"][s]["pass@1"]["value"] for s in ("base", "sft"))
    print(f"SFT pass@1 {sft_p1:.3f} vs untrained pass@1 {base_p1:.3f}: SFT is "
          f"{'above' if sft_p1 > base_p1 else 'NOT above'} the untrained model")
    print(f"report {report_path}\ncharts {', '.join(report['charts'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
