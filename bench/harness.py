"""Issue 9, P2: rollout harness efficiency. Many tau2 episodes in flight against an engine that only waits.

    .venv/bin/python bench/harness.py                      # as shipped: 1024 mock episodes, 256 in flight, 200 ms
    .venv/bin/python bench/harness.py --workers 0 --domain airline --latency 2.0
    .venv/bin/python bench/harness.py --profile            # + bench/profiles/harness_<variant>.txt (pyinstrument)

Variants: `--workers` sets episode_workers (0: episode work on the event loop); `--gc` the GC policy after the
warm-up: `policy` (default) is what the rollout drivers do once set up (tau2_rl_pipeline/rollout/gc_policy.py: freeze,
rarer full passes), `freeze` only gc.freeze() (the drivers before that policy), `off` neither; `--native-env`
turns fast_env off; `--procs N` splits the episodes and the concurrency over N rollout processes started together
(what several rollout processes per node would give; the stall reported is the worst process's).

The engine is `CannedSGLang`, a process of its own speaking SGLang's native `/generate` contract on 127.0.0.1:
each request sleeps `--latency` seconds, then answers with fixed canonical Qwen3 token ids (log-probs a constant
-0.1): on the agent's first `--tool-turns` turns a valid read-only tool call of the domain, then a closing text
reply, after which the scripted user ends the episode. It costs next to no CPU, and none in the harness's
process, so what is measured is the harness: the evaluator's `run_episodes` (`run_episode` and its records) with
`SGLangEngine(max_in_flight=concurrency)`, tau2 environments and evaluation, tokenization, the scripted user. (The loopback server's scripted mode scores every
reply with a real model, teacher-forced: real CPU work in the measured process, and one queue of replies for all
episodes instead of one per episode's turn.)

Ideal wall time = generate calls x latency / concurrency: an engine-bound run. Efficiency = ideal / achieved.
A heartbeat task sleeps 10 ms in a loop; how late it wakes is how long the event loop was stalled.
Exits 0 and prints a markdown table. --profile needs pyinstrument (a bench extra, not a runtime dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

import httpx  # noqa: E402

from tau2_rl_pipeline.benchmark.actions import render_assistant_text  # noqa: E402
from tau2_rl_pipeline.config import Tau2Config  # noqa: E402

PROFILES = Path(__file__).resolve().parent / "profiles"
QWEN3 = Path(os.environ.get("TAU2_QWEN3_TOKENIZER", Path(__file__).resolve().parents[2] / "shared/tokenizers/qwen3"))
HEARTBEAT_S = 0.010
SHOWN = r".*(httpcore/_async/connection_pool|tau2_rl_pipeline/|bench/).*"  # library frames shown in profiles
LOGPROB = -0.1  # constant log-prob of every canned token: the harness never reads it beyond the books
# A read-only tool of each domain that succeeds whatever the task, so every episode does the same work.
TOOL = {"mock": ("get_users", {}), "airline": ("list_all_airports", {}), "retail": ("list_all_product_types", {})}


# ---------------------------------------------------------------------------------------------------------------
# The canned engine (its own process)


def canned_replies(tokenizer, domain: str, tool_turns: int) -> list[list[int]]:
    """Canonical token ids of the agent's replies, turn by turn; each ends with <|im_end|> as a sampled turn does."""
    name, args = TOOL[domain]
    texts = [render_assistant_text("Let me look that up.", [(name, args)])] * tool_turns
    texts.append("Thank you, everything is taken care of. Is there anything else?")
    return [tokenizer.encode(t + tokenizer.eos_token, add_special_tokens=False) for t in texts]


def _response_body(ids: list[int], text: str, eos_id: int) -> bytes:
    """An SGLang `/generate` answer for a stop at <|im_end|> with log-probs returned (no_stop_trim: text kept)."""
    return json.dumps({"text": text, "output_ids": ids, "meta_info": {
        "id": "canned", "finish_reason": {"type": "stop", "matched": eos_id}, "completion_tokens": len(ids),
        "output_token_logprobs": [[LOGPROB, t, None] for t in ids]}}).encode()


def assistant_turns(body: bytes, im_start: int, assistant: int) -> int:
    """How many `<|im_start|>assistant` headers the request's prompt holds (the last is the turn being asked for),
    counted in the JSON bytes: the canned engine stands in for a GPU server elsewhere, so it spends next to no CPU
    of the machine the harness is measured on."""
    return len(re.findall(rb"\b%d,\s*%d\b" % (im_start, assistant), body))


