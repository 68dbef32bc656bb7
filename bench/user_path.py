"""Issue 15, P5: the LLM user path. tau2's LLM user simulator against a canned OpenAI-compatible server.

    .venv/bin/python bench/user_path.py --client litellm --workers 64      # tau2's UserSimulator over litellm
    .venv/bin/python bench/user_path.py --client async --workers 0         # the project's async client
    .venv/bin/python bench/user_path.py --client litellm --turns-only --profile   # + bench/profiles/user_turn_*.txt

Two measurements, both against `CannedUser`, a process of its own answering `/v1/chat/completions` after
`--latency` seconds with fixed replies that end an episode the way a user does: the opening request, then
`--user-turns` - 2 follow-ups, then "###STOP###" (which user turn it is: the assistant messages in the request,
counted in its raw bytes, so the server spends next to no CPU of the machine measured).

1. *Episodes* (as P2, `bench/harness.py`): `--episodes` mock episodes, `--concurrency` in flight, through the
   evaluator's `run_episodes` with P2's canned policy engine (same latency) and the LLM user. Ideal wall time =
   (generate calls + user calls) x latency / concurrency: every call of an episode waits for the one before it.
   CPU per episode, event-loop stalls (a 10 ms heartbeat), efficiency = ideal / achieved. `--gc` and `--procs` as
   in bench/harness.py: the GC setting after the warm-up (default: the rollout drivers' policy,
   tau2_rl_pipeline/rollout/gc_policy.py), and N rollout processes started together, each with 1/N of the episodes and of
   the concurrency (the stall reported is the worst process's).
2. *User turns*: `--turns` calls of the user simulator alone (`generate_next_message` on a 13-message
   conversation, as in the issue's measurement; `--turn-domain telecom` with the user's 30 device tools), 32 in
   flight, against the same server with no latency: CPU of this process per user turn, all threads
   (`time.process_time`). `--profile` profiles them (pyinstrument; for
   litellm, the calls run one at a time on the main thread so the profiler sees them).
Exits 0 and prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere

import harness  # noqa: E402  (bench/harness.py: P2's canned engine, heartbeat, GC and batch runner)

from tau2_rl_pipeline.config import Tau2Config  # noqa: E402

OPENING = "Hi, I need help with my account. My user id is user_1."
FOLLOW_UP = "Thanks. Could you also check one more thing for me?"
GOODBYE = "That's all I needed, thank you! ###STOP###"
MODEL = "canned-user"
SHOWN = r".*(tau2/|litellm/|openai/|httpx/|httpcore/|aiohttp/|tau2_rl_pipeline/|pydantic/).*"  # frames profiled
TURN_HISTORY = 13  # messages in the conversation of the per-turn measurement (the 13-message one)


def user_reply(turn: int, user_turns: int) -> str:
    """What the canned user says on its `turn`-th turn (0-based) of `user_turns`."""
    if turn == 0:
        return OPENING
    return GOODBYE if turn >= user_turns - 1 else FOLLOW_UP


def serve_user(spec_path: str) -> None:
    """Run the canned user until stdin closes; prints its port first."""
    spec = json.loads(Path(spec_path).read_text())
    latency, user_turns = spec["latency_s"], spec["user_turns"]
    bodies = [json.dumps({
        "id": "chatcmpl-canned", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": user_reply(t, user_turns)},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 12, "total_tokens": 1012}}).encode()
        for t in range(user_turns)]
    own_turns = re.compile(rb'"role":\s*"assistant"')  # the user's earlier turns, role-flipped
    harness.serve_canned("/v1/chat/completions", latency,
                         lambda request: bodies[min(len(own_turns.findall(request)), user_turns - 1)])


class CannedUser(harness.CannedSGLang):
    """The canned user as a child process; `base_url` while inside `with` (the API base is base_url + /v1)."""

    def __init__(self, latency_s: float, user_turns: int, spec_dir: Path):  # no tokenizer, unlike the engine's
        self.spec = spec_dir / "canned_user.json"
        self.spec.write_text(json.dumps({"latency_s": latency_s, "user_turns": user_turns}))
        self.proc = None
        self.base_url = ""

    def __enter__(self) -> CannedUser:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-user", str(self.spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.base_url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"
        return self


def user_config(args: argparse.Namespace, user_url: str) -> Tau2Config:
    return Tau2Config.from_env({}, episode_workers=args.workers, user_client=args.client,
                               user_model="openai/" + MODEL, user_api_base=user_url + "/v1")


# ---------------------------------------------------------------------------------------------------------------
# 1. Episodes


def warmed_up(args: argparse.Namespace, engine_url: str, user_url: str, tokenizer):
    """`batch(episodes, concurrency)`: a timed run of LLM-user episodes, made after an untimed warm-up and the GC
    setting of --gc (as `harness.warmed_up`)."""
    from tau2_rl_pipeline.benchmark.users import make_user_factory

    cfg = user_config(args, user_url)
    factory = make_user_factory("llm", cfg)
    tasks = harness.task_list("mock")
    asyncio.run(harness.run_batch(engine_url, "mock", tasks, 8, 8, tokenizer, cfg, user_factory=factory))
    harness.settle_gc(args.gc)
    return lambda episodes, concurrency: asyncio.run(harness.run_batch(
        engine_url, "mock", tasks, episodes, concurrency, tokenizer, cfg, user_factory=factory))


def episodes(args: argparse.Namespace, argv: list[str], tmp: Path, tokenizer) -> dict:
    with harness.CannedSGLang(tokenizer, "mock", args.tool_turns, args.latency, tmp) as engine, \
            CannedUser(args.latency, args.user_turns, tmp) as user:
        def calls() -> dict[str, int]:
            return {"calls": engine.calls(), "user_calls": user.calls()}

        if args.procs > 1:
            result = harness.sharded(args, [sys.executable, __file__, "--engine-url", engine.base_url, "--user-url",
                                            user.base_url, *argv], calls)
        else:
            batch = warmed_up(args, engine.base_url, user.base_url, tokenizer)
            calls0 = calls()
            result = batch(args.episodes, args.concurrency)
            result.update({k: n - calls0[k] for k, n in calls().items()})
    result["ideal_s"] = (result["calls"] + result["user_calls"]) * args.latency / args.concurrency
    result["efficiency"] = result["ideal_s"] / result["wall_s"]
    return result


def episodes_table(args: argparse.Namespace, r: dict) -> str:
    ok = harness.yes_no
    rows = [
        ("client / episode_workers / GC / processes",
         f"{args.client} / {harness.workers_label(args.workers, Tau2Config(), args.client == 'litellm', 'mock')} / "
         f"{args.gc} / {args.procs}"),
        ("episodes / concurrency / latency per call",
         f"{args.episodes} / {args.concurrency} / {args.latency * 1e3:.0f} ms"),
        ("generate calls / user calls", f"{r['calls']} / {r['user_calls']}"),
        ("statuses", ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))),
        ("ideal wall ((generate + user calls) x latency / concurrency)", f"{r['ideal_s']:.2f} s"),
        ("achieved wall", f"{r['wall_s']:.2f} s"),
        ("efficiency (ideal / achieved), target >= 90%", f"{r['efficiency']:.1%} ({ok(r['efficiency'] >= 0.9)})"),
        ("event-loop stall max, target <= 50 ms", f"{r['max_stall_s'] * 1e3:.1f} ms ({ok(r['max_stall_s'] <= 0.05)})"),
        ("event-loop stall p99 / median", f"{r['p99_stall_s'] * 1e3:.1f} / {r['median_stall_s'] * 1e3:.1f} ms"),
        harness.own_stall_row(r),
        ("cyclic GC: full passes / longest", f"{r['gc_full']} / {r['gc_full_max_s'] * 1e3:.0f} ms"),
        harness.gc_left_row(r),
        ("CPU (all threads) per episode", f"{r['cpu_s'] / args.episodes * 1e3:.1f} ms"),
    ]
    return harness.markdown_table(rows)


# ---------------------------------------------------------------------------------------------------------------
# 2. User turns


def conversation(task):
    """A 13-message conversation for the user's state: the greeting, then user and agent turns alternating."""
    from tau2.data_model.message import AssistantMessage, UserMessage

    messages = [AssistantMessage(role="assistant", content="Hi! How can I help you today?")]
    for i in range(TURN_HISTORY - 1):
        if i % 2 == 0:
            messages.append(UserMessage(role="user", content=f"{FOLLOW_UP} (turn {i})"))
        else:
            messages.append(AssistantMessage(role="assistant", content=f"Of course. I checked it: all is in "
                                                                       f"order with item {i} of your account."))
    return messages


