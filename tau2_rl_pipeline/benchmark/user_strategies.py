"""User-simulator strategies of the original tau-bench, layered on tau2's own `UserSimulator` (TAU2_USER_STRATEGY).

- `llm`: tau2's UserSimulator as it is (one call per user message).
- `react`: the user is asked to write `Thought:` then `User Response:`; only the response reaches the conversation.
- `verify`: after each message, a second call asks whether it fits the scenario and the conversation; a message
  that does not is regenerated, up to TAU2_USER_STRATEGY_MAX_CHECKS checks (then the last one is kept).
- `reflection`: as verify, but a failed check is followed by a reflection call that says what was wrong and
  writes a new message (`Response:`), which is checked in turn.

Training against varied users is a robustness lever: the same task is played by users that behave differently.
The strategy is written once (`StrategyUser._refine`, a generator that yields the messages of each extra call and
is sent its answer) and driven by either user client: `StrategyUser` makes the calls over litellm with tau2's
`generate`, `AsyncStrategyUser` awaits them through the async client (user_client.py), the same requests byte for
byte. Both use the user simulator's own model and arguments (timeouts, retries; a call that still fails raises, and
the episode ends aborted). Tool calls of a telecom user are never rewritten or checked: they run on the device as
the model asked. `calls` counts the LLM calls of this user.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from tau2.data_model.message import Message, SystemMessage, UserMessage
from tau2.user.user_simulator import UserSimulator
from tau2.utils.llm_utils import generate

from tau2_rl_pipeline.benchmark.tau2_version import UserState
from tau2_rl_pipeline.benchmark.user_client import AsyncUserSimulator

if TYPE_CHECKING:
    from tau2.user.base import ValidUserInputMessage

STRATEGIES = ("llm", "react", "verify", "reflection")

REACT_INSTRUCTION = """

Before each message, think about what to say next. Write your answer in exactly this format:
Thought:
<your reasoning, never shown to the agent>
User Response:
<the message the agent will see>"""

CHECK_PROMPT = """You check the messages of a simulated customer. The customer must follow the scenario below: say
only what it knows, pursue its goal, never invent facts, never act as the agent.

<scenario>
{scenario}
</scenario>

The conversation so far, from the customer's side, and the customer's next message follow. Does the next message
fit the scenario and the conversation? Answer with one line: `Classification: true` or `Classification: false`."""

REFLECT_PROMPT = """You are helping a simulated customer who wrote a message that does not fit its scenario.

<scenario>
{scenario}
</scenario>

Say in one or two sentences what is wrong with the message, then write a better message in exactly this format:
Reflection:
<what was wrong>
Response:
<the new message>"""

_CLASSIFICATION = re.compile(r"classification\s*:\s*(true|false)", re.IGNORECASE)


def strip_thought(text: str) -> str:
    """The message after the last `User Response:` marker (the whole text when the model left it out)."""
    return text.rsplit("User Response:", 1)[-1].strip()


def parse_check(text: str) -> bool:
    """A check's verdict: the last `Classification: true|false` in it; no verdict counts as a failed check."""
    found = _CLASSIFICATION.findall(text or "")
    return bool(found) and found[-1].lower() == "true"


def parse_reflection(text: str) -> str:
    """The new message of a reflection: what follows the last `Response:` marker."""
    return re.split(r"(?<![A-Za-z])Response:", text)[-1].strip()


def transcript(state: UserState, candidate: str) -> str:
    """The conversation as the customer saw it (agent and customer lines), then the candidate message."""
    lines = []
    for m in state.messages:
        if m.role in ("assistant", "user") and m.content:
            lines.append(f"{'agent' if m.role == 'assistant' else 'customer'}: {m.content}")
    return "\n".join(lines) + f"\n\nNext customer message:\n{candidate}"


# A strategy's extra calls for one user message: it yields each call's messages and is sent the answer.
Steps = Generator[list[Message], Message, None]


def run_blocking(steps: Steps, call: Callable[[list[Message]], Message]) -> None:
    """Drive a strategy's steps with a blocking model call."""
    answer = None
    try:
        while True:
            answer = call(steps.send(answer))
    except StopIteration:
        pass


