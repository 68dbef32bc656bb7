"""The embedded default: the staged recipe (SFT -> RFT -> GRPO, each evaluated) on one machine, CPU or one GPU.

    python -m tau2_rl_pipeline.local.pipeline --domain mock --out outputs/demo      # what scripts/demo.sh runs
    python -m tau2_rl_pipeline.local.pipeline --algorithm grpo,awsft   # both policy stages from the RFT checkpoint

It runs the same episode, rollout, reward shaping, curriculum and group normalization as the slime run; only the
engine (in-process transformers instead of SGLang) and the trainer (tau2_rl_pipeline.local.trainer instead of Megatron)
differ. The user side is the offline ScriptedUser, so the numbers are a plumbing and learning-signal check, not
tau2 scores. Each stage's output under --out is recorded with the settings that made it and the tau2 version and
task set it ran on (stage_book.py): a rerun skips what is done with the same settings (and says so), resumes what is
unfinished (an evaluation's episodes, GRPO's finished steps), redoes what other settings change and refuses outputs
of another tau2 version or task set. The policy stage (GRPO, or AWSFT with --algorithm)
draws from the tasks whose RFT-sampling pass rate lies in the TAU2_GRPO_{MIN,MAX}_PASS_RATE band.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.tasks import DOMAINS, TaskLookupError, check_split, load_tasks
from tau2_rl_pipeline.benchmark.tau2_version import (
    BenchmarkMismatch,
    RetrievalVariantError,
    benchmark_id,
    check_retrieval_variant,
    needs_judge,
)
from tau2_rl_pipeline.config import (
    COUNT,
    LEARNING_RATE,
    SEED,
    TEMPERATURE,
    Bounded,
    ConfigError,
    Tau2Config,
    add_config_args,
    command_parser,
    config_from_args,
)
from tau2_rl_pipeline.files import atomic_write_bytes
from tau2_rl_pipeline.launch.recipe import POLICY_LOSS, starts_from
from tau2_rl_pipeline.local.demo_report import (
    ALGORITHMS,
    grpo_summary,
    print_stage_table,
    stage_comparisons,
    stage_numbers,
    stage_verdicts,
    summary_lines,
    write_charts,
)
from tau2_rl_pipeline.local.interrupt import answer_ctrl_c
from tau2_rl_pipeline.local.stage_book import SKIP, StageBook, StaleOutputError
from tau2_rl_pipeline.local.tiny_model import MIN_VOCAB_SIZE

if TYPE_CHECKING:
    from tau2_rl_pipeline.local.trainer import TrainConfig

DEMO_MAX_TURNS = 8  # unless --max-turns or TAU2_MAX_TURNS say otherwise: mock tasks take 2-3 policy turns
DEMO_TASK_SAMPLER = "learning_value"  # unless --task-sampler or TAU2_TASK_SAMPLER say otherwise (see main)
# Config fields that change how fast episodes run, or the LLM user the scripted user replaces, never an outcome.
NOT_OUTCOME = {"episode_workers", "fast_env", "user_model", "user_api_base", "user_temperature", "user_max_retries",
               "user_timeout_s", "user_strategy", "user_strategy_max_checks", "curriculum_state_path",
               "slime_gc_policy"}
# Config fields only the policy stage reads (its task band, the judge reward): they redo it, not RFT or evaluations.
POLICY_ONLY = {"grpo_min_pass_rate", "grpo_max_pass_rate", "use_judge", "judge_weight", "loss_reduction"}
NUM_HEADS = 4  # the tiny model's attention heads (2 key-value heads)
# Its width: NUM_HEADS heads of an even size (rotary embeddings rotate pairs of dimensions).
HIDDEN_SIZE = Bounded(int, at_least=2 * NUM_HEADS, multiple_of=2 * NUM_HEADS, why=f"{NUM_HEADS} heads of an even size")
COEFFICIENT = Bounded(float, at_least=0.0)
console = Console(stderr=True)


def say(line: str) -> None:
    """One progress line on stderr, unwrapped and flushed (a log reads it as it comes)."""
    print(line, file=sys.stderr, flush=True)


class StageFailed(RuntimeError):
    """A stage's subprocess failed or was interrupted; it has said why on stderr already."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


