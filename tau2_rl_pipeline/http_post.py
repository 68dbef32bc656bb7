"""One discipline for the project's clients of model servers: SGLang's native `/generate` (the policy engine) and an
OpenAI-compatible `/v1/chat/completions` (the user simulator's fast client).

aiohttp (httpx's pool is quadratic in its size with hundreds in flight: bench/README.md, P2); at most
`max_in_flight` requests open at once; a total timeout per attempt; transient failures (connection refused or
reset, timeouts, 5xx, bodies that do not parse) retried with exponential backoff and jitter; a refused request
(4xx) not retried, since sending it again cannot help. What failed is raised as `RequestFailed`; each client words
its own error from it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
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
    """POSTs JSON bodies to one URL under the discipline above. `name` labels the retry warnings in the log.

    The HTTP session and the in-flight bound belong to an event loop: a session passed in is the caller's (used
    as is, never closed here); one made here is made on first use on each event loop that posts (a benchmark's
    warm-up and its timed run are two loops), and `aclose()` closes the current one.
    """

    def __init__(self, url: str, *, name: str, timeout_s: float = 120.0, max_retries: int = 4,
                 backoff_base_s: float = 0.5, backoff_max_s: float = 8.0, max_in_flight: int = 256,
                 session: aiohttp.ClientSession | None = None, headers: dict[str, str] | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
        if timeout_s <= 0 or max_retries < 0 or max_in_flight < 1 or backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError("need timeout_s > 0, max_retries >= 0, max_in_flight >= 1 and backoffs >= 0")
        self.url = url
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

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first use on this loop: a semaphore (and a session made here) per loop
            self._loop, self._in_flight = loop, asyncio.Semaphore(self.max_in_flight)
            if self._owns_session:
                self.session = None
        if self.session is None:
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.max_in_flight))
        return self.session

    async def _post_once(self, body: bytes) -> tuple[int, bytes]:
        async with self._http().post(self.url, data=body, headers=self.headers,
                                     timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as response:
            return response.status, await response.read()

    async def post(self, body: bytes, parse: Callable[[bytes], T]) -> T:
        """`parse(response body)` of the first answer that parses; `parse` raises ValueError on a malformed one."""
        attempts = self.max_retries + 1
        last_error = ""
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(backoff_delay(attempt - 1, self.backoff_base_s, self.backoff_max_s, self._rng))
            try:
                self._http()  # binds the semaphore to this loop before it is awaited
                async with self._in_flight:  # held for the HTTP exchange only, not while backing off
                    status, content = await self._post_once(body)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # refused, reset, dropped, timed out
                last_error = transport_error(exc, self.timeout_s)
            else:
                if status >= 500:
                    last_error = f"HTTP {status}: {server_message(content)}"
                elif status >= 300:
                    raise RequestFailed(server_message(content), attempts=attempt + 1, status=status)
                else:
                    try:
                        return parse(content)
                    except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors too
                        last_error = f"malformed response: {exc}"
            logger.warning("%s attempt %d/%d at %s failed: %s", self.name, attempt + 1, attempts, self.url,
                           last_error)
        raise RequestFailed(last_error, attempts=attempts)

    async def aclose(self) -> None:
        """Close the HTTP session if it was made here (a session passed in belongs to the caller)."""
        if self._owns_session and self.session is not None:
            await self.session.close()
            self.session = None