async def run_awaiting(steps: Steps, call: Callable[[list[Message]], Awaitable[Message]]) -> None:
    """Drive a strategy's steps with an awaited model call."""
    answer = None
    try:
        while True:
            answer = await call(steps.send(answer))
    except StopIteration:
        pass


class StrategyUser(UserSimulator):
    """tau2's UserSimulator with one of the original tau-bench strategies on top; its calls go over litellm."""

    def __init__(self, *args: Any, strategy: str = "llm", max_checks: int = 2, **kwargs: Any) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown user strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
        super().__init__(*args, **kwargs)
        self.strategy = strategy
        self.max_checks = max_checks
        self.calls = 0

    @property
    def system_prompt(self) -> str:
        prompt = super().system_prompt
        return prompt + REACT_INSTRUCTION if self.strategy == "react" else prompt

    def _call(self, messages: list[Message]) -> Message:
        self.calls += 1
        return generate(model=self.llm, messages=messages, **self.llm_args)

    def generate_next_message(self, message: ValidUserInputMessage,
                              state: UserState) -> tuple[UserMessage, UserState]:
        # the public method: in every tau2 version it returns (message, state) with the message appended to the
        # state (26.3's _generate_next_message does both, 1.0.1's returns the message alone)
        self.calls += 1  # tau2's own generate call, made by the parent class
        reply, state = super().generate_next_message(message, state)
        run_blocking(self._refine(state, reply), self._call)
        return reply, state

    def _refine(self, state: UserState, reply: UserMessage) -> Steps:
        """The strategy on the message tau2's simulator just wrote (the last one in `state`): rewrites its content
        in place, making its extra calls by yielding them."""
        if reply.is_tool_call() or reply.content is None:
            return
        if self.strategy == "react":
            reply.content = strip_thought(reply.content)
        elif self.strategy in ("verify", "reflection"):
            reply.content = yield from self._checked(state, reply.content)

    def _checked(self, state: UserState, candidate: str) -> Generator[list[Message], Message, str]:
        """The candidate, or its replacement after failed checks; the last one when no check passes."""
        history = state.messages[:-1]  # the candidate was just appended by the parent class
        view = UserState(system_messages=state.system_messages, messages=history)
        for attempt in range(self.max_checks):
            verdict = yield [SystemMessage(role="system", content=CHECK_PROMPT.format(scenario=self.instructions)),
                             UserMessage(role="user", content=transcript(view, candidate))]
            if parse_check(verdict.content):
                return candidate
            if attempt + 1 == self.max_checks:
                break
            candidate = yield from self._replacement(view, candidate)
        return candidate

    def _replacement(self, view: UserState, rejected: str) -> Generator[list[Message], Message, str]:
        if self.strategy == "reflection":
            answer = yield [SystemMessage(role="system", content=REFLECT_PROMPT.format(scenario=self.instructions)),
                            UserMessage(role="user", content=transcript(view, rejected))]
            return parse_reflection(answer.content or "") or rejected
        # verify: sample the message again from the same view (the user simulator's temperature varies it)
        answer = yield view.system_messages + view.flip_roles()
        return answer.content or rejected


class AsyncStrategyUser(StrategyUser, AsyncUserSimulator):
    """The same strategy over the async user client (`AsyncUserSimulator(client, ...)`): every call, tau2's and
    the strategy's, awaited on the event loop. A blocking caller still gets StrategyUser's litellm path."""

    async def _acall(self, messages: list[Message]) -> Message:
        self.calls += 1
        return await self.acall(messages, None)  # the strategy's calls carry no tools, as over litellm

    async def agenerate_next_message(self, message: ValidUserInputMessage,
                                     state: UserState) -> tuple[UserMessage, UserState]:
        self.calls += 1  # the simulator's own call, made by AsyncUserSimulator
        reply, state = await super().agenerate_next_message(message, state)
        await run_awaiting(self._refine(state, reply), self._acall)
        return reply, state