# -- stages ----------------------------------------------------------------------------------------------------
def prepare_model(args, out: Path) -> Path:
    """The starting checkpoint: --model as given, or a tiny Qwen3 built (cached) with a tokenizer trained here."""
    if args.model:
        return Path(args.model)
    from transformers import AutoTokenizer

    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer

    if args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        tokenizer = train_small_tokenizer(domain_corpus([args.domain]), out / "tokenizer", vocab_size=args.vocab_size)
    return build_tiny_qwen3(out / "base", tokenizer, hidden_size=args.hidden_size, num_layers=args.num_layers,
                            num_heads=NUM_HEADS, num_kv_heads=2, intermediate_size=args.hidden_size * 3, seed=args.seed)


def train_config(args, out: Path, lr: float, epochs: int = 1) -> TrainConfig:
    from tau2_rl_pipeline.local.trainer import TrainConfig

    return TrainConfig(log_jsonl=out / "metrics.jsonl", lr=lr, epochs=epochs, device=args.device, seed=args.seed,
                       micro_batch_size=args.micro_batch_size, grad_accum_steps=1, weight_decay=0.0,
                       wandb_project=args.wandb_project)


def resume_dir(dest: Path) -> Path:
    """Where SFT training into `dest` keeps its state until `dest` is saved (a rerun continues from it)."""
    return dest.with_name(dest.name + ".resume")


def sft_stage(args, start: Path, rows: list[dict], dest: Path, out: Path, lr: float, epochs: int) -> dict:
    from tau2_rl_pipeline.local.examples import sft_example_from_chat
    from tau2_rl_pipeline.local.trainer import LocalTrainer

    if dest.exists():  # saved by a run stopped before it recorded the result: trained again for its numbers
        shutil.rmtree(dest)
    with answer_ctrl_c(interrupted_line(out)):  # a backward pass holds KeyboardInterrupt for seconds
        trainer = LocalTrainer(start, train_config(args, out, lr, epochs))
        examples = [sft_example_from_chat(trainer.tokenizer, row["messages"], row.get("tools")) for row in rows]
        before = trainer.loss_before(examples, resume_dir(dest))  # kept there: a resume does not repeat it
        trainer.sft(examples, resume_dir=resume_dir(dest))  # resumes a stopped run's last saved step
        after = trainer.evaluate(examples)
        trainer.save(dest)
        trainer.close()
    shutil.rmtree(resume_dir(dest), ignore_errors=True)
    return {"examples": len(examples), "loss_before": before, "loss_after": after}


def evaluate_stage(args, model_dir: Path, out: Path, stage: str, num_samples: int, temperature: float,
                   split: str, output_name: str | None = None) -> dict:
    """Run tau2_rl_pipeline/eval/eval_passk.py on a checkpoint (its own process: the same CLI users run; it resumes its own
    episode file)."""
    output = eval_output(out, output_name or stage)
    cmd = [sys.executable, "-m", "tau2_rl_pipeline.eval.eval_passk", "--backend", "local", "--model", str(model_dir),
           "--device", args.device, "--user", "scripted", "--domains", args.domain, "--task-split", split,
           "--num-samples", str(num_samples), "--temperature", str(temperature), "--top-p", "1.0", "--top-k", "-1",
           "--max-new-tokens", str(args.max_new_tokens), "--max-turns", str(args.max_turns),
           "--seed", str(args.seed), "--concurrency", "8", "--output", str(output)]
    console.print(f"[bold]evaluate {stage}[/bold]: python {' '.join(cmd[1:])}")
    run_child(cmd, f"evaluation of {stage}")
    return json.loads(output.read_text())


