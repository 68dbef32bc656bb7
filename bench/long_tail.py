"""Issue 13, P6: the long tail, measured. One rollout step of slime's real rollout code, synchronous vs. over-sampling
vs. partial rollout, when the number of policy turns per episode has a long tail.

    .venv/bin/python bench/long_tail.py            # as reported: 8 groups x 4 samples, 6 steps a mode, 0.5 s a call
    .venv/bin/python bench/long_tail.py --latency 1.0 --tail-rate 0.1 --steps 3 --json out.json

What runs: slime 624b824's own `generate_rollout` (slime/rollout/sglang_rollout.py) with its real data source
(`RolloutDataSourceWithBuffer`), its over-sampling and end-of-rollout abort, calling this project's custom generate
`tau2_rl_pipeline.slime_plugins.adapter.generate`: real tau2 episodes (mock domain, fast_env, real evaluation), tau2's LLM
user through litellm, the policy through `SGLangEngine`. The model server is the loopback server
(tests/support/loopback_server.py: SGLang's HTTP contract, its abort included) in a process of its own
(bench/long_tail_server.py, which holds the script below); every model call (policy `/generate` and user chat)
waits `--latency` seconds there. It answers scripted replies with a constant log-prob and no prefix-cache lookup:
with its teacher-forced scoring (`--score`) it spent ~24 ms of CPU a call and, on 2 cores, set the pace of the
over-sampled steps, a cost SGLang pays on GPU hosts, not on the rollout machine. The tables report both
processes' CPU per step. slime and Megatron-LM come from ../shared/third_party (or $TAU2_THIRD_PARTY), put on
sys.path by the contract tier's own module (tests/contract/contract_tier.py), whose harness (slime_harness.py)
parses the argv with slime's real parser.

The turns: each prompt row is a copy of tau2's mock task create_task_1 whose user instructions carry the row's
drawn number of policy turns. The draw is the empirical distribution of gold-implied turns over tau2's airline,
retail and telecom train splits (178 tasks): one policy turn per gold action (an agent tool call, or an
instruction to the user for telecom's user-side actions) plus two (one answering the user's opening, one closing
reply): 2 to 15 turns, median 6, mean 6.5, one task in ten 12 or more. Gold actions are a lower bound for a real
policy, and a policy in training also loops: each episode, independently, with probability `--tail-rate` (0.05)
never closes and runs to the turn cap (TAU2_MAX_TURNS, 30 by default), ending truncated. The tail rate is an
assumption, not a measurement. A row keeps its turns when slime hands it out again (partial rollout); the tail
coin is tossed per episode.

The script: the user's first message states the episode's turns ("Hello, I need 7 steps." or "... keep going."),
the policy calls mock's read-only `get_users` until one turn is left, then answers "Done.", and the user stops.

Modes, each from a fresh slime state and data source over the same rows:
  sync          --rollout-batch-size groups submitted, the step waits for all of them;
  over-sampling --over-sampling-batch-size 2x: the first groups to finish fill the batch, slime aborts the rest
                (the project's generate ends them at once) and drops them: their prompts are never trained on;
  partial-restart  the same plus --partial-rollout, with TAU2_PARTIAL_RESUME=0: aborted groups go back to slime's
                buffer and come first next step, and the project's generate starts a cut episode again from its
                first turn (what it did before episodes were resumed): the turns the abort cut are thrown away
                when it does; what partial rollout keeps is the prompts and the samples of a group that had
                completed;
  partial       --partial-rollout as the stage script runs it (TAU2_PARTIAL_RESUME=1, the default): a cut episode
                goes on where it was cut when slime hands it back (tau2_rl_pipeline/slime_plugins/partial_rollout.py).
Steady state of partial rollout: the mean of its steps after the first (which starts with an empty buffer).
A turn in the books is one policy request: a turn cut in flight and its continuation count as two.
Exits 0 and prints two markdown tables (walls side by side, then the books); 1 with one line if slime's sources
or the contract tier's packages are missing.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable as a script from anywhere
sys.path[1:1] = [str(ROOT / "tests"), str(ROOT / "tests" / "contract")]  # the contract tier's path logic + harness
sys.path.insert(1, str(Path(__file__).resolve().parent))

from long_tail_server import row_mark  # noqa: E402

TEMPLATE_TASK = "create_task_1"
GOLD_DOMAINS = ("airline", "retail", "telecom")
MODES = ("sync", "over-sampling", "partial-restart", "partial")
SERVER = Path(__file__).resolve().parent / "long_tail_server.py"


# ---------------------------------------------------------------------------------------------------------------
# The turn distribution (pure once the tasks are loaded)


def gold_turns(domains=GOLD_DOMAINS, split: str = "train") -> list[int]:
    """Policy turns each train task implies: one per gold action (agent tool calls and the user's own actions,
    which the agent has to ask for), plus an opening and a closing turn."""
    from tau2_rl_pipeline.benchmark.tasks import load_tasks

    turns = []
    for domain in domains:
        for task in load_tasks(domain, split):
            criteria = task.evaluation_criteria
            turns.append(len((criteria.actions or []) if criteria else []) + 2)
    return turns


def row_turns(population: list[int], rows: int, seed: int) -> list[int]:
    """Each prompt row's turns, drawn with replacement from the gold-implied turns."""
    rng = random.Random(seed)
    return [rng.choice(population) for _ in range(rows)]


