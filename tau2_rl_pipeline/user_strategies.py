"""User-simulator strategies of the original tau-bench, layered on tau2's own `UserSimulator` (TAU2_USER_STRATEGY).

- `llm`: tau2's UserSimulator as it is (one call per user message).
- `react`: the user is asked to write `Thought:` then `User Response:`; only the response reaches the conversation.
- `verify`: after each message, a second call asks whether it fits the scenario and the conversation; a message
  that does not is regenerated, up to TAU2_USER_STRATEGY_MAX_CHECKS checks (then the last one is kept).
- `reflection`: as verify, but a failed check is followed by a reflection call that says what was wrong and
  writes a new message (`Response:`), which is checked in turn.

Training against varied users is a robustness lever: the same task is played by users that behave differently.
Every call goes through tau2's `generate` with the user simulator's own model and litellm arguments (timeouts,
retries; a call that still fails raises, and the episode ends aborted). Tool calls of a telecom user are never
rewritten or checked: they run on the device as the model asked. `calls` counts the LLM calls of this user.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from tau2.data_model.message import SystemMessage, UserMessage
from tau2.user.user_simulator import UserSimulator
from tau2.utils.llm_utils import generate

from tau2_rl_pipeline.tau2_version import UserState

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


class StrategyUser(UserSimulator):
    """tau2's UserSimulator with one of the original tau-bench strategies on top."""

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

    def _call(self, messages: list, tools: Any = None):
        self.calls += 1
        return generate(model=self.llm, messages=messages, tools=tools, **self.llm_args)

    def _generate_next_message(self, message: ValidUserInputMessage,
                               state: UserState) -> tuple[UserMessage, UserState]:
        self.calls += 1  # tau2's own generate call, made by the parent class
        reply, state = super()._generate_next_message(message, state)
        if reply.is_tool_call() or reply.content is None:
            return reply, state
        if self.strategy == "react":
            reply.content = strip_thought(reply.content)
        elif self.strategy in ("verify", "reflection"):
            reply.content = self._checked(state, reply.content)
        return reply, state

    def _checked(self, state: UserState, candidate: str) -> str:
        """The candidate, or its replacement after failed checks; the last one when no check passes."""
        history = state.messages[:-1]  # the candidate was just appended by the parent class
        view = UserState(system_messages=state.system_messages, messages=history)
        for attempt in range(self.max_checks):
            if self._passes(view, candidate):
                return candidate
            if attempt + 1 == self.max_checks:
                break
            candidate = self._replacement(view, candidate)
        return candidate

    def _passes(self, view: UserState, candidate: str) -> bool:
        prompt = CHECK_PROMPT.format(scenario=self.instructions)
        verdict = self._call([SystemMessage(role="system", content=prompt),
                              UserMessage(role="user", content=transcript(view, candidate))])
        return parse_check(verdict.content)

    def _replacement(self, view: UserState, rejected: str) -> str:
        if self.strategy == "reflection":
            prompt = REFLECT_PROMPT.format(scenario=self.instructions)
            answer = self._call([SystemMessage(role="system", content=prompt),
                                 UserMessage(role="user", content=transcript(view, rejected))])
            return parse_reflection(answer.content or "") or rejected
        # verify: sample the message again from the same view (the user simulator's temperature varies it)
        answer = self._call(view.system_messages + view.flip_roles())
        return answer.content or rejected