def run_child(cmd: list[str], what: str) -> None:
    """Run a child process to the end. Ctrl-C reaches it too (same process group): it reports what it kept in one
    line and exits, and this process then stops without a line of its own."""
    proc = subprocess.Popen(cmd)  # in the caller's directory, where the relative --out and --model paths are
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        raise StageFailed("", 130) from None
    if code == -signal.SIGINT or code == 130:
        raise StageFailed("", 130)
    if code != 0:
        raise StageFailed(f"{what} failed (exit {code}); see its messages above", code)


def eval_output(out: Path, name: str) -> Path:
    return out / "eval" / f"{name}.json"


def eval_files(out: Path, name: str) -> list[Path]:
    """Every file the evaluator writes for the output `name` (summary, episodes, chart, tau2 results)."""
    return sorted((out / "eval").glob(f"{name}.*"))


def rft_stage(args, sft_dir: Path, out: Path, split: str) -> tuple[list[dict], dict]:
    """Sample N episodes per training task from the SFT model (the evaluator's machinery), keep the successes."""
    from tau2_rl_pipeline.eval.episodes_file import read_episodes
    from tau2_rl_pipeline.selection.rft import select_rft

    summary = evaluate_stage(args, sft_dir, out, "rft-sampling", args.rft_samples, args.rft_temperature, split,
                             output_name="rft_samples")
    records = list(read_episodes(eval_output(out, "rft_samples").with_suffix(".json.episodes.jsonl")).values())
    rows = select_rft(records, allow_partial=False)
    return rows, {"sampled_episodes": len(records), "kept": len(rows),
                  "sampling": stage_numbers(summary, args.domain)}


# -- CLI -----------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = command_parser(
        "tau2-rl-demo", __doc__.split("\n\n")[0],
        epilog="Writes <out>/report.json, charts and each stage's Pass@K run; a rerun skips, resumes or redoes each "
               f"stage and says which (docs/demo.md). Unless set, --max-turns {DEMO_MAX_TURNS} and --task-sampler "
               f"{DEMO_TASK_SAMPLER}. Scripted user: a plumbing check, not a tau2 score.")
    p.add_argument("--domain", default="mock", choices=DOMAINS)
    p.add_argument("--split", default=None, help="task split trained and evaluated on (default: mock base, else train)")
    p.add_argument("--eval-split", default=None, help="split evaluated on (default: mock base, else test)")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: outputs/demo for mock, outputs/demo-<domain> otherwise)")
    p.add_argument("--model", default=None, help="starting HF model directory (default: build a tiny Qwen3)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--seed", type=SEED, default=0)
    g = p.add_argument_group("tiny model", more=True)
    g.add_argument("--tokenizer", default=None, help="tokenizer for the tiny model (default: train one locally)")
    g.add_argument("--hidden-size", type=HIDDEN_SIZE, default=128)
    g.add_argument("--num-layers", type=COUNT, default=2)
    g.add_argument("--vocab-size", type=Bounded(int, at_least=MIN_VOCAB_SIZE, why="256 byte tokens and the Qwen3 markers"),
                   default=1024)
    g = p.add_argument_group("episodes", more=True)
    g.add_argument("--max-new-tokens", type=COUNT, default=96, help="per policy turn")
    g.add_argument("--eval-samples", type=COUNT, default=4, help="episodes per task at evaluation (k <= this)")
    g.add_argument("--eval-temperature", type=TEMPERATURE, default=0.7)
    g = p.add_argument_group("SFT and RFT", more=True)
    g.add_argument("--sft-epochs", type=COUNT, default=40)
    g.add_argument("--sft-lr", type=LEARNING_RATE, default=3e-3)
    g.add_argument("--micro-batch-size", type=COUNT, default=4)
    g.add_argument("--rft-samples", type=COUNT, default=4, help="episodes per training task sampled for RFT")
    g.add_argument("--rft-temperature", type=TEMPERATURE, default=0.8)
    g.add_argument("--rft-epochs", type=COUNT, default=10)
    g.add_argument("--rft-lr", type=LEARNING_RATE, default=1e-3)
    p.add_argument("--algorithm", default="grpo", type=_algorithms, metavar="NAMES",
                   help="the policy stage: grpo, awsft (advantage-weighted SFT), or both: grpo,awsft")
    g = p.add_argument_group("GRPO / AWSFT: the policy stage", more=True)
    g.add_argument("--grpo-steps", type=COUNT, default=6)
    g.add_argument("--grpo-tasks-per-step", type=COUNT, default=3)
    g.add_argument("--grpo-n", type=Bounded(int, at_least=2, why="a group of one has no advantage"), default=8,
                   help="samples per task (the GRPO group)")
    g.add_argument("--grpo-lr", type=LEARNING_RATE, default=1e-4)
    g.add_argument("--grpo-temperature", type=TEMPERATURE, default=1.0)
    g.add_argument("--kl-coef", type=COEFFICIENT, default=POLICY_LOSS.kl_coef, help="low_var_kl to the starting checkpoint")
    g.add_argument("--entropy-coef", type=COEFFICIENT, default=POLICY_LOSS.entropy_coef)
    g.add_argument("--wandb-project", default=None, help="also log training to wandb (offline without a key)")
    add_config_args(p)
    return p