def serve_canned(route: str, latency_s: float, answer) -> None:
    """A canned model server until stdin closes (prints its port first): each POST to `route` is answered with
    `answer(request body)` (JSON bytes) after `latency_s`; GET /calls says how many were answered."""
    from aiohttp import web

    calls = [0]

    async def reply(request: web.Request) -> web.Response:
        body = answer(await request.read())
        calls[0] += 1
        await asyncio.sleep(latency_s)
        return web.Response(body=body, content_type="application/json")

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"calls": calls[0]})

    async def main() -> None:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post(route, reply)
        app.router.add_get("/calls", count)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=4096).start()
        print(runner.addresses[0][1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # parent gone or done

    asyncio.run(main())


def serve(spec_path: str) -> None:
    """Run the canned engine until stdin closes; prints its port first."""
    spec = json.loads(Path(spec_path).read_text())
    bodies = [_response_body(ids, text, spec["eos_id"]) for ids, text in zip(spec["replies"], spec["texts"])]
    im_start, assistant = spec["im_start"], spec["assistant"]

    def answer(request: bytes) -> bytes:
        turn = assistant_turns(request, im_start, assistant)
        # tau2 opens every conversation with the agent's greeting: the first header is not a policy turn
        return bodies[min(max(turn - 1, 1), len(bodies)) - 1]

    serve_canned("/generate", spec["latency_s"], answer)


class CannedSGLang:
    """The canned engine as a child process; `base_url` while inside `with`."""

    def __init__(self, tokenizer, domain: str, tool_turns: int, latency_s: float, spec_dir: Path):
        replies = canned_replies(tokenizer, domain, tool_turns)
        self.spec = spec_dir / "canned_sglang.json"
        self.spec.write_text(json.dumps({
            "replies": replies, "texts": [tokenizer.decode(r, skip_special_tokens=False) for r in replies],
            "latency_s": latency_s, "eos_id": tokenizer.eos_token_id,
            "im_start": tokenizer.convert_tokens_to_ids("<|im_start|>"),
            "assistant": tokenizer.encode("assistant", add_special_tokens=False)[0]}))
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def __enter__(self) -> CannedSGLang:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", str(self.spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.base_url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)

    def calls(self) -> int:
        return httpx.get(self.base_url + "/calls").json()["calls"]


# ---------------------------------------------------------------------------------------------------------------
# The harness under test


class Heartbeat:
    """Sleeps `period` in a loop on the event loop; each wake-up's lateness is one stall sample.

    On a loaded machine a wake-up is also late when the process waits for a core; `own` counts a stall only as far
    as this process used the CPU meanwhile (the lateness, capped at the process CPU time of the interval): what the
    process itself held the loop with, comparable across loads where `late` is not."""

    def __init__(self, period: float = HEARTBEAT_S):
        self.period = period
        self.late: list[float] = []
        self.own: list[float] = []
        self._task: asyncio.Task | None = None

    async def _beat(self) -> None:
        while True:
            t0, cpu0 = time.perf_counter(), time.process_time()
            await asyncio.sleep(self.period)
            late = time.perf_counter() - t0 - self.period
            self.late.append(late)
            self.own.append(max(0.0, min(late, time.process_time() - cpu0)))

    def __enter__(self) -> Heartbeat:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        self._task.cancel()

    def summary(self) -> dict[str, float]:
        late = sorted(self.late)
        return {"max_stall_s": late[-1], "p99_stall_s": late[int(0.99 * (len(late) - 1))],
                "median_stall_s": statistics.median(late), "max_own_stall_s": max(self.own)}


class GcPauses:
    """Every cyclic-GC pass (gc.callbacks) while inside `with`, in CPU time of the thread that ran it (wall time
    would count other threads running while finalizers release the GIL). A pass holds the GIL: it stalls the
    event loop whichever thread triggered it."""

    def __init__(self):
        self.pauses: list[tuple[int, float, float]] = []  # (generation, wall seconds, CPU seconds of its thread)
        self._t0 = (0.0, 0.0)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = (time.perf_counter(), time.thread_time())
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0[0],
                                time.thread_time() - self._t0[1]))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, float]:
        full = [c for g, _, c in self.pauses if g == 2]
        return {"gc_cpu_s": sum(c for _, _, c in self.pauses), "gc_full": len(full),
                "gc_full_max_s": max(full, default=0.0)}