# ---------------------------------------------------------------------------------------------------------------
# The model server (bench/long_tail_server.py, its own process)


class ServerProcess:
    def __init__(self, model_dir: Path, cfg: argparse.Namespace) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(model_dir), "--latency", str(cfg.latency), "--seed",
             str(cfg.seed), "--tail-rate", str(cfg.tail_rate), *(["--score"] if cfg.score else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the loopback server process did not start (said {line!r})")
        self.router = f"127.0.0.1:{int(line.split()[1])}"

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


# ---------------------------------------------------------------------------------------------------------------
# The measured process


def register_rows(turns: list[int]) -> list[dict]:
    """Copies of mock's create_task_1 added to tau2's mock task set (this process only), one per prompt row, the
    row's turns in the user's instructions; returns slime's prompt rows for them."""
    from tau2.registry import registry

    from tau2_rl_pipeline.benchmark import tasks

    original = registry.get_tasks_loader("mock")
    template = next(t for t in original() if t.id == TEMPLATE_TASK)
    copies = []
    for row, n in enumerate(turns):
        scenario = template.user_scenario.model_copy(update={
            "instructions": f"{template.user_scenario.instructions} {row_mark(row, n)}"})
        copies.append(template.model_copy(update={"id": f"long_tail_{row:03d}", "user_scenario": scenario}))
    registry._tasks["mock"] = lambda split=None: [*original(split), *copies]  # tau2 refuses a second register
    for cached in (tasks._load, tasks._index, tasks._split_hash):
        cached.cache_clear()
    benchmark = tasks.split_benchmark("mock", "base")  # the task set with the copies, as the rollout checks it
    return [{"input": f"long-tail row {row}",
             "metadata": {"domain": "mock", "split": "base", "task_id": t.id, "benchmark": benchmark}}
            for row, t in enumerate(copies)]


def recording_source(args):
    """slime's RolloutDataSourceWithBuffer that remembers every sample it hands out in the current step, with what it
    held then (a sample the adapter rewrites gets a new metadata dict: that is how a run is seen; its policy requests
    so far: one weight version each), and how often each prompt (group index) has been handed out in all."""
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    class Recording(RolloutDataSourceWithBuffer):
        def __init__(self, args) -> None:
            super().__init__(args)
            self.handed: list[tuple[object, object, int]] = []
            self.times_handed: Counter[int] = Counter()

        def get_samples(self, num_samples: int):
            groups = super().get_samples(num_samples)
            self.handed.extend((s, s.metadata, requests(s)) for g in groups for s in g)
            self.times_handed.update(g[0].group_index for g in groups)
            return groups

    return Recording(args)


def requests(sample) -> int:
    """The policy requests a sample's episode has made (the adapter books one weight version per request)."""
    return len(sample.weight_versions or ())


def step_counts(handed: list, batch: list, kept: set[int], buffered: list) -> dict:
    """One step's books, in policy requests ("turns"). Every episode run this step is trained now, cut by slime's
    abort, or finished in a group that did not make the batch. A cut episode's turns are thrown away when its group
    is dropped (no --partial-rollout) or when it is started again after slime hands it back (TAU2_PARTIAL_RESUME=0);
    resumed, they are trained with it. A finished episode outside the batch is kept when its group went back to
    slime's buffer (`kept`: group indices, --partial-rollout) and trained in a later step, else thrown away (also
when its group, handed out again, is dropped then without the episode being run again). Turns in
    the buffer at the end (`buffered`: its samples) are neither. Prompts handed out are trained, back in the buffer,
    or dropped: without --partial-rollout every group past the batch; with it, a group that finished in the same
    wake-up as the one that filled the batch (slime/rollout/sglang_rollout.py:439-441 keeps neither)."""
    in_batch = {id(s) for s in batch}
    ran = [(s, before, r) for s, before, r in handed if s.metadata is not before]
    continued = [(s, r) for s, before, r in ran if s.metadata.get("resumes", 0) > (before or {}).get("resumes", 0)]
    restarted_turns = sum(r for s, before, r in ran if r and s.metadata.get("resumes", 0) == 0)
    ran_ids = {id(s) for s, _, _ in ran}
    cut = [s for s, _, _ in ran if s.status.name == "ABORTED"]
    finished_out = [s for s, _, _ in ran if s.status.name != "ABORTED" and id(s) not in in_batch]
    lost = [s for s in cut + finished_out if s.group_index not in kept]
    # finished in an earlier step and handed out again with its group, not run again: lost when the group is dropped
    lost += [s for s, _, _ in handed if id(s) not in ran_ids and id(s) not in in_batch and s.group_index not in kept]

    groups = {s.group_index for s, _, _ in handed}
    trained_groups = {s.group_index for s in batch}
    return {
        "episodes_run": len(ran), "episodes_trained": len(batch),
        "episodes_trained_from_earlier_steps": sum(id(s) not in ran_ids for s in batch),
        "episodes_continued": len(continued),
        "episodes_run_after_a_cut": sum((before or {}).get("termination_reason") == "rollout_stopped"
                                        for _, before, _ in ran),
        "episodes_cut": len(cut), "episodes_finished_not_trained": len(finished_out),
        "episodes_finished_thrown_away": sum(s.group_index not in kept for s in finished_out),
        "episodes_truncated": sum(s.status.name == "TRUNCATED" for s in batch),
        "turns_run": sum(requests(s) for s, _, _ in ran) - sum(r for _, r in continued),
        "turns_trained": sum(requests(s) for s in batch),
        # sampled in an earlier step (older weights): what --mask-offpolicy-in-partial-rollout takes out of the loss
        "turns_trained_from_earlier_steps": sum(requests(s) for s in batch if id(s) not in ran_ids)
        + sum(r for s, r in continued if id(s) in in_batch),
        "turns_thrown_away": sum(requests(s) for s in lost) + restarted_turns,
        "turns_in_buffer": sum(requests(s) for s in buffered),
        "prompt_hand_outs": len(groups), "prompts_trained": len(trained_groups),
        "prompts_dropped": len(groups - trained_groups - kept), "prompts_in_buffer": len(kept),
        "trained": [[s.metadata["task_id"], s.metadata["turns"], s.status.name] for s in batch],
    }


def run_mode(mode: str, cfg: argparse.Namespace, model_dir: Path, rows_path: Path,
             server: ServerProcess) -> dict:
    """`cfg.steps` rollout steps of one mode through slime's generate_rollout, from a fresh slime state."""
    from slime_harness import flat, reset_slime, rollout, slime_args

    extra = []
    if mode != "sync":
        extra += ["--over-sampling-batch-size", str(cfg.groups * cfg.over_sampling)]
    if mode.startswith("partial"):
        extra += ["--partial-rollout", "--use-tis"]  # TIS, not the mask: the books count what older weights sampled
    os.environ["TAU2_PARTIAL_RESUME"] = "0" if mode == "partial-restart" else "1"
    reset_slime()
    server_cpu = server.ask("reset")["cpu_s"]
    args = slime_args(model_dir, rows_path, server.router, batch=cfg.groups, n=cfg.samples, extra=tuple(extra))
    source = recording_source(args)
    own_cpu = time.process_time()
    steps = []
    for step in range(cfg.steps):
        source.handed = []
        t0 = time.perf_counter()
        output, _ = rollout(args, step, source)
        wall = time.perf_counter() - t0
        counts = step_counts(source.handed, flat(output.samples), {g[0].group_index for g in source.buffer},
                             [s for g in source.buffer for s in g])
        steps.append({"wall_s": wall, **counts})
        print(f"[long_tail] {mode:13s} step {step + 1}/{cfg.steps}: {wall:6.2f} s, {counts['episodes_run']} "
              f"episodes run, {counts['episodes_cut']} cut by the abort, {counts['turns_run']} turns", file=sys.stderr,
              flush=True)
    own_cpu = time.process_time() - own_cpu
    served = server.ask("stats")
    reset_slime()
    measured = steps[1:] if mode.startswith("partial") and len(steps) > 1 else steps
    totals = {k: sum(s[k] for s in steps) for k in steps[0]
              if k not in ("wall_s", "prompts_in_buffer", "turns_in_buffer", "trained")}
    return {"mode": mode, "steps": steps, "measured_steps": len(measured),
            "wall_s_per_step": statistics.fmean(s["wall_s"] for s in measured), **totals,
            "prompts_in_buffer_at_end": steps[-1]["prompts_in_buffer"],
            "turns_in_buffer_at_end": steps[-1]["turns_in_buffer"],
            "most_hand_outs_of_one_prompt": max(source.times_handed.values()),
            "hand_outs_of_prompts_left_in_buffer": sorted((source.times_handed[g[0].group_index]
                                                           for g in source.buffer), reverse=True),
            "generate_calls_served": served["generate"], "user_calls_served": served["chat"],
            "tail_episodes": served["tail_episodes"], "server_cpu_s": served["cpu_s"] - server_cpu,
            "bench_cpu_s": own_cpu}


def build_model(out: Path) -> Path:
    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer

    return build_tiny_qwen3(out / "tiny", train_small_tokenizer(domain_corpus(["mock"]), out / "tokenizer"))


WALL_COLUMNS = ("mode", "steps measured", "wall per step (mean)", "vs sync", "walls of each step",
                "CPU per step: rollout process / model server")
BOOK_COLUMNS = ("mode", "episodes run (continued)", "trained (from earlier steps)", "cut by the abort",
                "finished, group not trained (thrown away)", "tail episodes", "truncated in batch", "policy turns run",
                "turns trained (sampled in an earlier step)", "turns thrown away", "turns in the buffer at end", "mean turns per trained episode",
                "prompt hand-outs",
                "trained / dropped / back to buffer at end",
                "most hand-outs of one prompt (of each left in the buffer)")


def _markdown(columns: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(row) + " |" for row in rows)]