def _algorithms(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in ALGORITHMS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(ALGORITHMS)} (comma-separated)")
    return names


def stage_settings(args, cfg: Tau2Config, split: str, eval_split: str) -> dict[str, dict]:
    """For each stage and each evaluation, the settings its output depends on, those of earlier stages included.
    Each policy stage (--algorithm) starts from the RFT checkpoint (the recipe's stage graph), so GRPO's settings are
    AWSFT's but its name."""
    config = asdict(cfg)
    episodes = {name: value for name, value in config.items() if name not in NOT_OUTCOME | POLICY_ONLY}
    episodes.update(max_new_tokens=args.max_new_tokens)
    base = {"domain": args.domain, "model": args.model, "tokenizer": args.tokenizer, "hidden_size": args.hidden_size,
            "num_layers": args.num_layers, "vocab_size": args.vocab_size, "seed": args.seed}
    own = {"sft": {"train_split": split, "sft_epochs": args.sft_epochs, "sft_lr": args.sft_lr,
                   "micro_batch_size": args.micro_batch_size},
           "rft": {**episodes, "rft_samples": args.rft_samples, "rft_temperature": args.rft_temperature,
                   "rft_epochs": args.rft_epochs, "rft_lr": args.rft_lr}}
    policy = {**{name: config[name] for name in sorted(POLICY_ONLY)},
              "grpo_steps": args.grpo_steps, "grpo_tasks_per_step": args.grpo_tasks_per_step,
              "grpo_n": args.grpo_n, "grpo_lr": args.grpo_lr, "grpo_temperature": args.grpo_temperature,
              "kl_coef": args.kl_coef, "entropy_coef": args.entropy_coef}
    evaluation = {**episodes, "eval_split": eval_split, "eval_samples": args.eval_samples,
                  "eval_temperature": args.eval_temperature}
    made = {"base": base}
    for stage in ("sft", "rft", *args.algorithm):  # each stage's settings on top of those of the stage it starts from
        made[stage] = {**made[starts_from(stage)], **own.get(stage, policy)}
    return {**made, **{f"eval {stage}": {**settings, **evaluation} for stage, settings in made.items()}}


def run_benchmark(domain: str, split: str, eval_split: str, retrieval_variant: str) -> dict[str, str]:
    """The tau2 version and the hash of the tasks a run trains and evaluates on, with banking_knowledge's retrieval
    variant (recorded with every stage)."""
    return benchmark_id({domain: [*load_tasks(domain, split), *load_tasks(domain, eval_split)]}, retrieval_variant)