def load_tokenizer():
    """The real Qwen3 tokenizer; without one, a small BPE tokenizer trained on the mock domain with Qwen3's markers
    and chat template (the benches still run; token counts and timings are then not Qwen3's)."""
    from transformers import AutoTokenizer

    if (QWEN3 / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(QWEN3))
    import tempfile

    from tau2_rl_pipeline.local.tiny_model import domain_corpus, train_small_tokenizer

    print(f"no Qwen3 tokenizer at {QWEN3} (set TAU2_QWEN3_TOKENIZER): using a small tokenizer trained on mock",
          file=sys.stderr)
    return train_small_tokenizer(domain_corpus(["mock"]), tempfile.mkdtemp(prefix="bench-tokenizer-"))


def policy_sampling(tokenizer):
    from tau2_rl_pipeline.rollout.engines import SamplingParams

    return SamplingParams(temperature=1.0, max_new_tokens=256, stop_token_ids=(tokenizer.eos_token_id,))


def task_list(domain: str):
    """The domain's tasks whose conversation the policy has to carry (not ones whose history already ends it)."""
    from tau2_rl_pipeline.benchmark.tasks import load_tasks

    tasks = load_tasks(domain, "base" if domain == "mock" else "test")
    return [t for t in tasks if not (t.initial_state and t.initial_state.message_history)]