def user_turns(args: argparse.Namespace, tmp: Path) -> dict:
    """CPU of this process per user-simulator call, 32 calls in flight (litellm: on 32 threads, as in a run)."""
    from tau2.data_model.message import AssistantMessage

    from tau2_rl_pipeline.benchmark.episode import build_environment
    from tau2_rl_pipeline.benchmark.users import make_user_factory
    from tau2_rl_pipeline.rollout.episode_loop import shared_executor

    with CannedUser(0.0, 10_000, tmp) as server:
        cfg = user_config(argparse.Namespace(**{**vars(args), "workers": max(args.workers, 32)}), server.base_url)
        factory = make_user_factory("llm", cfg)
        task = harness.task_list(args.turn_domain)[0]
        environment = build_environment(args.turn_domain)
        history = conversation(task)
        question = AssistantMessage(role="assistant", content="Is there anything else I can do for you?")
        users = [factory(task, environment) for _ in range(32)]
        asynchronous = hasattr(users[0], "agenerate_next_message")
        executor = shared_executor(32)

        def states(n: int) -> list:  # made before the clock starts: the conversation so far, per turn
            return [users[i % 32].get_init_state(copy.deepcopy(history)) for i in range(n)]

        async def turn(user, state) -> None:
            if asynchronous:
                await user.agenerate_next_message(question, state)
            elif args.profile:  # one at a time on this thread, where the profiler looks
                user.generate_next_message(question, state)
            else:
                await asyncio.get_running_loop().run_in_executor(executor, user.generate_next_message, question,
                                                                 state)

        async def run(todo: list) -> None:
            for start in range(0, len(todo), 32):
                await asyncio.gather(*(turn(users[i % 32], todo[i]) for i in range(start, min(len(todo), start + 32))))
            await factory.aclose()  # the async client's session belongs to this loop

        asyncio.run(run(states(32)))  # warm-up: imports, connections
        todo = states(args.turns)
        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005, async_mode="disabled")
            profiler.start()
        cpu0, t0 = time.process_time(), time.perf_counter()
        asyncio.run(run(todo))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        if profiler is not None:
            profiler.stop()
            harness.PROFILES.mkdir(exist_ok=True)
            out = harness.PROFILES / f"user_turn_{args.client}_{args.turn_domain}.txt"
            out.write_text(f"# {' '.join(sys.argv)}\n\n" + profiler.output_text(
                unicode=False, color=False, processor_options={"show_regex": SHOWN, "filter_threshold": 0.02}))
            print(f"profile: {out}", file=sys.stderr)
    return {"turns": args.turns, "cpu_s": cpu, "wall_s": wall, "client": type(users[0]).__name__}