def run_stages(args, cfg: Tau2Config, split: str, eval_split: str, benchmark: dict[str, str]) -> dict:
    """Every stage in order, each skipped, resumed or redone as its record says; returns the report. Outputs of
    another tau2 version or task set are refused (BenchmarkMismatch) before anything is written."""
    # The training stack (torch, tau2's orchestrator, litellm) loads here, not at import: --help answers at once.
    from tau2_rl_pipeline.learning.oracle_demos import oracle_demonstrations
    from tau2_rl_pipeline.local.grpo import GrpoSettings, difficulty_task_ids, grpo_stage

    out = args.out
    book = StageBook(out, benchmark)
    settings = stage_settings(args, cfg, split, eval_split)
    book.claim()
    base = prepare_model(args, out)
    checkpoints = {"base": base, "sft": out / "sft", "rft": out / "rft",
                   **{algorithm: out / algorithm / "model" for algorithm in ALGORITHMS}}

    def stage(name: str, outputs: list[Path], work, also_remove: list[Path] = ()):
        plan = book.plan(name, settings[name], outputs, also_remove)
        say(plan.message + (f" ({', '.join(map(str, outputs))})" if plan.action == SKIP else ""))
        if plan.action == SKIP:
            return plan.result
        t0 = time.perf_counter()
        result = work()
        book.finish(name, {**result, "wall_s": time.perf_counter() - t0})
        return book.records[name]["result"]

    def evaluated(name: str) -> dict:
        return stage(f"eval {name}", [eval_output(out, name)], lambda: stage_numbers(evaluate_stage(
            args, checkpoints[name], out, name, args.eval_samples, args.eval_temperature, eval_split), args.domain),
            eval_files(out, name))

    report = {"domain": args.domain, "train_split": split, "eval_split": eval_split,
              "note": "offline scripted user and a tiny model: a plumbing and learning-signal check, not a tau2 score",
              "settings": settings[args.algorithm[-1]], "stages": {}}
    report["stages"]["base"] = evaluated("base")

    def sft_work() -> dict:
        console.rule("SFT on oracle demonstrations")
        demos = oracle_demonstrations(args.domain, split)
        return {**sft_stage(args, checkpoints[starts_from("sft")], demos, checkpoints["sft"], out, args.sft_lr,
                            args.sft_epochs),
                "demonstrations": len(demos)}

    report["sft"] = stage("sft", [checkpoints["sft"]], sft_work, [resume_dir(checkpoints["sft"])])
    report["stages"]["sft"] = evaluated("sft")

    def rft_work() -> dict:
        console.rule("RFT: sample, keep successes, fine-tune")
        start = checkpoints[starts_from("rft")]  # the policy that samples RFT's data is the one RFT starts from
        rows, stats = rft_stage(args, start, out, split)
        merged = rows + oracle_demonstrations(args.domain, split)  # RFT data merged with the seed (the oracle's)
        return {**stats, **sft_stage(args, start, merged, checkpoints["rft"], out, args.rft_lr, args.rft_epochs)}

    report["rft"] = stage("rft", [checkpoints["rft"]], rft_work,
                          [*eval_files(out, "rft_samples"), resume_dir(checkpoints["rft"])])
    report["stages"]["rft"] = evaluated("rft")

    def policy_work(algorithm: str) -> dict:
        console.rule(algorithm.upper())
        rft_episodes = eval_output(out, "rft_samples").with_suffix(".json.episodes.jsonl")
        task_ids, band, baselines = difficulty_task_ids(args.domain, split, rft_episodes, cfg)
        say(f"{algorithm}: {band.line()}")
        with answer_ctrl_c(interrupted_line(out)):  # its training steps hold KeyboardInterrupt as SFT's do
            history = grpo_stage(GrpoSettings(
                domain=args.domain, split=split, steps=args.grpo_steps, tasks_per_step=args.grpo_tasks_per_step,
                n=args.grpo_n, lr=args.grpo_lr, temperature=args.grpo_temperature, max_new_tokens=args.max_new_tokens,
                kl_coef=args.kl_coef, entropy_coef=args.entropy_coef, micro_batch_size=args.micro_batch_size,
                seed=args.seed, device=args.device, wandb_project=args.wandb_project, algorithm=algorithm,
                task_ids=tuple(task_ids), baselines=tuple(sorted(baselines.items()))),
                checkpoints[starts_from(algorithm)], checkpoints[algorithm], out / algorithm, cfg, out / "metrics.jsonl",
                say)
        return {**grpo_summary(history), "grpo_tasks": asdict(band)}

    for algorithm in args.algorithm:  # each from its start in the recipe (RFT's checkpoint), reported side by side
        report[algorithm] = stage(algorithm, [checkpoints[algorithm]], partial(policy_work, algorithm),
                                  [out / algorithm])
        report["stages"][algorithm] = evaluated(algorithm)
    report["wall_s"] = sum(r["result"].get("wall_s", 0.0) for r in book.records.values() if r.get("result"))
    return report