def table(results: list[dict], cfg: argparse.Namespace) -> str:
    """Two markdown tables: wall time per step side by side, then the books of every step run."""
    sync = results[0]["wall_s_per_step"]
    walls, books = [], []
    for r in results:
        n = len(r["steps"])
        walls.append([r["mode"], f"{r['measured_steps']} of {n}", f"{r['wall_s_per_step']:.2f} s",
                      f"**{sync / r['wall_s_per_step']:.2f}x**", " ".join(f"{s['wall_s']:.1f}" for s in r["steps"]),
                      f"{r['bench_cpu_s'] / n:.2f} s / {r['server_cpu_s'] / n:.2f} s"])
        left = " ".join(map(str, r["hand_outs_of_prompts_left_in_buffer"]))
        books.append([
            r["mode"], f"{r['episodes_run']} ({r['episodes_continued']})",
            f"{r['episodes_trained']} ({r['episodes_trained_from_earlier_steps']})",
            str(r["episodes_cut"]), f"{r['episodes_finished_not_trained']} ({r['episodes_finished_thrown_away']})",
            str(r["tail_episodes"]), str(r["episodes_truncated"]), str(r["turns_run"]),
            f"{r['turns_trained']} ({r['turns_trained_from_earlier_steps']})",
            str(r["turns_thrown_away"]), str(r["turns_in_buffer_at_end"]),
            f"{r['turns_trained'] / max(1, r['episodes_trained']):.1f}",
            str(r["prompt_hand_outs"]),
            f"{r['prompts_trained']} / {r['prompts_dropped']} / {r['prompts_in_buffer_at_end']}",
            f"{r['most_hand_outs_of_one_prompt']}" + (f" ({left})" if left else "")])
    note = (f"{cfg.groups} groups x {cfg.samples} samples per step, over-sampling {cfg.over_sampling}x, {cfg.latency} "
            f"s per model call, tail rate {cfg.tail_rate} (to {cfg.max_turns} turns), seed {cfg.seed}, "
            f"{'teacher-forced scoring' if cfg.score else 'canned log-probs'}; counts over every step run "
            "(partial's first step included)")
    return "\n".join([*_markdown(WALL_COLUMNS, walls), "", *_markdown(BOOK_COLUMNS, books), "", note])


