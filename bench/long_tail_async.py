"""Issue 24, P6 async rows: the long tail through slime's fully asynchronous worker, with slime's weight update
between steps cutting the episodes in flight; cut episodes started again vs. resumed.

    .venv/bin/python bench/long_tail_async.py            # as reported: 8 groups x 4 samples, 4 steps a mode, 0.5 s
    .venv/bin/python bench/long_tail_async.py --steps 3 --latency 0.2 --json out.json

What runs: the project's `generate_rollout_fully_async` (slime 624b824's `AsyncRolloutWorker` in
slime/rollout/fully_async_rollout.py, which keeps up to --sglang-server-concurrency groups in flight across steps
and calls the project's generate through slime's `generate_and_rm_group`) with `--partial-rollout
--mask-offpolicy-in-partial-rollout`, over the same prompt rows, turn draws and model server as bench/long_tail.py
(its functions, its server process). After each step the bench does what slime's train_async.py does after a
training step: a weight update, through slime's own `SGLangEngine` calls (tests/contract/slime_harness.py
`update_weights`: pause generation, which aborts every request in flight, flush, the new weight version,
continue), `--train-s` after the step's rollout returned (the training step, during which slime's worker goes on;
no training runs here). A step's wall time is the rollout's.

Modes, each from a fresh slime state: `async-restart` (TAU2_PARTIAL_RESUME=0: a cut episode, handed back, starts
from its first turn) and `async` (the default: it goes on where the pause cut it). The first step of each starts
with no episode in flight and is left out of the mean. The books count, per mode: policy requests the server
answered; episodes handed back after a cut and whether they went on or started again (the requests they had made
then thrown away); the trained samples' requests, and those sampled by an older weight version than their
episode's last turn (what the project's mask takes out of the loss); trained samples slime masked whole (a finished
sample whose group went back to the buffer for another sample's cut). Exits 0 and prints one markdown table; 1 with
one line if slime's sources or the contract tier's packages are missing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import long_tail  # noqa: E402  (puts the project, tests/ and tests/contract on sys.path)

MODES = ("async-restart", "async")
ROLLOUT = "tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async"


def older_requests(sample) -> int:
    """Requests of a sample sampled by a weight version other than its episode's last (the project's mask)."""
    versions = sample.weight_versions or []
    return sum(v != versions[-1] for v in versions)


def run_async_mode(mode: str, cfg: argparse.Namespace, model_dir: Path, rows_path: Path,
                   server: long_tail.ServerProcess) -> dict:
    from slime_harness import flat, reset_slime, rollout, slime_args, update_weights

    os.environ["TAU2_PARTIAL_RESUME"] = "0" if mode == "async-restart" else "1"
    reset_slime()
    server.ask("reset")
    host, port = server.router.rsplit(":", 1)
    engine = argparse.Namespace(host=host, port=int(port))
    in_flight = cfg.groups * cfg.samples * cfg.over_sampling
    args = slime_args(model_dir, rows_path, server.router, batch=cfg.groups, n=cfg.samples,
                      extra=("--rollout-function-path", ROLLOUT, "--sglang-server-concurrency", str(in_flight),
                             "--partial-rollout", "--mask-offpolicy-in-partial-rollout"))
    source = long_tail.recording_source(args)
    steps = []
    for step in range(cfg.steps):
        served = server.ask("stats")["generate"]
        t0 = time.perf_counter()
        batch = flat(rollout(args, step, source)[0])
        wall = time.perf_counter() - t0
        time.sleep(cfg.train_s)  # the training step, while slime's worker goes on with the episodes in flight
        update_weights(engine, str(step + 1))  # then the trainer's weight update
        steps.append({
            "wall_s": wall, "requests_served": server.ask("stats")["generate"] - served,
            "episodes_trained": len(batch), "turns_trained": sum(long_tail.requests(s) for s in batch),
            "turns_trained_older_weights": sum(older_requests(s) for s in batch),
            "episodes_resumed_in_batch": sum(s.metadata.get("resumes", 0) > 0 for s in batch),
            "trained_masked_whole_by_slime": sum(not any(s.loss_mask) for s in batch),
        })
        print(f"[long_tail_async] {mode:13s} step {step + 1}/{cfg.steps}: {wall:6.2f} s, "
              f"{steps[-1]['requests_served']} requests served", file=sys.stderr, flush=True)
    reset_slime()  # stops slime's worker (it lets its episodes in flight drain)
    cut_handed = [(s, before, r) for s, before, r in source.handed
                  if (before or {}).get("termination_reason") == "rollout_stopped"]
    ran = [(s, before, r) for s, before, r in cut_handed if s.metadata is not before]
    resumed = [x for x in ran if x[0].metadata.get("resumes", 0) > before_resumes(x[1])]
    restarted = [x for x in ran if x[0].metadata.get("resumes", 0) <= before_resumes(x[1])]
    measured = steps[1:] if len(steps) > 1 else steps
    totals = {k: sum(s[k] for s in steps) for k in steps[0] if k != "wall_s"}
    return {"mode": mode, "steps": steps, "measured_steps": len(measured),
            "wall_s_per_step": statistics.fmean(s["wall_s"] for s in measured), **totals,
            "cut_handed_back": len(cut_handed), "cut_resumed": len(resumed), "cut_restarted": len(restarted),
            "turns_thrown_away_by_restarts": sum(r for _, _, r in restarted)}


def before_resumes(before: dict | None) -> int:
    return (before or {}).get("resumes", 0)


COLUMNS = ("mode", "wall per step (steps 2-n)", "walls of each step", "requests served", "cut episodes handed back: "
           "resumed / started again", "requests thrown away by restarts", "turns trained (of them by older weights)",
           "trained samples slime masked whole")


def table(results: list[dict], cfg: argparse.Namespace) -> str:
    rows = [[r["mode"], f"{r['wall_s_per_step']:.2f} s", " ".join(f"{s['wall_s']:.1f}" for s in r["steps"]),
             str(r["requests_served"]), f"{r['cut_resumed']} / {r['cut_restarted']}",
             str(r["turns_thrown_away_by_restarts"]),
             f"{r['turns_trained']} ({r['turns_trained_older_weights']})", str(r["trained_masked_whole_by_slime"])]
            for r in results]
    note = (long_tail.workload_note(cfg, f"{cfg.groups * cfg.samples * cfg.over_sampling} samples in flight at most")
            + f", a weight update {cfg.train_s} s after every step")
    return "\n".join(long_tail._markdown(COLUMNS, rows) + ["", note])


def main(argv: list[str] | None = None) -> int:
    parser = long_tail.workload_parser(__doc__.split("\n\n")[0], steps=4,
                                       over_sampling_help="samples in flight at most, as a multiple of a step's "
                                                          "(slime's worker pool)",
                                       steps_help="rollout steps per mode (the first is warm-up)")
    parser.add_argument("--train-s", type=float, default=2.0,
                        help="seconds between a step's rollout and the weight update (the training step)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--json", type=Path, default=None, help="also write every count and wall time here")
    cfg = parser.parse_args(argv)
    cfg.score = False
    modes = [m for m in cfg.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes must name only {', '.join(MODES)}")

    return long_tail.run_bench(cfg, modes, run_async_mode, table, script="bench/long_tail_async.py",
                               prefix="long_tail_async_", extra_steps=2)


if __name__ == "__main__":
    sys.exit(main())
