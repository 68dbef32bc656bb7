"""Issue 32, P12: asynchronous GRPO under a staleness bound eta (GRPO_MAX_STALENESS), on bench/long_tail_async.py's
workload: trained tokens per second, the share of sampled tokens masked or thrown away, the finished samples never
trained, and the staleness trained; each eta run several times, its ratio to the synchronous path of the same run.

    .venv/bin/python bench/staleness.py --groups 4 --samples 4   # as reported: eta 0,1,2,4,-1 (unbounded), 6 steps, 3 runs
    .venv/bin/python bench/staleness.py --etas 1,-1 --steps 3 --repeats 1 --json out.json

What runs: bench/long_tail_async.py's setup (its prompt rows, turn draws, tail and model server process; the
project's generate_rollout_fully_async over slime 624b824's AsyncRolloutWorker, `--partial-rollout
--mask-offpolicy-in-partial-rollout --use-tis` as scripts/train_grpo.sh passes them), one mode per eta with
TAU2_MAX_STALENESS=eta and `--sglang-server-concurrency` as the stage script sets it ((eta + 1) rollouts' samples;
unbounded: the bench's pool, `--unbounded-pool` rollouts' samples, slime's default of 512 a engine being more
episodes than this machine runs). eta = 0 stands for the synchronous path (train.py: slime's generate_rollout, each
step after the last update). Weight versions follow slime's numbering: version 1 before the first rollout, one more
per update through slime's own SGLangEngine calls, in train_async.py's order (rollout r + 1 collected while step r
trains for `--train-s`, then the update; tests/contract/slime_harness.py train_async_steps).

A run is every eta once, in order, on its own draw of the workload (seed `--seed` + the run's number: its rows'
turns and tail coins), so the ratio to eta 0 is taken side by side in one run; `--repeats` runs. Per mode (steps
2-n; the first starts with nothing in flight): trained tokens (mask 1 after every mask: the project's old-weight and
staleness masks, slime's whole-sample mask of a handed-back finished sample) per second of wall time (rollout calls
plus training windows); of the policy tokens the trained samples sampled, the share not trained; the largest
staleness of a trained token, and of a sampled one; the tokens the bound masked; finished samples never trained
(when the run's last update is done: finished groups waiting in slime's worker queue, and finished samples of
groups sent back to slime's buffer) and trained samples whose every token was masked; the 1-minute load average at
each mode's start and end. Exits 0 and prints each run's table, then the median and range over the runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
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
    load_start = os.getloadavg()[0]

    def books(step: int, output) -> None:
        got = [sample_books(s, step + 1) for s in flat(output)]
        steps.append({"sampled": sum(b[0] for b in got), "trained": sum(b[1] for b in got),
                      "max_lag_sampled": max(b[2] for b in got), "max_lag_trained": max(b[3] for b in got),
                      "staleness_masked": output.metrics.get("rollout/staleness/masked_tokens", 0.0),
                      "trained_with_nothing": sum(not any(s.loss_mask) for s in flat(output))})
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
    never_trained = finished_never_trained(source)
    load_end = os.getloadavg()[0]
    reset_slime()
    for step, (start, end) in zip(steps, zip(marks, marks[1:])):
        step["wall_s"] = end - start  # a step: from its data to the next step's (async: training, then the update)
    measured = steps[1:] if len(steps) > 1 else steps
    total = {k: sum(s[k] for s in measured) for k in ("wall_s", "sampled", "trained", "staleness_masked")}
    return {"mode": mode, "eta": eta, "steps": steps, "measured_steps": len(measured), **total,
            "requests_served": served, "trained_tokens_per_s": total["trained"] / total["wall_s"],
            "finished_never_trained": never_trained, "load": [load_start, load_end],
            "trained_with_nothing": sum(s["trained_with_nothing"] for s in steps),
            "not_trained_share": 1 - total["trained"] / total["sampled"] if total["sampled"] else 0.0,
            "max_lag_trained": max(s["max_lag_trained"] for s in measured),
            "max_lag_sampled": max(s["max_lag_sampled"] for s in measured)}


def finished_never_trained(source) -> int:
    """Samples that finished and that no step trained, once the run's last update is done: the groups waiting in
    slime's worker queue (finished, never collected), and the finished samples of groups sent back to slime's buffer
    for another sample's cut (a handed-back finished sample is trained with its whole response masked, if ever)."""
    from slime.rollout import fully_async_rollout

    worker = fully_async_rollout._global_worker
    queued = [s for _, group in list(worker.output_queue.queue) for s in group] if worker is not None else []
    buffered = [s for group in source.buffer for s in group if s.status.name in ("COMPLETED", "TRUNCATED")]
    return len(queued) + len(buffered)


COLUMNS = ("eta", "trained tokens / s (steps 2-n)", "vs eta 0", "sampled tokens of trained samples not trained",
           "of them masked by the bound", "max staleness trained (sampled)", "finished samples never trained",
           "trained samples wholly masked", "requests served (vs eta 0)", "walls of each step", "load at start-end")


def _eta(r: dict) -> str:
    return "unbounded" if r["eta"] < 0 else str(r["eta"])


