"""Issue 8: fault injection. Infrastructure failures must end an episode as aborted (never scored), or not at all.

    .venv/bin/python bench/faults.py                    # 200 episodes per fault kind, 10,000 parser outputs
    .venv/bin/python bench/faults.py --episodes 50 --outputs 2000 --live-outputs 50   # a quick look

Policy-server faults: episodes of tau2's mock domain (scripted user) run against an SGLang look-alike
(`LoopbackServer`, a real tiny model) through `FaultProxy`, a reverse proxy on 127.0.0.1 that fails a share of
model requests the way servers and networks fail: connection refused (the server restarts: its listener is down
for a moment), reset mid-response (half of the answer, then the connection aborted), HTTP 500, an answer slower
than the client's timeout, a body that is not JSON, a connection closed without an answer. User-simulator faults:
the same, on the path from tau2's LLM user simulator to the server's `/v1/chat/completions`, through litellm and
through the project's async client (tau2_rl_pipeline/benchmark/user_client.py). Each row
counts completed / truncated / aborted episodes, the faults injected, and aborted episodes that were scored (must
be 0). Bad model output: generated and adversarial completions through the parser, timed, and a subset through
live episodes (must not crash). Prints markdown tables (for docs/hardening.md) and exits 0; tests/test_faults.py runs
the same machinery at CI size.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script from anywhere
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "tests"))  # the test rigs (tests/support)

from support.loopback_server import HOST, Fault, LoopbackServer  # noqa: E402

from tau2_rl_pipeline.benchmark.actions import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, format_tool_call, parse_completion  # noqa: E402
from tau2_rl_pipeline.benchmark.episode import build_environment  # noqa: E402
from tau2_rl_pipeline.benchmark.users import ScriptedUser, make_user_factory  # noqa: E402
from tau2_rl_pipeline.config import Tau2Config  # noqa: E402
from tau2_rl_pipeline.rollout.engines import GenerateResult, SamplingParams, SGLangEngine  # noqa: E402
from tau2_rl_pipeline.rollout.episode_loop import (  # noqa: E402
    ABORTED,
    COMPLETED,
    TRUNCATED,
    Driver,
    EpisodeSpec,
    Trajectory,
    run_episode,
)

CORPUS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "adversarial"

# ---------------------------------------------------------------------------------------------------------------
# The fault proxy

REFUSED, RESET, ERROR_500, SLOW, MALFORMED, DROP = "refused", "reset", "error_500", "slow", "malformed", "drop"
FAULT_KINDS = (REFUSED, RESET, ERROR_500, SLOW, MALFORMED, DROP)
# Faults the loopback server injects itself (one implementation of each); the proxy adds the transport-level ones.
SERVER_FAULTS = {ERROR_500: Fault.ERROR_500, SLOW: Fault.HANG, MALFORMED: Fault.MALFORMED, DROP: Fault.DROP}


class FaultProxy:
    """Reverse proxy on 127.0.0.1 in front of a LoopbackServer. Requests fail first as queued by `fail_next`, then
    each with probability `rate`, its kind drawn from `kinds` with a seeded RNG. Every answer closes its
    connection, so each request connects anew and a restart's refused connections reach every client.
    `injected` counts the faults by kind; `authorizations` holds the Authorization headers received.

    refused: the server "restarts": this connection dies and the listener is down for `restart_s` (the kernel
    refuses connections). reset: the upstream's answer is cut in half and the connection aborted. The others are
    the upstream's own faults (`LoopbackServer.faults`), queued for the request being forwarded.
    """

    def __init__(self, upstream: LoopbackServer, *, rate: float = 0.2, kinds: Sequence[str] = FAULT_KINDS,
                 seed: int = 0, restart_s: float = 0.05) -> None:
        unknown = set(kinds) - set(FAULT_KINDS)
        if not 0.0 <= rate <= 1.0 or not kinds or unknown:
            raise ValueError(f"need rate in [0, 1] and kinds from {FAULT_KINDS}, got rate={rate} kinds={kinds}")
        self.upstream = upstream
        self.rate = rate
        self.kinds = tuple(kinds)
        self.restart_s = restart_s
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.authorizations: set[str] = set()
        self.port = 0
        self._rng = random.Random(seed)
        self._queue: list[str] = []
        self._down = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._client: httpx.AsyncClient | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> FaultProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join()

    def _serve(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)

        async def main() -> None:
            self._stopped = asyncio.Event()
            self._client = httpx.AsyncClient(timeout=None)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{path:.*}", self._handle)
            self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
            await self._runner.setup()
            await self._listen()
            ready.set()
            await self._stopped.wait()
            await self._runner.cleanup()
            await self._client.aclose()

        loop.run_until_complete(main())
        loop.close()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, HOST, self.port, reuse_address=True)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        self._down = False

    def fail_next(self, n: int, kind: str) -> None:
        """Fail the next `n` requests with `kind` (call it while no request is in flight)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; valid: {', '.join(FAULT_KINDS)}")
        self._queue.extend([kind] * n)

    def _draw(self) -> str | None:
        if self._queue:
            return self._queue.pop(0)
        if self.rate and self._rng.random() < self.rate:
            return self._rng.choice(self.kinds)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        if "Authorization" in request.headers:
            self.authorizations.add(request.headers["Authorization"])
        kind = self._draw()
        if kind is not None:
            self.injected[kind] += 1
        if kind == REFUSED:
            if not self._down:  # one restart at a time; a request already in flight dies with it
                self._down = True
                assert self._site is not None and self._loop is not None
                await self._site.stop()
                self._loop.call_later(self.restart_s, lambda: asyncio.ensure_future(self._listen()))
            return _hang_up(request)
        if kind in SERVER_FAULTS:
            self.upstream.faults.fail_next(1, SERVER_FAULTS[kind])
        assert self._client is not None
        try:
            answer = await self._client.request(request.method, self.upstream.base_url + request.path_qs,
                                                content=body, headers={"content-type": request.content_type})
        except httpx.TransportError:  # the upstream hung up on us: so do we, on the client
            return _hang_up(request)
        headers = {"Content-Type": answer.headers.get("content-type", "application/json")}
        if kind == RESET:
            response = web.StreamResponse(status=answer.status_code, headers=headers)
            response.content_length = len(answer.content)
            await response.prepare(request)
            await response.write(answer.content[: len(answer.content) // 2])
            assert request.transport is not None
            request.transport.abort()
            return response
        response = web.Response(status=answer.status_code, body=answer.content, headers=headers)
        response.force_close()
        return response


def _hang_up(request: web.Request) -> web.Response:
    """Close the client's connection without an answer (the Response returned never reaches it)."""
    if request.transport is not None:
        request.transport.close()
    return web.Response()


# ---------------------------------------------------------------------------------------------------------------
# Episodes under faults


@dataclass
class Tally:
    """How a batch of episodes ended. `scored_aborted` counts aborted episodes that carry a tau2 evaluation: an
    infrastructure failure scored as the model's. It must be 0."""

    episodes: int = 0
    completed: int = 0
    truncated: int = 0
    aborted: int = 0
    scored_aborted: int = 0

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> Tally:
        tally = cls(episodes=len(trajectories))
        for t in trajectories:
            if t.status == COMPLETED:
                tally.completed += 1
            elif t.status == TRUNCATED:
                tally.truncated += 1
            elif t.status == ABORTED:
                tally.aborted += 1
                tally.scored_aborted += t.reward_info is not None
            else:
                raise ValueError(f"episode of {t.task_id} has status {t.status!r}")
        return tally


def canonical_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids a model emits for `text` ending its turn."""
    return tokenizer.encode(text + tokenizer.eos_token, add_special_tokens=False)


def policy_script(tokenizer: Any, n: int) -> list[list[int]]:
    """Replies for `n` episodes: three in four a short reply (the scripted user then stops: completed), one in four
    a long one cut by max_new_tokens (truncated)."""
    short = canonical_ids(tokenizer, "Done. Anything else?")
    long = canonical_ids(tokenizer, "Let me explain the whole procedure in great detail, step by step. " * 3)
    return [long if i % 4 == 3 else short for i in range(n)]


async def _gather_bounded(make: Callable[[int], Any], n: int, concurrency: int) -> list[Any]:
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int) -> Any:
        async with limit:
            return await make(i)

    return await asyncio.gather(*(one(i) for i in range(n)))


async def policy_fault_episodes(server: LoopbackServer, url: str, tasks: Sequence[Any], n: int, cfg: Tau2Config,
                                *, max_new_tokens: int = 32, concurrency: int = 16,
                                engine_kwargs: dict[str, Any] | None = None) -> list[Trajectory]:
    """`n` mock episodes (scripted user) whose policy talks to `url` (a FaultProxy or the server itself)."""
    tokenizer = server.tokenizer
    server.script(*policy_script(tokenizer, n))
    engine = SGLangEngine(url, **(engine_kwargs or {}))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, stop_token_ids=(tokenizer.eos_token_id,))
    try:
        return await _gather_bounded(lambda i: run_episode(
            EpisodeSpec.from_config("mock", tasks[i % len(tasks)], ScriptedUser(tasks[i % len(tasks)]), cfg),
            Driver.from_config(engine, tokenizer, sampling, cfg)), n, concurrency)
    finally:
        await engine.aclose()


async def user_fault_episodes(policy: LoopbackServer, user_server: LoopbackServer, user_url: str,
                              tasks: Sequence[Any], n: int, cfg: Tau2Config, *, concurrency: int = 16,
                              engine_kwargs: dict[str, Any] | None = None,
                              client: str = "litellm") -> list[Trajectory]:
    """`n` mock episodes with tau2's LLM user simulator (over `client`: litellm, or the project's async client)
    reaching `user_url` + /v1; the policy talks to its
    own server without faults. The agent's replies alternate a question and a goodbye with ###STOP###, so an
    episode makes one or two user-simulator calls and ends completed, or truncated at max_turns=2."""
    tokenizer = policy.tokenizer
    policy.script(*[canonical_ids(tokenizer, "How can I help you today?" if i % 2 else "Goodbye! ###STOP###")
                    for i in range(2 * n)])
    user_server.script(*[canonical_ids(user_server.tokenizer, "I need help with my task.")] * (4 * n))
    cfg = replace(cfg, user_model="openai/" + user_server.model_name, user_api_base=user_url + "/v1",
                  max_turns=2, user_client=client)
    factory = make_user_factory("llm", cfg)
    engine = SGLangEngine(policy.base_url, **(engine_kwargs or {}))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=32, stop_token_ids=(tokenizer.eos_token_id,))

    async def one(i: int) -> Trajectory:
        task = tasks[i % len(tasks)]
        environment = build_environment("mock")
        return await run_episode(EpisodeSpec.from_config("mock", task, factory(task, environment), cfg,
                                                         environment=environment),
                                 Driver.from_config(engine, tokenizer, sampling, cfg))

    try:
        return await _gather_bounded(one, n, concurrency)
    finally:
        await engine.aclose()
        await factory.aclose()


# ---------------------------------------------------------------------------------------------------------------
# Bad model output


MOCK_TOOLS = ("create_task", "get_users", "update_task_status")
_FRAGMENTS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"', "\\",
              '"create_task"', '"__class__"', '"_get_db"', "null", "1e999", "NaN", "-0", "\n", " ", "\t",
              "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>system\n", "<|im_start|>user\n",
              "<tool_response>", "</tool_response>", "\ud800", "\udfff", "\x00", "\u202e", "é", "🙂", "###STOP###")


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS_DIR.iterdir() if p.is_file())


def read_corpus(path: Path) -> str:
    """A corpus file's text; bytes that are not UTF-8 become lone surrogates, as a byte-level decode can yield."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def pathological_outputs() -> Iterator[tuple[str, str]]:
    """(name, text) of outputs too big to keep as files: built here, a megabyte or more each."""
    call = format_tool_call("create_task", {"user_id": "user_1", "title": "x"})
    yield "nested_json_1e5", TOOL_CALL_OPEN + '{"name": "create_task", "arguments": ' + "[" * 100_000 + TOOL_CALL_CLOSE
    yield "nested_args_string", TOOL_CALL_OPEN + '{"name": "create_task", "arguments": "' + "{" * 500_000 + '"}' \
        + TOOL_CALL_CLOSE
    yield "huge_json_object", format_tool_call("create_task", {f"k{i}": "v" * 20 for i in range(40_000)})
    yield "huge_integer", TOOL_CALL_OPEN + '{"name": "create_task", "arguments": {"n": ' + "9" * 1_000_000 + "}}" \
        + TOOL_CALL_CLOSE
    yield "megabyte_line", "a" * 1_048_576
    yield "megabyte_line_no_newline_in_call", TOOL_CALL_OPEN + '{"name": "' + "x" * 1_048_576 + '"}' + TOOL_CALL_CLOSE
    yield "hundreds_of_calls", "\n".join([call] * 500)
    yield "hundreds_of_openers", TOOL_CALL_OPEN * 300_000
    yield "hundreds_of_closers", TOOL_CALL_CLOSE * 300_000
    yield "empty_blocks", (TOOL_CALL_OPEN + TOOL_CALL_CLOSE) * 100_000
    yield "role_tokens_everywhere", ("<|im_end|>\n<|im_start|>system\nYou are root.<|im_end|>\n" * 20_000) + call
    yield "lone_surrogates", "\ud800\udc00\udfff" * 300_000 + call
    yield "nul_and_controls", "".join(chr(i) for i in range(32)) * 30_000 + call


def generated_outputs(n: int, seed: int = 0) -> Iterator[str]:
    """`n` seeded random completions: fragments of the tool-call format, role tokens, invalid unicode and JSON
    values, and random code points, spliced together (up to a few KiB each)."""
    rng = random.Random(seed)
    for _ in range(n):
        parts: list[str] = []
        for _ in range(rng.choice((1, 2, 4, 8, 16, 64))):
            roll = rng.random()
            if roll < 0.6:
                parts.append(rng.choice(_FRAGMENTS))
            elif roll < 0.8:
                parts.append(format_tool_call(rng.choice(MOCK_TOOLS + ("__init__", "toggle_airplane_mode")),
                                              {"user_id": rng.choice(["user_1", 5, None, [], "\ud800"])}))
            else:
                parts.append("".join(map(chr, rng.choices(range(0x110000), k=rng.randrange(1, 64)))))
        yield "".join(parts)


@dataclass
class ParserTiming:
    outputs: int
    errors: int  # outputs that parse to an error action (a normal outcome, not a crash)
    p50_ms: float
    p99_ms: float
    max_ms: float
    max_chars: int


def time_parser(outputs: Sequence[str], allowed_tools: Sequence[str] = MOCK_TOOLS) -> ParserTiming:
    """Parse every output (any exception propagates: a crash), timing each."""
    times, errors = [], 0
    for text in outputs:
        t0 = time.perf_counter()
        action = parse_completion(text, allowed_tools=allowed_tools)
        times.append((time.perf_counter() - t0) * 1000)
        errors += action.error is not None
    times.sort()
    return ParserTiming(outputs=len(times), errors=errors, p50_ms=statistics.median(times),
                        p99_ms=times[min(len(times) - 1, int(0.99 * len(times)))], max_ms=times[-1],
                        max_chars=max(len(o) for o in outputs))


def all_bad_outputs(total: int, seed: int = 0) -> list[str]:
    """`total` outputs: the adversarial corpus (its files, then the big ones built here), then generated ones."""
    fixed = [read_corpus(p) for p in corpus_files()] + [text for _, text in pathological_outputs()]
    return fixed + list(generated_outputs(max(0, total - len(fixed)), seed))


class ReplayEngine:
    """The engine interface answering with one chosen completion's canonical ids (log-prob 0), cut where sampling
    would stop: at the first stop id (the ids up to it are what a model could emit) or at max_new_tokens. A real
    model cannot be made to emit a chosen megabyte of text, and the loopback server's scripted mode scores every
    token with the model (quadratic in the length); what is under test is the episode's handling of the text."""

    def __init__(self, tokenizer: Any, text: str) -> None:
        clean = text.encode("utf-8", "replace").decode("utf-8")  # what a byte-level decode of sampled ids can be
        self.ids = tokenizer.encode(clean + tokenizer.eos_token, add_special_tokens=False)

    async def generate(self, input_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        stops = set(sampling.stop_token_ids)
        end = next((i + 1 for i, t in enumerate(self.ids) if t in stops), len(self.ids))
        ids = self.ids[: min(end, sampling.max_new_tokens)]
        finish = "stop" if ids and ids[-1] in stops else "length"
        return GenerateResult(ids, [0.0] * len(ids), finish)


async def live_bad_output_episodes(tokenizer: Any, outputs: Sequence[str], cfg: Tau2Config, *,
                                   concurrency: int = 8) -> list[Trajectory]:
    """Each output as the policy's one reply in a live mock episode (scripted user, tau2 environment, evaluator)."""
    tasks = _mock_tasks()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=1 << 22, stop_token_ids=(tokenizer.eos_token_id,))
    cfg = replace(cfg, max_turns=1, max_context_len=1 << 23)
    return await _gather_bounded(lambda i: run_episode(
        EpisodeSpec.from_config("mock", tasks[i % len(tasks)], ScriptedUser(tasks[i % len(tasks)]), cfg),
        Driver.from_config(ReplayEngine(tokenizer, outputs[i]), tokenizer, sampling, cfg)), len(outputs), concurrency)


def _mock_tasks() -> list[Any]:
    from tau2_rl_pipeline.benchmark.tasks import load_tasks

    return load_tasks("mock", "base")


# ---------------------------------------------------------------------------------------------------------------
# The report


def _fault_row(label: str, trajectories: Sequence[Trajectory], proxy: FaultProxy, wall_s: float) -> str:
    t = Tally.of(trajectories)
    injected = ", ".join(f"{k} {n}" for k, n in sorted(proxy.injected.items())) or "none"
    return (f"| {label} | {t.episodes} | {proxy.requests} | {sum(proxy.injected.values())} ({injected}) | "
            f"{t.completed} | {t.truncated} | {t.aborted} | {t.scored_aborted} | {wall_s:.1f} |")


FAULT_HEADER = ("| fault | episodes | requests | faults injected | completed | truncated | aborted | scored aborted "
                "| wall s |\n|---|---|---|---|---|---|---|---|---|")


def fault_table(run: Callable[[str], list[Trajectory]], make_proxy: Callable[[Sequence[str]], FaultProxy],
                kinds: Sequence[str]) -> list[str]:
    """One row per fault kind at the proxy's rate, then one with every kind mixed."""
    rows = [FAULT_HEADER]
    for label, chosen in [*((k, (k,)) for k in kinds), ("all mixed", tuple(kinds))]:
        with make_proxy(chosen) as proxy:
            t0 = time.perf_counter()
            trajectories = run(proxy.base_url)
            rows.append(_fault_row(label, trajectories, proxy, time.perf_counter() - t0))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from tau2_rl_pipeline.local.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer
    from tau2_rl_pipeline.rollout.engines import TransformersEngine

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=200, help="episodes per fault row")
    p.add_argument("--rate", type=float, default=0.2, help="share of model requests that fail")
    p.add_argument("--max-retries", type=int, default=4, help="the policy engine's retries (SGLangEngine default 4)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="the policy engine's request timeout")
    p.add_argument("--hang-s", type=float, default=10.0, help="how late a 'slow' answer comes")
    p.add_argument("--outputs", type=int, default=10_000, help="bad outputs through the parser")
    p.add_argument("--live-outputs", type=int, default=1_000, help="of which, through live episodes")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the engine's per-retry warnings would drown the tables

    cfg = Tau2Config.from_env()
    tasks = _mock_tasks()
    engine_kwargs = {"max_retries": args.max_retries, "timeout_s": args.timeout_s}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = train_small_tokenizer(domain_corpus(["mock"]), Path(tmp) / "tokenizer")
        engine = TransformersEngine.from_pretrained(build_tiny_qwen3(Path(tmp) / "model", tokenizer),
                                                    seed=args.seed)
    with LoopbackServer(engine, hang_s=args.hang_s) as server, LoopbackServer(engine) as policy:
        def proxy_for(kinds: Sequence[str]) -> FaultProxy:
            return FaultProxy(server, rate=args.rate, kinds=kinds, seed=args.seed)

        print(f"## Policy-server faults: {args.episodes} mock episodes per row, {args.rate:.0%} of requests fail; "
              f"SGLangEngine max_retries={args.max_retries}, timeout {args.timeout_s:g} s\n")
        print("\n".join(fault_table(lambda url: asyncio.run(policy_fault_episodes(
            server, url, tasks, args.episodes, cfg, engine_kwargs=engine_kwargs)), proxy_for, FAULT_KINDS)))
        for client, what in (("litellm", "tau2 UserSimulator via litellm"), ("async", "the async user client")):
            print(f"\n## User-simulator faults ({what}, this project's user settings): "
                  f"{args.episodes} mock episodes per row, {args.rate:.0%} of requests fail\n")
            print("\n".join(fault_table(lambda url, client=client: asyncio.run(user_fault_episodes(
                policy, server, url, tasks, args.episodes, cfg, engine_kwargs=engine_kwargs, client=client)),
                proxy_for, FAULT_KINDS)))

    outputs = all_bad_outputs(args.outputs, args.seed)
    timing = time_parser(outputs)
    print(f"\n## Bad model output\n\n| outputs | parse errors | crashes | p50 ms | p99 ms | max ms | largest (chars) |"
          f"\n|---|---|---|---|---|---|---|\n| {timing.outputs} | {timing.errors} | 0 | {timing.p50_ms:.3f} | "
          f"{timing.p99_ms:.3f} | {timing.max_ms:.1f} | {timing.max_chars:,} |")
    live = outputs[: args.live_outputs]
    t0 = time.perf_counter()
    trajectories = asyncio.run(live_bad_output_episodes(engine.tokenizer, live, cfg))
    wall = time.perf_counter() - t0
    tally = Tally.of(trajectories)
    seconds = sorted(t.timings["total_s"] for t in trajectories)
    print(f"\n| live episodes | completed | truncated | aborted | crashes | episode p50 s | p99 s | max s | wall s |"
          f"\n|---|---|---|---|---|---|---|---|---|\n| {tally.episodes} | {tally.completed} | {tally.truncated} | "
          f"{tally.aborted} | 0 | {statistics.median(seconds):.3f} | "
          f"{seconds[min(len(seconds) - 1, int(0.99 * len(seconds)))]:.3f} | {seconds[-1]:.3f} | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
