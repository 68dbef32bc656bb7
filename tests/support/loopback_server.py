"""A real HTTP server on 127.0.0.1 that answers like SGLang, backed by a TransformersEngine over a tiny model.

It stands in for an SGLang server where none can run (no GPU): tokens and log-probs are real samples of a real
model, and the request/response shapes follow SGLang's documented native `/generate` and its OpenAI-compatible
`/v1/chat/completions` (which litellm, hence tau2's user simulator, talks to). For tests and benchmarks it can
inject faults (5xx, dropped connections, hangs, non-JSON bodies), add latency, record every request and the
peak number open at once, and replay scripted token sequences.

    python -m support.loopback_server --model DIR --port 30000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import json
import random
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from aiohttp import web

from tau2_rl_pipeline.benchmark.actions import parse_completion
from tau2_rl_pipeline.rollout.engines import GenerateResult, SamplingParams, StopRule, TransformersEngine

HOST = "127.0.0.1"  # loopback only: this server has no authentication
LOOPBACK_HOSTS = ("127.0.0.1", "::1")
# Also the benchmarking range (RFC 2544), never routed: the namespaced hosts of tests/support/hosts.py, which only each other
# reach, give their servers addresses there.
TEST_HOSTS = ipaddress.ip_network("198.18.0.0/15")
PREFIX_CACHE_PROMPTS = 256  # recent prompts a request's cached prefix is looked up in (as SGLang's radix cache)
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default when sampling_params omits max_new_tokens


def serves_only_tests(host: str) -> bool:
    """A loopback address, or one of the namespaced test hosts' (reachable from no real network)."""
    try:
        return host in LOOPBACK_HOSTS or ipaddress.ip_address(host) in TEST_HOSTS
    except ValueError:
        return False


class Fault(str, Enum):
    ERROR_500 = "error_500"  # HTTP 500 with an SGLang-style error body
    DROP = "drop"  # close the connection without answering
    HANG = "hang"  # answer only after FaultPlan.hang_s (past a client's timeout)
    MALFORMED = "malformed"  # HTTP 200 whose body is not JSON


class FaultPlan:
    """Which model requests (`/generate`, `/v1/chat/completions`) fail, and how: first the queued faults in
    order, then each request independently with probability `rate` (kind drawn from `kinds`, seeded RNG).
    Safe to change from the test's thread while the server thread reads it."""

    def __init__(self, *, hang_s: float = 30.0) -> None:
        self.hang_s = hang_s
        self._queue: deque[Fault] = deque()
        self._rate = 0.0
        self._kinds: tuple[Fault, ...] = (Fault.ERROR_500,)
        self._rng = random.Random(0)
        self._lock = threading.Lock()

    def fail_next(self, n: int, fault: Fault = Fault.ERROR_500) -> None:
        with self._lock:
            self._queue.extend([Fault(fault)] * n)

    def fail_randomly(self, rate: float, *, kinds: tuple[Fault, ...] = (Fault.ERROR_500, Fault.DROP,
                                                                        Fault.MALFORMED), seed: int = 0) -> None:
        if not 0.0 <= rate <= 1.0 or not kinds:
            raise ValueError(f"rate must be in [0, 1] and kinds non-empty, got rate={rate} kinds={kinds}")
        with self._lock:
            self._rate, self._kinds, self._rng = rate, tuple(Fault(k) for k in kinds), random.Random(seed)

    def clear(self) -> None:
        with self._lock:
            self._queue.clear()
            self._rate = 0.0

    def take(self) -> Fault | None:
        """The fault for the request arriving now, if any."""
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            if self._rate and self._rng.random() < self._rate:
                return self._rng.choice(self._kinds)
            return None


# ---------------------------------------------------------------------------------------------------------------
# Pure request/response helpers


