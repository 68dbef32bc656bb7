"""Issue 9, P4: one Pass@K evaluation run concurrently (this project) and with its episodes one after another (the
original evaluator's design), against the same engine; the wall-time ratio.

    .venv/bin/python bench/sequential_vs_concurrent.py                    # mock, 9 tasks x 4 samples, 200 ms
    .venv/bin/python bench/sequential_vs_concurrent.py --latency 1.0 --domain airline --tasks 10

Both runs go through `tau2_rl_pipeline.eval.runner.run_episodes` (what `tau2_rl_pipeline/eval/eval_passk.py` runs), with the scripted user and
`SGLangEngine` against the canned SGLang engine of bench/harness.py (each `/generate` call waits --latency, then
answers with fixed canonical ids: a tool call per --tool-turns, then a closing reply). Sequential is the same
runner with concurrency 1. Exits 1 if the two runs' rewards differ episode by episode, else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import TOOL, CannedSGLang, load_tokenizer, policy_sampling  # noqa: E402

from tau2_rl_pipeline.benchmark.tasks import load_tasks  # noqa: E402
from tau2_rl_pipeline.benchmark.users import make_user_factory  # noqa: E402
from tau2_rl_pipeline.config import Tau2Config  # noqa: E402
from tau2_rl_pipeline.eval.runner import run_episodes_on_sglang  # noqa: E402


async def evaluate(base_url: str, pending: list, tokenizer, concurrency: int, cfg: Tau2Config) -> tuple[float, dict]:
    """Wall seconds of one evaluation and each episode's (reward, status) by (domain, task, sample)."""
    records: dict = {}

    def on_done(rec: dict) -> None:
        records[(rec["domain"], rec["task_id"], rec["sample"])] = (rec["reward"], rec["status"])

    t0 = time.perf_counter()
    await run_episodes_on_sglang(base_url, pending, concurrency=concurrency, tokenizer=tokenizer,
                                 user_factory=make_user_factory("scripted", cfg), sampling=policy_sampling(tokenizer),
                                 cfg=cfg, seed=0, on_done=on_done)
    return time.perf_counter() - t0, records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--domain", default="mock", choices=sorted(TOOL))
    parser.add_argument("--tasks", type=int, default=None, help="first N tasks of the split (default: all)")
    parser.add_argument("--samples", type=int, default=4, help="samples per task (the K of Pass@K)")
    parser.add_argument("--concurrency", type=int, default=32, help="episodes in flight in the concurrent run")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds every /generate call waits")
    parser.add_argument("--tool-turns", type=int, default=2, help="agent turns that call a tool before replying")
    parser.add_argument("--native-env", action="store_true",
                        help="tau2's native environments and evaluation (fast_env off, TAU2_FAST_ENV=0)")
    args = parser.parse_args(argv)
    cfg = Tau2Config.from_env({}, fast_env=not args.native_env)
    logging.getLogger("tau2_rl_pipeline.benchmark.episode").setLevel(logging.ERROR)  # mock's broken env assertion: scored 0
    logging.getLogger("eval_passk").setLevel(logging.ERROR)

    tokenizer = load_tokenizer()
    tasks = load_tasks(args.domain, "base" if args.domain == "mock" else "test")[:args.tasks]
    pending = [(args.domain, task, sample) for task in tasks for sample in range(args.samples)]
    with tempfile.TemporaryDirectory() as tmp, CannedSGLang(tokenizer, args.domain, args.tool_turns, args.latency,
                                                          Path(tmp)) as server:
        asyncio.run(evaluate(server.base_url, pending[:2], tokenizer, 2, cfg))  # warm-up: imports, caches, registry
        calls0 = server.calls()
        seq_wall, seq = asyncio.run(evaluate(server.base_url, pending, tokenizer, 1, cfg))
        calls1 = server.calls()
        con_wall, con = asyncio.run(evaluate(server.base_url, pending, tokenizer, args.concurrency, cfg))
        calls = (calls1 - calls0, server.calls() - calls1)
    print("| run | episodes | generate calls | wall | episodes/s |\n|---|---|---|---|---|")
    print(f"| sequential (original design) | {len(seq)} | {calls[0]} | {seq_wall:.2f} s | {len(seq) / seq_wall:.2f} |")
    print(f"| concurrent, {args.concurrency} in flight | {len(con)} | {calls[1]} | {con_wall:.2f} s "
          f"| {len(con) / con_wall:.2f} |")
    envs = "tau2 native" if args.native_env else "fast_env"
    print(f"\nwall-time ratio sequential / concurrent: **{seq_wall / con_wall:.1f}x** ({args.domain} with {envs}, "
          f"{len(tasks)} tasks x {args.samples} samples, {args.latency * 1e3:.0f} ms per call; sequential's "
          f"engine-only floor {calls[0] * args.latency:.1f} s)")
    if seq != con:
        print("the two runs' rewards differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