def interrupted_line(out: Path) -> str:
    """What Ctrl-C leaves, said once: by main, or by answer_ctrl_c when a training step holds the main thread."""
    from tau2_rl_pipeline.local.trainer import SFT_SAVE_EVERY_S

    return (f"interrupted: finished stages, evaluation episodes, GRPO steps and SFT/RFT training (saved every "
            f"{SFT_SAVE_EVERY_S:.0f} s) are kept in {out}; rerun the same command to resume")


def default_out(domain: str) -> Path:
    """The demo's folder: outputs/demo for mock (what scripts/demo.sh and the README's commands read), one per
    other domain, so `--domain airline` after the demo starts its own run instead of meeting the mock one's."""
    return Path("outputs/demo" if domain == "mock" else f"outputs/demo-{domain}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_turns is None and "TAU2_MAX_TURNS" not in os.environ:
        args.max_turns = DEMO_MAX_TURNS
    if args.task_sampler is None and "TAU2_TASK_SAMPLER" not in os.environ:
        args.task_sampler = DEMO_TASK_SAMPLER  # draw the tasks GRPO can learn from (mixed outcomes) more often
    split = args.split or ("base" if args.domain == "mock" else "train")
    eval_split = args.eval_split or ("base" if args.domain == "mock" else "test")
    try:
        cfg = config_from_args(args)
        check_split(args.domain, split)
        check_split(args.domain, eval_split)
        check_retrieval_variant([args.domain], cfg.retrieval_variant)
        if any(needs_judge(t) for s in (split, eval_split) for t in load_tasks(args.domain, s)):
            judge.check_judge(cfg)  # tau2 1.0.1's judged retail: a remote judge without an API key, before any work
    except (ConfigError, TaskLookupError, RetrievalVariantError, judge.JudgeConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.model and not (Path(args.model) / "config.json").is_file():
        print(f"error: --model {args.model}: no config.json there; give a Hugging Face model directory, or leave "
              "--model out to build the tiny demo model", file=sys.stderr)
        return 2
    args.out = args.out or default_out(args.domain)
    report_path = args.out / "report.json"
    benchmark = run_benchmark(args.domain, split, eval_split, cfg.retrieval_variant)
    args.max_turns = cfg.max_turns
    try:
        report = run_stages(args, cfg, split, eval_split, benchmark)
        report["benchmark"] = benchmark
        report["comparisons"] = stage_comparisons(args.out / "eval", list(report["stages"]))
        report["charts"] = [str(p) for p in write_charts(report, args.out)]
        atomic_write_bytes(report_path, json.dumps(report, indent=1).encode())
    except (StaleOutputError, BenchmarkMismatch) as e:  # outputs of something else, or graded by another tau2
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # --out not writable, a file where a folder goes, the disk full: one line, no traceback
        print(f"error: --out {args.out}: cannot write {e.filename or args.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    except StageFailed as e:
        if e.returncode != 130:
            print(f"error: {e}", file=sys.stderr)
        return e.returncode
    except KeyboardInterrupt:
        print(interrupted_line(args.out), file=sys.stderr)
        return 130
    print_stage_table(report)
    print("\n".join(summary_lines(report)))
    print("\n".join(stage_verdicts(report)))
    print(f"report {report_path}\ncharts {', '.join(report['charts'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