async def run_batch(base_url: str, domain: str, tasks: list, episodes: int, concurrency: int, tokenizer,
                    cfg, user_factory=None) -> dict:
    """`episodes` episodes (tasks cycled; the scripted user unless `user_factory` says otherwise) through the
    evaluator's runner, at most `concurrency` in flight: wall time, CPU, stalls, GC passes."""
    from tau2_rl_pipeline.benchmark.users import make_user_factory
    from tau2_rl_pipeline.eval.runner import run_episodes_on_sglang

    pending = [(domain, task, i // len(tasks)) for i, task in enumerate(itertools.islice(itertools.cycle(tasks),
                                                                                        episodes))]
    records: list[dict] = []
    cpu0, t0 = time.process_time(), time.perf_counter()
    with Heartbeat() as beat, GcPauses() as gcp:
        await run_episodes_on_sglang(base_url, pending, concurrency=concurrency, tokenizer=tokenizer,
                                     user_factory=user_factory or make_user_factory("scripted", cfg),
                                     sampling=policy_sampling(tokenizer), cfg=cfg, seed=0, on_done=records.append)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    left = gc.collect()  # untimed: the cyclic garbage the run's GC setting left for a later full pass
    statuses = {s: sum(r["status"] == s for r in records) for s in {r["status"] for r in records}}
    phases = {k: statistics.mean(r["timings"].get(k, 0.0) for r in records) for k in ("env_s", "tokenize_s", "eval_s")}
    return {"wall_s": wall, "cpu_s": cpu, "turns": sum(r["turns"] for r in records), "statuses": statuses,
            "phases": phases, "gc_left": left, **beat.summary(), **gcp.summary(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def profile_name(args: argparse.Namespace) -> str:
    native = "_native" if args.native_env else ""
    return f"{args.domain}{native}{'' if args.gc == 'policy' else '_gc' + args.gc}_w{args.workers}"


GC_MODES = ("policy", "freeze", "off")


def settle_gc(mode: str) -> None:
    """After the warm-up: the rollout drivers' GC policy (`policy`), only the gc.freeze() they made before it
    (`freeze`), or nothing (`off`)."""
    if mode == "policy":
        from tau2_rl_pipeline.rollout.gc_policy import settle

        settle()
    elif mode == "freeze":
        gc.collect()
        gc.freeze()


def warmed_up(args: argparse.Namespace, base_url: str):
    """Tokenizer, tasks and config, after an untimed warm-up (imports, tau2 registry, fast_env's one parse of the
    databases, template caches) and the GC setting of --gc."""
    cfg = Tau2Config.from_env({}, episode_workers=args.workers, fast_env=not args.native_env)
    tokenizer = load_tokenizer()
    tasks = task_list(args.domain)
    asyncio.run(run_batch(base_url, args.domain, tasks, min(8, args.episodes), 8, tokenizer, cfg))
    settle_gc(args.gc)
    return tokenizer, tasks, cfg


def run_shard(args: argparse.Namespace, batch: Callable[[int, int], dict]) -> None:
    """One of --procs rollout processes, warmed up: say so, start at the time the parent sends, run its share
    (`batch(episodes, concurrency)`), print the result."""
    print("ready", flush=True)
    time.sleep(max(0.0, float(sys.stdin.readline()) - time.time()))
    result = batch(args.episodes // args.procs, args.concurrency // args.procs)
    print(json.dumps({**result, "ended_at": time.time()}), flush=True)


def sharded(args: argparse.Namespace, shard_argv: list[str], calls: Callable[[], dict[str, int]]) -> dict:
    """--procs processes (`shard_argv`: a bench's command line for one shard), each with its share of the episodes
    and of the concurrency, started together; `calls()` counts the canned servers' answers by name."""
    shards = [subprocess.Popen(shard_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for _ in range(args.procs)]
    for shard in shards:
        if shard.stdout.readline().strip() != "ready":
            raise SystemExit("a shard process failed to start")
    calls0 = calls()  # after the shards' warm-ups
    start = time.time() + 0.5
    for shard in shards:
        shard.stdin.write(f"{start}\n")
        shard.stdin.flush()
    results = [json.loads(shard.stdout.readline()) for shard in shards]
    for shard in shards:
        shard.wait(timeout=30)
    statuses: dict[str, int] = {}
    for r in results:
        for k, v in r["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    return {**{k: n - calls0[k] for k, n in calls().items()},
            "wall_s": max(r["ended_at"] for r in results) - start, "cpu_s": sum(r["cpu_s"] for r in results),
            "turns": sum(r["turns"] for r in results), "statuses": statuses,
            "phases": {k: statistics.mean(r["phases"][k] for r in results) for k in results[0]["phases"]},
            **{k: max(r[k] for r in results) for k in ("max_stall_s", "p99_stall_s", "median_stall_s",
                                                      "max_own_stall_s", "gc_full_max_s", "peak_rss_mb")},
            **{k: sum(r[k] for r in results) for k in ("gc_cpu_s", "gc_full", "gc_left")}}


def bench(args: argparse.Namespace, argv: list[str]) -> dict:
    import tempfile

    tokenizer = load_tokenizer()
    with tempfile.TemporaryDirectory() as tmp, CannedSGLang(tokenizer, args.domain, args.tool_turns, args.latency,
                                                          Path(tmp)) as server:
        if args.procs > 1:
            result = sharded(args, [sys.executable, __file__, "--engine-url", server.base_url, *argv],
                             lambda: {"calls": server.calls()})
        else:
            tokenizer, tasks, cfg = warmed_up(args, server.base_url)
            calls0 = server.calls()
            profiler = None
            if args.profile:
                from pyinstrument import Profiler

                profiler = Profiler(interval=0.001, async_mode="disabled")  # the event loop's thread, all of it
                profiler.start()
            result = asyncio.run(run_batch(server.base_url, args.domain, tasks, args.episodes, args.concurrency,
                                           tokenizer, cfg))
            if profiler is not None:
                profiler.stop()
                PROFILES.mkdir(exist_ok=True)
                out = PROFILES / f"harness_{profile_name(args)}.txt"
                out.write_text(f"# {' '.join(sys.argv)}\n\n" + profiler.output_text(
                    unicode=False, color=False, processor_options={"show_regex": SHOWN, "filter_threshold": 0.005}))
                print(f"profile: {out}", file=sys.stderr)
            result["calls"] = server.calls() - calls0
    result["ideal_s"] = result["calls"] * args.latency / args.concurrency
    result["efficiency"] = result["ideal_s"] / result["wall_s"]
    return result


def add_gc_and_procs_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gc", choices=GC_MODES, default="policy",
                        help="after the warm-up: the rollout drivers' GC policy, gc.freeze() only, or nothing")
    parser.add_argument("--procs", type=int, default=1,
                        help="rollout processes, each with 1/procs of the episodes and of the concurrency")


def check_procs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.procs < 1 or args.episodes % args.procs or args.concurrency % args.procs:
        parser.error("--procs must divide --episodes and --concurrency")


def own_stall_row(r: dict) -> tuple[str, str]:
    return ("event-loop stall max, counting only this process's CPU meanwhile (a loaded machine's waits left out)",
            f"{r['max_own_stall_s'] * 1e3:.1f} ms")


def gc_left_row(r: dict) -> tuple[str, str]:
    return ("cyclic garbage left at the end (one gc.collect() after the run) / peak RSS (the largest process)",
            f"{r['gc_left']} objects / {r['peak_rss_mb']:.0f} MiB")


def yes_no(good: bool) -> str:
    return "yes" if good else "no"


def markdown_table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


def workers_label(workers: int, cfg: Tau2Config, blocking_user: bool, domain: str) -> str:
    """--workers as run: auto (-1, the default) with what it resolved to."""
    from tau2_rl_pipeline.rollout.episode_loop import episode_threads

    threads = episode_threads(workers, cfg.fast_env, blocking_user, (domain,))
    return str(workers) if workers >= 0 else f"auto ({threads})"


def table(args: argparse.Namespace, r: dict) -> str:
    env = f"{args.domain} ({'tau2 native' if args.native_env else 'fast_env'})"
    ok = yes_no
    rows = [
        ("episodes / concurrency / latency", f"{args.episodes} / {args.concurrency} / {args.latency * 1e3:.0f} ms"),
        ("domain (environments) / episode_workers / GC / processes",
         f"{env} / {workers_label(args.workers, Tau2Config(fast_env=not args.native_env), False, args.domain)} / "
         f"{args.gc} / {args.procs}"),
        ("generate calls", f"{r['calls']} (episode turns {r['turns']})"),
        ("statuses", ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))),
        ("ideal wall (calls x latency / concurrency)", f"{r['ideal_s']:.2f} s"),
        ("achieved wall", f"{r['wall_s']:.2f} s"),
        ("efficiency (ideal / achieved), target >= 90%", f"{r['efficiency']:.1%} ({ok(r['efficiency'] >= 0.9)})"),
        ("episodes/s", f"{args.episodes / r['wall_s']:.1f}"),
        ("event-loop stall max, target <= 50 ms", f"{r['max_stall_s'] * 1e3:.1f} ms ({ok(r['max_stall_s'] <= 0.05)})"),
        ("event-loop stall p99 / median", f"{r['p99_stall_s'] * 1e3:.1f} / {r['median_stall_s'] * 1e3:.1f} ms"),
        own_stall_row(r),
        ("cyclic GC: full passes / longest / CPU of all passes",
         f"{r['gc_full']} / {r['gc_full_max_s'] * 1e3:.0f} ms / {r['gc_cpu_s']:.2f} s"),
        gc_left_row(r),
        ("harness CPU (all threads) per episode", f"{r['cpu_s'] / args.episodes * 1e3:.1f} ms"),
        ("per episode: env build+steps / first-prompt tokenize / evaluation (wall, incl. queueing)",
         " / ".join(f"{r['phases'][k] * 1e3:.0f} ms" for k in ("env_s", "tokenize_s", "eval_s"))),
    ]
    return markdown_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds every /generate call waits")
    parser.add_argument("--domain", default="mock", choices=sorted(TOOL))
    parser.add_argument("--tool-turns", type=int, default=2, help="agent turns that call a tool before replying")
    parser.add_argument("--native-env", action="store_true",
                        help="tau2's native environments and evaluation (fast_env off, TAU2_FAST_ENV=0)")
    parser.add_argument("--workers", type=int, default=Tau2Config.episode_workers,
                        help="episode_workers: threads for blocking episode work; 0 = on the event loop")
    add_gc_and_procs_args(parser)
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of the timed run (--procs 1)")
    parser.add_argument("--serve", metavar="SPEC", help=argparse.SUPPRESS)  # the canned engine's own process
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)  # a --procs shard's own process
    args = parser.parse_args(argv)
    check_procs(parser, args)
    if args.serve:
        serve(args.serve)
        return 0
    # tau2's evaluator raises on some mock tasks' env assertions; the episode logs it and scores 0 (expected here)
    logging.getLogger("tau2_rl_pipeline.benchmark.episode").setLevel(logging.ERROR)
    if args.engine_url:
        tokenizer, tasks, cfg = warmed_up(args, args.engine_url)
        run_shard(args, lambda episodes, concurrency: asyncio.run(
            run_batch(args.engine_url, args.domain, tasks, episodes, concurrency, tokenizer, cfg)))
        return 0
    print(table(args, bench(args, sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
