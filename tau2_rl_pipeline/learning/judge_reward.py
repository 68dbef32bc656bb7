"""An LLM judge's rubric score of a whole conversation: an optional partial-score component (TAU2_USE_JUDGE).

    async with JudgeClient(cfg) as judge:
        traj = await judge_trajectory(traj, str(task.user_scenario), judge)  # judge_score in [0, 1], judge_calls

The judge is any OpenAI-compatible `/chat/completions` endpoint (TAU2_JUDGE_API_BASE, e.g. an SGLang server)
reached over aiohttp, asked for TAU2_JUDGE_MODEL (a litellm name: `openai/<served name>` is sent as the served
name). It sees the user's scenario and the conversation (both sides, tool calls and results) and
answers `SCORE: <0-10>`. Client discipline is the user simulator's: each call has a timeout (TAU2_JUDGE_TIMEOUT_S),
a failed call (connection error, timeout, 5xx / 429, a body that is not JSON, a reply without a score) is retried
(TAU2_JUDGE_MAX_RETRIES) after a wait of TAU2_JUDGE_BACKOFF_S, doubled each retry,
and a judge that still fails ends the episode `aborted`: an infrastructure failure, never scored as the model's.
Calls are counted per episode. The score enters reward.partial_score as the `judge` component.

The judge settings are the ones of tau2 1.0.1's NL-assertion judge (judge.py); the two clients share them, not
their code (that one speaks litellm for tau2's evaluator, this one aiohttp on the event loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
from typing import Any

from tau2_rl_pipeline.benchmark.judge import MAX_BACKOFF_S
from tau2_rl_pipeline.benchmark.user_client import served_model_name
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.rollout.episode_loop import ABORTED, Trajectory

TOOL_RESULT_CHARS = 2000  # a tool result longer than this is cut in what the judge reads

RUBRIC = """You grade a customer-service conversation between an agent and a customer. The customer followed the
scenario below. Judge the agent only: did it understand the request, follow its policy, use tools correctly, keep
the customer informed, and resolve the request (or explain truthfully why it cannot)? Do not reward length.

<scenario>
{scenario}
</scenario>

Answer with a short justification, then one last line `SCORE: <an integer from 0 to 10>`."""

_SCORE = re.compile(r"SCORE\s*:\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.IGNORECASE)


class JudgeError(RuntimeError):
    """The judge could not score the episode after its retries (or cannot be asked at all); `calls` made."""

    def __init__(self, message: str, calls: int = 0) -> None:
        super().__init__(message)
        self.calls = calls


def parse_score(text: str | None) -> float | None:
    """The last `SCORE: x` (0-10) of a reply, as x / 10; None when there is none or it is out of range."""
    found = _SCORE.findall(text or "")
    if not found:
        return None
    value = float(found[-1])
    return value / 10.0 if 0.0 <= value <= 10.0 else None


def render_conversation(messages: list[Any]) -> str:
    """tau2 messages as plain lines: who spoke, what they said, tool calls and (cut) tool results."""
    lines = []
    for m in messages:
        role = getattr(m, "role", "?")
        if role == "tool":
            content = str(m.content or "")
            if len(content) > TOOL_RESULT_CHARS:
                content = content[:TOOL_RESULT_CHARS] + " ...[cut]"
            lines.append(f"tool result: {content}")
            continue
        who = {"assistant": "agent", "user": "customer"}.get(role, role)
        if m.content:
            lines.append(f"{who}: {m.content}")
        for call in getattr(m, "tool_calls", None) or []:
            lines.append(f"{who} calls {call.name}({json.dumps(call.arguments, sort_keys=True)})")
    return "\n".join(lines)


def judge_request(cfg: Tau2Config, scenario: str, messages: list[Any]) -> dict:
    """The /chat/completions body: the rubric with the scenario, then the conversation."""
    return {"model": served_model_name(cfg.judge_model), "temperature": 0.0, "max_tokens": 512,
            "messages": [{"role": "system", "content": RUBRIC.format(scenario=scenario)},
                         {"role": "user", "content": render_conversation(messages)}]}


class JudgeClient:
    """One aiohttp session (opened lazily on the running loop) for a run's judge calls."""

    def __init__(self, cfg: Tau2Config) -> None:
        if not (cfg.judge_model and cfg.judge_api_base):
            raise JudgeError("the judge needs TAU2_JUDGE_MODEL and TAU2_JUDGE_API_BASE")
        self.cfg = cfg
        self.url = cfg.judge_api_base.rstrip("/") + "/chat/completions"
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> JudgeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, body: dict) -> tuple[int, str]:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            self._session, self._loop = aiohttp.ClientSession(), loop
        headers = {}
        if os.environ.get("OPENAI_API_KEY"):  # a remote judge; a local server takes none. Never logged.
            headers["Authorization"] = f"Bearer {os.environ['OPENAI_API_KEY']}"
        timeout = aiohttp.ClientTimeout(total=self.cfg.judge_timeout_s)
        async with self._session.post(self.url, json=body, headers=headers, timeout=timeout) as resp:
            return resp.status, await resp.text()

    async def score(self, scenario: str, messages: list[Any]) -> tuple[float, int]:
        """(score in [0, 1], calls made). Raises JudgeError after 1 + TAU2_JUDGE_MAX_RETRIES failed calls."""
        import aiohttp

        body = judge_request(self.cfg, scenario, messages)
        problem = ""
        for attempt in range(self.cfg.judge_max_retries + 1):
            if attempt:
                await asyncio.sleep(min(self.cfg.judge_backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S))
            try:
                status, text = await self._post(body)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                problem = f"{type(e).__name__}: {e}".rstrip(": ")
                continue
            if status == 429 or status >= 500:
                problem = f"HTTP {status}"
                continue
            if status != 200:  # a bad request or a refused key does not get better by asking again
                raise JudgeError(f"judge at {self.url} answered HTTP {status}: {text[:200]}", attempt + 1)
            try:
                reply = json.loads(text)["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                problem = "a reply that is not an OpenAI chat completion"
                continue
            value = parse_score(reply)
            if value is None:
                problem = f"a reply without a SCORE line: {str(reply)[:80]!r}"
                continue
            return value, attempt + 1
        calls = self.cfg.judge_max_retries + 1
        raise JudgeError(f"judge at {self.url} failed {calls} time(s); last: {problem}", calls)


async def judge_trajectory(traj: Trajectory, scenario: str, client: JudgeClient) -> Trajectory:
    """The trajectory with its judge score and call count; aborted (and unscored) when the judge fails.
    An already aborted episode is not judged."""
    if traj.status == ABORTED:
        return traj
    try:
        value, calls = await client.score(scenario, traj.messages)
    except JudgeError as e:
        return dataclasses.replace(traj, status=ABORTED, error=str(e), judge_score=None, judge_calls=e.calls)
    return dataclasses.replace(traj, judge_score=value, judge_calls=calls)