def table(results: list[dict], cfg: argparse.Namespace) -> str:
    """One run's table: each eta beside eta 0 of the same run."""
    base = next((r for r in results if r["eta"] == 0), None)
    rows = [[_eta(r), f"{r['trained_tokens_per_s']:.1f}",
             f"{r['trained_tokens_per_s'] / base['trained_tokens_per_s']:.2f}x" if base else "-",
             f"{r['not_trained_share']:.1%} ({r['sampled'] - r['trained']} of {r['sampled']})",
             str(int(r["staleness_masked"])), f"{r['max_lag_trained']} ({r['max_lag_sampled']})",
             str(r["finished_never_trained"]), str(r["trained_with_nothing"]),
             f"{r['requests_served']}" + (f" ({r['requests_served'] / base['requests_served']:.2f}x)" if base else ""),
             " ".join(f"{s['wall_s']:.1f}" for s in r["steps"]), "{:.1f}-{:.1f}".format(*r["load"])]
            for r in results]
    note = (long_tail.workload_note(cfg, f"{cfg.steps} steps (the first left out)")
            + f", a weight update {cfg.train_s} s after every step; no restart threw a request away (cut episodes "
            "resume)")
    return "\n".join(long_tail._markdown(COLUMNS, rows) + ["", note])


def spread(values: list[float], fmt: str) -> str:
    """"median (low-high)" of several runs, the value alone of one."""
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


SUMMARY_COLUMNS = ("eta", "runs", "vs eta 0: median (range)", "trained tokens / s: median (range)",
                   "not trained: median (range)", "finished samples never trained, per run",
                   "max staleness trained (sampled)", "load during the runs")


def summary(runs: list[list[dict]]) -> str:
    """Each eta over the runs: its ratio to eta 0 of the same run, median and range; its books per run."""
    by_eta: dict[int, list[tuple[dict, float | None]]] = {}
    for results in runs:
        base = next((r["trained_tokens_per_s"] for r in results if r["eta"] == 0), None)
        for r in results:
            by_eta.setdefault(r["eta"], []).append((r, r["trained_tokens_per_s"] / base if base else None))
    rows = []
    for got in by_eta.values():
        ratios = [x for _, x in got if x is not None]
        loads = [v for r, _ in got for v in r["load"]]
        rows.append([_eta(got[0][0]), str(len(got)), spread(ratios, "{:.2f}x") if ratios else "-",
                     spread([r["trained_tokens_per_s"] for r, _ in got], "{:.0f}"),
                     spread([r["not_trained_share"] for r, _ in got], "{:.0%}"),
                     " ".join(str(r["finished_never_trained"]) for r, _ in got),
                     f"{max(r['max_lag_trained'] for r, _ in got)} ({max(r['max_lag_sampled'] for r, _ in got)})",
                     f"{min(loads):.1f}-{max(loads):.1f}"])
    return "\n".join(long_tail._markdown(SUMMARY_COLUMNS, rows))


def main(argv: list[str] | None = None) -> int:
    parser = long_tail.workload_parser(__doc__.split("\n\n")[0], steps=6,
                                       over_sampling_help="(not used: see --unbounded-pool)",
                                       steps_help="rollout steps per eta")
    parser.add_argument("--unbounded-pool", type=int, default=6,
                        help="unbounded eta: slime's worker pool as a multiple of a step's samples")
    parser.add_argument("--train-s", type=float, default=2.0,
                        help="seconds between a step's rollout and the weight update (the training step)")
    parser.add_argument("--etas", default="0,1,2,4,-1", help="comma-separated bounds; -1 = unbounded")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every eta, run i on the workload drawn with seed --seed + i")
    parser.add_argument("--json", type=Path, default=None, help="also write every count and wall time here")
    cfg = parser.parse_args(argv)
    cfg.score = False
    try:
        modes = [f"eta={int(e)}" for e in cfg.etas.split(",") if e]
    except ValueError:
        parser.error("--etas must be whole numbers (-1 = unbounded)")
    if not modes or any(int(m.removeprefix("eta=")) < -1 for m in modes):
        parser.error("--etas must name bounds of 0 or more, or -1")
    if cfg.repeats < 1:
        parser.error("--repeats must be 1 or more")
    runs: list[list[dict]] = []

    def run_table(results: list[dict], run_cfg: argparse.Namespace) -> str:
        runs.append(results)
        return f"run {len(runs)} of {cfg.repeats} (seed {run_cfg.seed}):\n" + table(results, run_cfg)

    for i in range(cfg.repeats):
        run_cfg = copy.copy(cfg)
        run_cfg.seed, run_cfg.json = cfg.seed + i, None
        code = long_tail.run_bench(run_cfg, modes, run_eta, run_table, script="bench/staleness.py",
                                   prefix="staleness_", extra_steps=2)
        if code:
            return code
        print()
    print(f"over the {len(runs)} runs (each eta's ratio to eta 0 of its own run):")
    print(summary(runs))
    if cfg.json is not None:
        cfg.json.write_text(json.dumps({"config": {k: v for k, v in vars(cfg).items() if k != "json"},
                                        "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