def turns_table(args: argparse.Namespace, r: dict) -> str:
    per = r["cpu_s"] / r["turns"] * 1e3
    rows = [
        ("client (user class)", f"{args.client} ({r['client']})"),
        ("user turns (13-message conversation, 32 in flight, no latency)", f"{r['turns']} ({args.turn_domain})"),
        ("CPU of this process per user turn, target <= 1 ms", f"{per:.2f} ms ({'yes' if per <= 1.0 else 'no'})"),
        ("wall", f"{r['wall_s']:.2f} s"),
    ]
    return harness.markdown_table(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--client", choices=("litellm", "async"), default="async",
                        help="TAU2_USER_CLIENT: tau2's UserSimulator over litellm, or the project's async client")
    parser.add_argument("--workers", type=int, default=Tau2Config.episode_workers,
                        help="episode_workers (litellm needs threads: >= 1)")
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds every model call (policy, user) waits")
    parser.add_argument("--tool-turns", type=int, default=2, help="agent turns that call a tool before replying")
    parser.add_argument("--user-turns", type=int, default=3, help="user turns per episode, the last one a stop")
    parser.add_argument("--turns", type=int, default=320, help="user turns of the per-turn CPU measurement")
    parser.add_argument("--turn-domain", choices=("mock", "telecom"), default="mock",
                        help="the user-turn measurement's task (telecom: with the user's device tools)")
    parser.add_argument("--turns-only", action="store_true", help="skip the episodes")
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of the user turns")
    harness.add_gc_and_procs_args(parser)
    parser.add_argument("--serve-user", metavar="SPEC", help=argparse.SUPPRESS)  # the canned user's own process
    parser.add_argument("--engine-url", help=argparse.SUPPRESS)  # a --procs shard's own process
    parser.add_argument("--user-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_user:
        serve_user(args.serve_user)
        return 0
    if args.user_turns < 2:
        parser.error("--user-turns must be >= 2 (the opening request and the stop)")
    harness.check_procs(parser, args)
    import logging

    logging.getLogger("tau2_rl_pipeline.benchmark.episode").setLevel(logging.ERROR)  # mock's evaluator raises on some tasks
    if args.engine_url:
        harness.run_shard(args, warmed_up(args, args.engine_url, args.user_url, harness.load_tokenizer()))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        print(turns_table(args, user_turns(args, Path(tmp))))
        if not args.turns_only:
            print()
            print(episodes_table(args, episodes(args, sys.argv[1:] if argv is None else argv, Path(tmp),
                                                harness.load_tokenizer())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
