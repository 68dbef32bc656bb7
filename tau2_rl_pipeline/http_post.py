"""One discipline for the project's HTTP clients of model servers: timeouts, retries, what failed.

The clients: SGLang's native `/generate` (the policy engine) and an
OpenAI-compatible `/v1/chat/completions` (the user simulator's fast client).

aiohttp (httpx's pool is quadratic in its size with hundreds in flight: bench/README.md, P2); at most
`max_in_flight` requests open at once; a total timeout per attempt; transient failures (connection refused or
reset, timeouts, 5xx, bodies that do not parse) retried with exponential backoff and jitter; a refused request
(4xx) not retried, since sending it again cannot help. What failed is raised as `RequestFailed`; each client words
its own error from it.

A client may be given several servers (a comma-separated list, `split_urls`) instead of one URL or a router's: each
request goes to the server with the fewest requests in flight (in turn on a tie), so the load spreads as SGLang's
router spreads it, and a server that failed is passed over for a while (its retry goes to another one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TypeVar

import aiohttp

logger = logging.getLogger(__name__)
T = TypeVar("T")


class RequestFailed(RuntimeError):
    """A request that retries did not fix, or that the server refused (`status`: its 4xx, not asked again)."""

    def __init__(self, detail: str, *, attempts: int, status: int | None = None) -> None:
        super().__init__(detail)
        self.detail = detail  # the last error; for a refusal, the server's message
        self.attempts = attempts
        self.status = status


def split_urls(value: str | Sequence[str]) -> list[str]:
    """A server's (or router's) URL, or several: a comma-separated string or a sequence. ValueError if none, or one
    is not http(s)://."""
    urls = [u.strip() for u in (value.split(",") if isinstance(value, str) else value) if u.strip()]
    if not urls:
        raise ValueError(f"no server URL in {value!r}")
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"a server URL must start with http:// or https://, got {bad[0]!r}")
    return urls


def first_unreachable(value: str | Sequence[str], timeout_s: float = 5.0) -> str | None:
    """The first server (of `split_urls(value)`) that takes no TCP connection within `timeout_s`, with the reason,
    or None when all do: one look before a run, instead of every request's retries finding out."""
    for url in split_urls(value):
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
                pass
        except (OSError, ValueError) as e:
            return f"{url} ({getattr(e, 'strerror', None) or e})"
    return None


def pick_server(in_flight: Sequence[int], down_until: Sequence[float], now: float, turn: int) -> int:
    """Index of the server for the next request: among those not resting after a failure (all, if every one is),
    the fewest in flight; on a tie the first at or after `turn` (round robin)."""
    n = len(in_flight)
    up = [i for i in range(n) if down_until[i] <= now] or list(range(n))
    return min(up, key=lambda i: (in_flight[i], (i - turn) % n))


def backoff_delay(retry: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds to wait before retry number `retry` (0-based): base * 2**retry capped at max_s, "equal jitter"
    (half fixed, half random) so a burst of failed requests does not retry in lockstep yet never retries at once."""
    ceiling = min(max_s, base_s * (2 ** retry))
    return ceiling / 2 + rng.uniform(0.0, ceiling / 2)


def server_message(body: bytes) -> str:
    """The error text a server put in its body (SGLang, OpenAI: {"error": {"message": ...}}), kept short for logs."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace")
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:300]
        for key in ("message", "detail", "error"):
            if key in parsed:
                return str(parsed[key])[:300]
    return str(parsed)[:300]


def transport_error(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, asyncio.TimeoutError):  # aiohttp's own timeouts subclass it and often carry no message
        return f"{type(exc).__name__}: no complete answer within {timeout_s} s"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


class RetryingPost:
    """POSTs JSON bodies to one URL, or spreads them over several, under the discipline above. `name` labels the
    retry warnings in the log.

    The HTTP session and the in-flight bound belong to an event loop: a session passed in is the caller's (used
    as is, never closed here); one made here is made on first use on each event loop that posts (a benchmark's
    warm-up and its timed run are two loops), and `aclose()` closes the current one.
    """

    def __init__(self, url: str | Sequence[str], *, name: str, timeout_s: float = 120.0, max_retries: int = 4,
                 backoff_base_s: float = 0.5, backoff_max_s: float = 8.0, max_in_flight: int = 256,
                 session: aiohttp.ClientSession | None = None, headers: dict[str, str] | None = None) -> None:
        self.urls = split_urls(url)
        if timeout_s <= 0 or max_retries < 0 or max_in_flight < 1 or backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError("need timeout_s > 0, max_retries >= 0, max_in_flight >= 1 and backoffs >= 0")
        self.url = ",".join(self.urls)  # for messages: the one URL, or the list as given
        self.name = name
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_in_flight = max_in_flight
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self._owns_session = session is None
        self.session = session
        self._loop: asyncio.AbstractEventLoop | None = None
        self._in_flight = asyncio.Semaphore(max_in_flight)
        self._rng = random.Random()
        self.in_flight = [0] * len(self.urls)  # per server, requests open now
        self._down_until = [0.0] * len(self.urls)
        self._turn = 0

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use on this loop: a semaphore (and a session made here) per loop
            self._loop, self._in_flight = loop, asyncio.Semaphore(self.max_in_flight)
            if self._owns_session:
                self.session = None
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.max_in_flight))
        return self.session

    async def _post_once(self, index: int, body: bytes) -> tuple[int, bytes]:
        self.in_flight[index] += 1
        try:
            async with self._http().post(self.urls[index], data=body, headers=self.headers,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
                return response.status, await response.read()
        finally:
            self.in_flight[index] -= 1

    def _pick(self) -> int:
        if len(self.urls) == 1:
            return 0
        index = pick_server(self.in_flight, self._down_until, time.monotonic(), self._turn)
        self._turn = (index + 1) % len(self.urls)
        return index

    def _failed(self, index: int) -> None:
        """Pass a server that failed over for the longest backoff (its retry, and others' requests, go elsewhere)."""
        if len(self.urls) > 1:
            self._down_until[index] = time.monotonic() + max(self.backoff_max_s, 1.0)

    async def post(self, body: bytes, parse: Callable[[bytes], T]) -> T:
        """`parse(response body)` of the first answer that parses; `parse` raises ValueError on a malformed one."""
        attempts = self.max_retries + 1
        last_error = ""
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, self.backoff_base_s, self.backoff_max_s, self._rng))
            index = 0
            try:
                self._http()  # binds the semaphore to this loop before it is awaited
                async with self._in_flight:  # held for the HTTP exchange only, not while backing off
                    index = self._pick()  # picked once a slot is free: the in-flight counts are current
                    status, content = await self._post_once(index, body)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # refused, reset, dropped, timed out
                last_error = transport_error(exc, self.timeout_s)
                self._failed(index)
            else:
                if status >= 500:
                    last_error = f"HTTP {status}: {server_message(content)}"
                    self._failed(index)
                elif status >= 300:
                    raise RequestFailed(server_message(content), attempts=attempt + 1, status=status)
                else:
                    try:
                        return parse(content)
                    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
                        last_error = f"malformed response: {exc}"
            logger.warning("%s attempt %d/%d at %s failed: %s", self.name, attempt + 1, attempts, self.urls[index],
                           last_error)
        raise RequestFailed(last_error, attempts=attempts)

    async def aclose(self) -> None:
        """Close the HTTP session if it was made here (a session passed in belongs to the caller)."""
        if self._owns_session and self.session is not None:
            await self.session.close()
            self.session = None
