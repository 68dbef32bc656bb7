"""Issue 32, P12: asynchronous GRPO under a staleness bound eta (GRPO_MAX_STALENESS), on bench/long_tail_async.py's
workload: trained tokens per second, the share of sampled tokens masked or thrown away, and the staleness trained.

    .venv/bin/python bench/staleness.py                  # as reported: eta 0,1,2,4,-1 (unbounded), 6 steps each
    .venv/bin/python bench/staleness.py --etas 1,-1 --steps 3 --json out.json

What runs: bench/long_tail_async.py's setup (its prompt rows, turn draws, tail and model server process; the
project's generate_rollout_fully_async over slime 624b824's AsyncRolloutWorker, `--partial-rollout
--mask-offpolicy-in-partial-rollout --use-tis` as scripts/train_grpo.sh passes them), one mode per eta with
TAU2_MAX_STALENESS=eta and `--sglang-server-concurrency` as the stage script sets it ((eta + 1) rollouts' samples;
unbounded: the bench's pool, 2 rollouts' samples ... --over-sampling x a rollout's, slime's default of 512 a engine
being more episodes than this machine runs). Weight versions follow slime's numbering: version 1 before the first
rollout, then after each step `--train-s` of training (slime's worker going on meanwhile) and the update to the next
version through slime's own SGLangEngine calls. This is train.py's order (the next rollout is requested after the
update); in train_async.py the next rollout is collected while the step trains, so every token there is one
version older and eta = 0 is refused.

Per mode (steps 2-n; the first starts with nothing in flight): trained tokens (mask 1 after every mask: the
project's old-weight and staleness masks, slime's whole-sample mask of a handed-back finished sample) per second
of wall time (rollout calls plus training windows); of the policy tokens the trained samples sampled, the share not
trained (masked) plus the requests thrown away by restarts (none: cut episodes resume); the largest staleness of a
trained token, and of a sampled one; the tokens the staleness bound masked. Exits 0 and prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_tail  # noqa: E402  (puts the project, tests/ and tests/contract on sys.path)
from long_tail_async import ROLLOUT  # noqa: E402

from tau2_rl_pipeline.rollout.staleness import version_number  # noqa: E402


def sample_books(sample, trained: int) -> tuple[int, int, int, int]:
    """(policy tokens sampled, tokens trained, largest staleness sampled, largest staleness trained)."""
    sampled = trained_tokens = lag_sampled = lag_trained = 0
    for (start, end), version in zip(sample.metadata["turn_spans"], sample.metadata["turn_versions"]):
        lag = trained - version_number(version)
        kept = sum(sample.loss_mask[start:end])
        sampled += end - start
        trained_tokens += kept
        lag_sampled = max(lag_sampled, lag)
        lag_trained = max(lag_trained, lag) if kept else lag_trained
    return sampled, trained_tokens, lag_sampled, lag_trained


def run_eta(mode: str, cfg: argparse.Namespace, model_dir: Path, rows_path: Path,
            server: long_tail.ServerProcess) -> dict:
    from slime_harness import flat, reset_slime, rollout, slime_args, train_async_steps, update_weights

    eta = int(mode.removeprefix("eta="))
    os.environ.update({"TAU2_PARTIAL_RESUME": "1", "TAU2_MAX_STALENESS": str(eta)})
    reset_slime()
    server.ask("reset")
    host, port = server.router.rsplit(":", 1)
    engine = argparse.Namespace(host=host, port=int(port))
    rollout_samples = cfg.groups * cfg.samples
    guarded = ("--partial-rollout", "--mask-offpolicy-in-partial-rollout", "--use-tis")
    if eta == 0:  # the synchronous path (train.py): slime's generate_rollout, each step after the last update
        args = slime_args(model_dir, rows_path, server.router, batch=cfg.groups, n=cfg.samples, extra=guarded)
    else:
        in_flight = rollout_samples * (eta + 1 if eta > 0 else cfg.unbounded_pool)
        args = slime_args(model_dir, rows_path, server.router, batch=cfg.groups, n=cfg.samples,
                          extra=("--rollout-function-path", ROLLOUT, "--sglang-server-concurrency", str(in_flight),
                                 *guarded))
    source = long_tail.recording_source(args)
    steps, marks = [], []

    def books(step: int, output) -> None:
        got = [sample_books(s, step + 1) for s in flat(output)]
        steps.append({"sampled": sum(b[0] for b in got), "trained": sum(b[1] for b in got),
                      "max_lag_sampled": max(b[2] for b in got), "max_lag_trained": max(b[3] for b in got),
                      "staleness_masked": output.metrics.get("rollout/staleness/masked_tokens", 0.0)})
        print(f"[staleness] {mode:7s} step {step + 1}/{cfg.steps}: {steps[-1]['trained']} tokens trained",
              file=sys.stderr, flush=True)

    if eta == 0:
        update_weights(engine, "1")
        for step in range(cfg.steps):
            marks.append(time.perf_counter())
            books(step, rollout(args, step, source)[0])
            time.sleep(cfg.train_s)
            update_weights(engine, str(step + 2))
    else:  # train_async.py: rollout r + 1 collected while step r trains, then the update
        for step, output in train_async_steps(args, cfg.steps, engine, train_s=cfg.train_s, source=source):
            marks.append(time.perf_counter())
            books(step, output)
    marks.append(time.perf_counter())
    served = server.ask("stats")["generate"]
    reset_slime()
    for step, (start, end) in zip(steps, zip(marks, marks[1:])):
        step["wall_s"] = end - start  # a step: from its data to the next step's (async: training, then the update)
    measured = steps[1:] if len(steps) > 1 else steps
    total = {k: sum(s[k] for s in measured) for k in ("wall_s", "sampled", "trained", "staleness_masked")}
    return {"mode": mode, "eta": eta, "steps": steps, "measured_steps": len(measured), **total,
            "requests_served": served, "trained_tokens_per_s": total["trained"] / total["wall_s"],
            "not_trained_share": 1 - total["trained"] / total["sampled"] if total["sampled"] else 0.0,
            "max_lag_trained": max(s["max_lag_trained"] for s in measured),
            "max_lag_sampled": max(s["max_lag_sampled"] for s in measured)}


COLUMNS = ("eta", "trained tokens / s (steps 2-n)", "vs eta 0", "sampled tokens of trained samples not trained",
           "of them masked by the bound", "max staleness trained (sampled)", "walls of each step")


def table(results: list[dict], cfg: argparse.Namespace) -> str:
    base = next((r["trained_tokens_per_s"] for r in results if r["eta"] == 0), None)
    rows = [[("unbounded" if r["eta"] < 0 else str(r["eta"])), f"{r['trained_tokens_per_s']:.1f}",
             f"{r['trained_tokens_per_s'] / base:.2f}x" if base else "-",
             f"{r['not_trained_share']:.1%} ({r['sampled'] - r['trained']} of {r['sampled']})",
             str(int(r["staleness_masked"])), f"{r['max_lag_trained']} ({r['max_lag_sampled']})",
             " ".join(f"{s['wall_s']:.1f}" for s in r["steps"])] for r in results]
    note = (long_tail.workload_note(cfg, f"{cfg.steps} steps (the first left out)")
            + f", a weight update {cfg.train_s} s after every step; no restart threw a request away (cut episodes "
            "resume)")
    return "\n".join(long_tail._markdown(COLUMNS, rows) + ["", note])


def main(argv: list[str] | None = None) -> int:
    parser = long_tail.workload_parser(__doc__.split("\n\n")[0], steps=6,
                                       over_sampling_help="(not used: see --unbounded-pool)",
                                       steps_help="rollout steps per eta")
    parser.add_argument("--unbounded-pool", type=int, default=6,
                        help="unbounded eta: slime's worker pool as a multiple of a step's samples")
    parser.add_argument("--train-s", type=float, default=2.0,
                        help="seconds between a step's rollout and the weight update (the training step)")
    parser.add_argument("--etas", default="0,1,2,4,-1", help="comma-separated bounds; -1 = unbounded")
    parser.add_argument("--json", type=Path, default=None, help="also write every count and wall time here")
    cfg = parser.parse_args(argv)
    cfg.score = False
    try:
        modes = [f"eta={int(e)}" for e in cfg.etas.split(",") if e]
    except ValueError:
        parser.error("--etas must be whole numbers (-1 = unbounded)")
    if not modes or any(int(m.removeprefix("eta=")) < -1 for m in modes):
        parser.error("--etas must name bounds of 0 or more, or -1")
    return long_tail.run_bench(cfg, modes, run_eta, table, script="bench/staleness.py", prefix="staleness_",
                               extra_steps=2)


if __name__ == "__main__":
    sys.exit(main())