def sampling_from_sglang(params: dict[str, Any]) -> SamplingParams:
    """SamplingParams from a `/generate` body's sampling_params (SGLang's names; unknown keys ignored)."""
    stop = params.get("stop") or ()
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)), top_p=float(params.get("top_p", 1.0)),
        top_k=int(params.get("top_k", -1)),
        max_new_tokens=int(params.get("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stop_token_ids=tuple(int(t) for t in params.get("stop_token_ids") or ()),
        seed=params.get("sampling_seed"))


def truncate_scripted(ids: list[int], rule: StopRule, max_new_tokens: int) -> tuple[list[int], str]:
    """Cut a scripted sequence where sampling would have stopped: at the first stop match or at the token limit."""
    for n in range(1, min(len(ids), max_new_tokens) + 1):
        if rule.matched(ids[:n]) is not None:
            return ids[:n], "stop"
    if len(ids) >= max_new_tokens:
        return ids[:max_new_tokens], "length"
    return list(ids), "stop"  # a script that ends early is an EOS the caller chose not to spell out


def parse_qwen3_tool_calls(text: str, ids: Iterator[int] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Split Qwen3 output into content and OpenAI `tool_calls` with the project's parser; output that does not
    parse stays whole in the content, as text, with no tool calls. Call ids are numbered from `ids` (a server's
    own count, so that two runs of one script get the same ids), else random."""
    action = parse_completion(text)
    if action.error is not None:
        return text.strip(), []
    calls = [{"id": f"call_{next(ids):024x}" if ids is not None else f"call_{uuid.uuid4().hex[:24]}",
              "type": "function",
              "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
             for c in action.tool_calls]
    return action.content, calls


def _error(status: int, message: str) -> web.Response:
    """SGLang's error body shape ({"error": {"message": ...}}), which OpenAI clients also read."""
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


class BadRequest(ValueError):
    """Input the server refuses with HTTP 400."""


# ---------------------------------------------------------------------------------------------------------------
# The server


class LoopbackServer:
    """SGLang look-alike on 127.0.0.1 (port 0 = the OS picks), served by aiohttp on its own thread and loop.

    `faults` injects failures; `latency_s` delays every model request; `script(...)` queues token sequences that
    the next model requests return instead of sampling (log-probs then come from the real model scoring those
    tokens teacher-forced, at the request's temperature, without top-k/top-p); `responder(path, input_ids)`, when
    set, may answer a request with token ids of its choosing (None: script or sample). `requests` holds every
    (path, JSON body) received, in order (`raw_bodies`: their bytes; `request_times`: when each arrived, by
    time.monotonic); `max_concurrent` the peak number of model requests open at once.

    Besides the model endpoints it answers what slime's end-of-rollout abort calls (slime/rollout/sglang_rollout.py
    `abort`): the router's `GET /workers`, a server's `POST /abort_request` (`abort_all`: every `/generate` in
    flight returns at once with finish reason `abort`) and `GET /v1/loads`. `cached_tokens` is the longest prefix
    a prompt shares with a recent one, as SGLang's prefix cache reports it; `custom_params`
    `{"return_top_p_token_ids": true}` returns each sampled token's top-p nucleus (slime's top-p replay).

    `weight_version` is what every answer reports as the weights' version (SGLang's `meta_info.weight_version`,
    which slime sets at each weight update); set it to stand for an update between rollouts. It also answers what
    slime's weight update calls on each engine (slime/backends/megatron_utils/update_weight/, through
    slime/backends/sglang_utils/sglang_engine.py), as SGLang does: `POST /pause_generation` (mode `abort`,
    SGLang's default and what slime sends: every `/generate` in flight returns at once with finish reason `abort`,
    and new ones wait until `POST /continue_generation`), `GET /flush_cache` (refused while a `/generate` is
    open; empties the prefix cache), `POST /update_weights_from_distributed` (no tensors can travel to this
    server, so only an empty list of names; its `weight_version` becomes the served one) and
    `GET /get_weight_version` (and `POST /release_memory_occupation` and `/resume_memory_occupation`, which
    slime's engine recovery sends to a colocated engine it restarted). The chat endpoint is never paused: in a run the user simulator is another server.

    `hang()` makes it a hung engine, as an SGLang server whose scheduler is stuck: it still accepts connections, but
    no `/generate`, `/v1/chat/completions` or `/health_generate` (SGLang's one-token generation through the
    scheduler) is answered any more, those in flight included; `/health` (the HTTP server alone) still answers.

    `chat_answer(body) -> str | None`, when set, gives the text of a `/v1/chat/completions` answer instead (e.g. a
    judge's verdict, which a tiny model cannot give); None falls through to the responder, the script or the model.

    `gate(path, body)`, when set, is awaited (on the server's loop) before each model request is answered, after
    its latency: a test holds a request until another has arrived, so an order it needs holds at any machine load
    (a held `/generate` is still cut short by an abort).
    """

    def __init__(self, engine: TransformersEngine, *, model_name: str = "tiny", port: int = 0,
                 latency_s: float = 0.0, default_max_tokens: int = 64, hang_s: float = 30.0,
                 host: str = HOST) -> None:
        if engine.tokenizer is None:
            raise ValueError("the loopback server needs an engine with a tokenizer (to render chats and text)")
        if not serves_only_tests(host):
            raise ValueError(f"host must be a loopback address {LOOPBACK_HOSTS} or one of the namespaced test hosts' "
                             f"{TEST_HOSTS}, got {host!r} (no authentication)")
        self.host = host
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.latency_s = latency_s
        self.weight_version = "default"
        self.default_max_tokens = default_max_tokens
        self.faults = FaultPlan(hang_s=hang_s)
        self.requests: list[tuple[str, Any]] = []
        self.request_times: list[float] = []
        self.responder: Callable[[str, list[int]], list[int] | None] | None = None
        self.raw_bodies: list[bytes] = []  # the same requests' bodies, byte for byte
        self._call_ids = itertools.count()
        self.max_concurrent = 0
        self.max_generating = 0  # peak number of /generate requests open at once
        self._recent_prompts: deque[list[int]] = deque(maxlen=PREFIX_CACHE_PROMPTS)
        self._generating: set[asyncio.Task] = set()
        self._aborted: set[asyncio.Task] = set()
        self._unpaused = asyncio.Event()  # cleared by /pause_generation, set by /continue_generation
        self._unpaused.set()
        self.hung = False  # hang(): nothing through the scheduler is answered
        self.port = port
        self._open = 0
        self._script: deque[list[int]] = deque()
        self.chat_answer: Callable[[dict[str, Any]], str | None] | None = None
        self.gate: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._startup_error: BaseException | None = None

    @classmethod
    def from_model_dir(cls, path: str | Path, *, seed: int | None = None, **kwargs: Any) -> LoopbackServer:
        return cls(TransformersEngine.from_pretrained(path, seed=seed), **kwargs)

    @property
    def base_url(self) -> str:
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"

    def script(self, *sequences: list[int]) -> None:
        """Queue token sequences for the next model requests to return, one per request."""
        self._script.extend(list(s) for s in sequences)

    def hang(self) -> None:
        """From now on, answer nothing that goes through the model (see the class's docstring)."""
        self.hung = True

    async def _while_hung(self) -> None:
        while self.hung:
            await asyncio.sleep(3600)

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> str:
        if self._thread is not None:
            raise RuntimeError("server already started")
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="loopback-server", daemon=True)
        self._thread.start()
        ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"loopback server failed to start: {self._startup_error}") from self._startup_error
        return self.base_url

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = None

    def __enter__(self) -> LoopbackServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, ready: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health_generate)  # slime's engine: after a launch, its monitor
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/workers", self._workers)
        app.router.add_post("/abort_request", self._abort_request)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_post("/pause_generation", self._pause_generation)
        app.router.add_post("/continue_generation", self._continue_generation)
        app.router.add_get("/flush_cache", self._flush_cache)
        app.router.add_post("/update_weights_from_distributed", self._update_weights_from_distributed)
        app.router.add_get("/get_weight_version", self._get_weight_version)
        # colocated engines' offload and onload (slime's engine recovery releases a new engine's memory, then resumes
        # its weights): nothing to move here; SGLang's handlers return nothing, i.e. JSON null
        app.router.add_post("/release_memory_occupation", self._memory_occupation)
        app.router.add_post("/resume_memory_occupation", self._memory_occupation)
        # handler_cancellation: a client that gives up (timeout) cancels its hung handler instead of leaving it.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, self.host, self.port).start())
            self.port = runner.addresses[0][1]
        except BaseException as exc:  # reported to start()'s caller, e.g. a port already in use
            self._startup_error = exc
            ready.set()
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    # -- handlers -------------------------------------------------------------------------------------------
    async def _record(self, request: web.Request) -> Any:
        """The request's JSON body (None if it has none), logged with its path, its bytes and its arrival time."""
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append((request.path, body))
        self.raw_bodies.append(raw)
        self.request_times.append(time.monotonic())
        return body

    async def _model_request(self, request: web.Request, answer: Any) -> web.StreamResponse:
        """What every model endpoint shares: record, count open requests, inject faults, add latency."""
        body = await self._record(request)
        if request.path == "/generate":  # a paused server holds new requests until it goes on (SGLang's is_pause)
            await self._unpaused.wait()
        self._open += 1
        self.max_concurrent = max(self.max_concurrent, self._open)
        try:
            await self._while_hung()
            fault = self.faults.take()
            if fault is Fault.ERROR_500:
                return _error(500, "injected fault: internal server error")
            if fault is Fault.DROP:
                assert request.transport is not None
                request.transport.close()
                return web.Response()  # never reaches the client: its connection is gone
            if fault is Fault.MALFORMED:
                return web.Response(text='{"text": "cut short', content_type="application/json")
            if fault is Fault.HANG:
                await asyncio.sleep(self.faults.hang_s)

            async def respond() -> Any:
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                if not isinstance(body, dict):
                    return _error(400, "request body must be a JSON object")
                if self.gate is not None:
                    await self.gate(request.path, body)
                try:
                    return web.json_response(await answer(body))
                except (BadRequest, ValueError, TypeError) as exc:
                    return _error(400, str(exc))

            if request.path != "/generate":
                return await respond()
            return await self._abortable(respond())
        finally:
            self._open -= 1

    async def _abortable(self, respond) -> web.StreamResponse:
        """A `/generate` answer that `/abort_request` can cut short: it then returns at once, as SGLang does, with
        finish reason `abort` and no tokens."""
        task = asyncio.ensure_future(respond)
        self._generating.add(task)
        self.max_generating = max(self.max_generating, len(self._generating))
        try:
            return await task
        except asyncio.CancelledError:
            if task not in self._aborted:
                raise
            meta = {"id": uuid.uuid4().hex, "finish_reason": {"type": "abort", "message": "Abort before prefill"},
                    "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "weight_version": self.weight_version,
                    "output_token_logprobs": []}
            return web.json_response({"text": "", "output_ids": [], "meta_info": meta})
        finally:
            self._generating.discard(task)
            self._aborted.discard(task)

    def _cached_tokens(self, input_ids: list[int]) -> int:
        best = 0
        for earlier in self._recent_prompts:
            n = 0
            for a, b in zip(earlier, input_ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._recent_prompts.append(list(input_ids))
        return best

    async def _run(self, input_ids: list[int], sampling: SamplingParams,
                   path: str = "/generate") -> tuple[GenerateResult, int | str | None]:
        """Sample (or replay the script or the responder's ids) and say which stop id/string ended it, as
        SGLang's `matched` does. A chosen answer is scored only where its log-probs are returned (`/generate`;
        chat answers carry none)."""
        rule = self.engine.stop_rule(sampling)
        chosen = self.responder(path, input_ids) if self.responder is not None else None
        if chosen is None and self._script:
            chosen = self._script.popleft()
        if chosen is not None:
            ids, finish = truncate_scripted(chosen, rule, sampling.max_new_tokens)
            logprobs = (await asyncio.to_thread(self.engine.score, input_ids, ids, sampling.temperature)
                        if path == "/generate" else [0.0] * len(ids))
            result = GenerateResult(output_ids=ids, output_logprobs=logprobs, finish_reason=finish)
        else:
            result = await self.engine.generate(input_ids, sampling)
        return result, rule.matched(result.output_ids) if result.finish_reason == "stop" else None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(request, self._answer_generate)

    async def _answer_generate(self, body: dict[str, Any]) -> dict[str, Any]:
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or (input_ids and isinstance(input_ids[0], list)):
            raise BadRequest("this server takes one prompt as input_ids (a list of ints); text and batches are "
                             "not supported")
        params = body.get("sampling_params") or {}
        sampling = sampling_from_sglang(params)
        cached = self._cached_tokens(input_ids)
        result, matched = await self._run(input_ids, sampling)
        if result.finish_reason == "stop":
            finish = {"type": "stop", "matched": matched}
        else:
            finish = {"type": "length", "length": len(result.output_ids)}
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(input_ids),
            "completion_tokens": len(result.output_ids), "cached_tokens": cached, "weight_version": self.weight_version}
        if (params.get("custom_params") or {}).get("return_top_p_token_ids"):
            spans = await asyncio.to_thread(self.engine.top_p_spans, input_ids, result.output_ids, sampling)
            meta["top_p_token_ids"], meta["top_p_token_offsets"] = spans.ids, spans.offsets
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(result.output_logprobs, result.output_ids, strict=True)]
        # The text is never trimmed here (as SGLang with no_stop_trim=True, which is what our client sends).
        text = self.tokenizer.decode(result.output_ids, skip_special_tokens=params.get("skip_special_tokens", True))
        return {"text": text, "output_ids": result.output_ids, "meta_info": meta}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._model_request(request, self._answer_chat)

    async def _answer_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        if body.get("stream"):
            raise BadRequest("streaming is not supported by the loopback server")
        if body.get("n", 1) != 1:
            raise BadRequest("only n=1 is supported")
        prompt = self.tokenizer.apply_chat_template(
            messages, tools=body.get("tools") or None, add_generation_prompt=True, tokenize=False,
            **(body.get("chat_template_kwargs") or {}))
        input_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        stop = body.get("stop") or ()
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or self.default_max_tokens
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
            max_new_tokens=int(max_tokens), stop=(stop,) if isinstance(stop, str) else tuple(stop),
            seed=body.get("seed"))
        answer = self.chat_answer(body) if self.chat_answer is not None else None
        if answer is not None:
            ids = self.tokenizer.encode(answer, add_special_tokens=False)
            result, text = GenerateResult(output_ids=ids, output_logprobs=[0.0] * len(ids), finish_reason="stop"), answer
        else:
            result, _ = await self._run(input_ids, sampling, "/v1/chat/completions")
            text = self.tokenizer.decode(result.output_ids, skip_special_tokens=True)
        content, tool_calls = parse_qwen3_tool_calls(text, self._call_ids)
        finish = "tool_calls" if tool_calls else result.finish_reason
        message = {"role": "assistant", "content": content if (content or not tool_calls) else None,
                   "tool_calls": tool_calls or None}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model_name),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(input_ids), "completion_tokens": len(result.output_ids),
                      "total_tokens": len(input_ids) + len(result.output_ids)}}

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response()

    async def _health_generate(self, request: web.Request) -> web.StreamResponse:
        await self._while_hung()
        return web.Response()

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "loopback",
             "root": self.model_name}]})

    async def _workers(self, request: web.Request) -> web.StreamResponse:
        """The router's worker list (what slime's abort reads): this server is its only worker."""
        return web.json_response({"workers": [{"url": self.base_url, "model_id": self.model_name,
                                               "worker_type": "regular", "is_healthy": True}], "total": 1})

    def _abort_all(self) -> None:
        for task in list(self._generating):
            self._aborted.add(task)
            task.cancel()

    async def _abort_request(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if isinstance(body, dict) and body.get("abort_all"):
            self._abort_all()
        return web.Response()

    async def _pause_generation(self, request: web.Request) -> web.StreamResponse:
        """SGLang's pause in its default mode `abort`: hold new requests, abort those in flight, answer once none
        is left. (Its `retract` and `in_place` modes keep requests in flight; slime's weight update never asks.)"""
        body = await self._record(request)
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode != "abort":
            return _error(400, f"pause mode {mode!r} is not served by the loopback server (only 'abort')")
        self._unpaused.clear()
        while self._generating:
            self._abort_all()
            await asyncio.sleep(0.01)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue_generation(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        self._unpaused.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _flush_cache(self, request: web.Request) -> web.StreamResponse:
        """As SGLang: not while a request is running (HTTP 400; slime's flush_cache retries), else the prefix cache
        is emptied."""
        await self._record(request)
        if self._generating:
            return web.Response(status=400, text="Cache not flushed: there are running requests.\n")
        self._recent_prompts.clear()
        return web.Response(text="Cache flushed.\n")

    async def _update_weights_from_distributed(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if not isinstance(body, dict) or body.get("names"):
            return _error(400, "the loopback server cannot receive weights: only an update with no tensors "
                               "(names: []) that sets weight_version")
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
        return web.json_response({"success": True, "message": "Succeeded to update parameter online."})

    async def _memory_occupation(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.json_response(None)

    async def _get_weight_version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"weight_version": self.weight_version})

    async def _loads(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"loads": [{"num_running_reqs": len(self._generating), "num_waiting_reqs": 0}]})

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"model_path": self.model_name, "tokenizer_path": self.model_name,
                                  "is_generation": True, "weight_version": self.weight_version})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="HF model directory (weights + tokenizer)")
    parser.add_argument("--port", type=int, default=30000, help="port (0 = any free port)")
    parser.add_argument("--host", default=HOST, help=f"127.0.0.1, or a namespaced test host's address in {TEST_HOSTS}")
    parser.add_argument("--model-name", default=None, help="name served by /v1/models (default: directory name)")
    parser.add_argument("--latency-s", type=float, default=0.0, help="extra delay added to every model request")
    parser.add_argument("--default-max-tokens", type=int, default=64,
                        help="chat completion length when a request sets no max_tokens")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed of the engine (default: random)")
    args = parser.parse_args(argv)
    if not serves_only_tests(args.host):
        print(f"error: --host {args.host}: only loopback or a namespaced test host's address ({TEST_HOSTS}): this "
              "server has no authentication", file=sys.stderr)
        raise SystemExit(2)
    try:
        server = LoopbackServer.from_model_dir(
            args.model, seed=args.seed, model_name=args.model_name or Path(args.model).name, port=args.port,
            host=args.host,
            latency_s=args.latency_s, default_max_tokens=args.default_max_tokens)
    except FileNotFoundError as e:
        print(f"error: --model {e}", file=sys.stderr)
        raise SystemExit(2) from None
    with server:
        print(f"serving {args.model} at {server.base_url} (Ctrl-C to stop)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