def workload_note(cfg: argparse.Namespace, middle: str) -> str:
    """The line under a long-tail table: the workload, with `middle` (what the bench adds) after the step's size."""
    return (f"{cfg.groups} groups x {cfg.samples} samples per step, {middle}, {cfg.latency} s per model call, tail "
            f"rate {cfg.tail_rate} (to {cfg.max_turns} turns), seed {cfg.seed}")


def workload_parser(description: str, *, steps: int, over_sampling_help: str, steps_help: str) -> argparse.ArgumentParser:
    """The workload flags both long-tail benches share: a step's size, the model latency and the tail."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--groups", type=int, default=8, help="--rollout-batch-size (prompts per step)")
    parser.add_argument("--samples", type=int, default=4, help="--n-samples-per-prompt")
    parser.add_argument("--over-sampling", type=int, default=2, help=over_sampling_help)
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds every model call waits (policy, user)")
    parser.add_argument("--tail-rate", type=float, default=0.05,
                        help="chance that an episode never closes and runs to TAU2_MAX_TURNS")
    parser.add_argument("--max-turns", type=int, default=30, help="TAU2_MAX_TURNS: the tail's length")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row draws and the tail coins")
    return parser


def run_bench(cfg: argparse.Namespace, modes: list[str], run: Callable, table: Callable, *, script: str, prefix: str,
              extra_steps: int) -> int:
    """What both long-tail benches do around their modes: slime from ../shared, quiet loggers, the task rows, the
    tiny model and the loopback server in its own process; then each mode, the table and the optional JSON."""
    from contract_tier import MISSING

    if MISSING is not None:
        print(f"{script}: {MISSING.replace('contract tier skipped: ', '')}", file=sys.stderr)
        return 1
    os.environ.setdefault("TQDM_DISABLE", "1")  # slime's progress bars; this script prints one line per step
    import litellm  # noqa: F401  (its logger is set up on import; quieted below)

    import tau2_rl_pipeline  # noqa: F401  (offline litellm before tau2 loads)

    for name in ("LiteLLM", "slime", "tau2_rl_pipeline"):  # one progress line per step instead
        logging.getLogger(name).setLevel(logging.WARNING)

    turns = row_turns(gold_turns(), cfg.groups * cfg.over_sampling * (cfg.steps + extra_steps), cfg.seed)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        tmp_path = Path(tmp)
        os.environ.update({"TAU2_USER_MODEL": "openai/tiny", "TAU2_USER_MAX_RETRIES": "0",
                           "TAU2_MAX_TURNS": str(cfg.max_turns),
                           "TAU2_CURRICULUM_STATE_PATH": str(tmp_path / "curriculum.json")})
        model_dir = build_model(tmp_path)
        rows_path = tmp_path / "rows.jsonl"
        rows_path.write_text("".join(json.dumps(r) + "\n" for r in register_rows(turns)))
        server = ServerProcess(model_dir, cfg)
        try:
            os.environ["TAU2_USER_API_BASE"] = f"http://{server.router}/v1"
            results = [run(mode, cfg, model_dir, rows_path, server) for mode in modes]
        finally:
            server.close()
    print(table(results, cfg))
    if cfg.json is not None:
        cfg.json.write_text(json.dumps({"config": {k: v for k, v in vars(cfg).items() if k != "json"},
                                        "row_turns": turns, "results": results}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = workload_parser(__doc__.split("\n\n")[0], steps=6,
                             over_sampling_help="--over-sampling-batch-size as a multiple of the batch (over-sampling, "
                                                "partial)", steps_help="rollout steps per mode (partial: first is warm-up)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--score", action="store_true",
                        help="the server scores every scripted reply with its tiny model (CPU on this machine)")
    parser.add_argument("--json", type=Path, default=None, help="also write every count and wall time here")
    cfg = parser.parse_args(argv)
    modes = [m for m in cfg.modes.split(",") if m]
    if not modes or set(modes) - set(MODES) or modes[0] != "sync":
        parser.error(f"--modes must start with sync and name only {', '.join(MODES)}")

    return run_bench(cfg, modes, run_mode, table, script="bench/long_tail.py", prefix="long_tail_", extra_steps=1)


if __name__ == "__main__":
    sys.exit(main())
