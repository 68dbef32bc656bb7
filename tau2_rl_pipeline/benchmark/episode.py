"""One tau2 episode as an object, graded by tau2's own evaluator.

One tau2 episode as an object: the domain environment for a task, the user side, termination as tau2's
orchestrator tracks it, and tau2's own evaluator at the end.

The rollout drives it turn by turn (`start`, then `act` per policy turn, then `evaluate`); the oracle replay and
tests drive tool calls directly (`agent_tool_call`, `user_tool_call`). Everything here is blocking Python (tau2's
tools, DB hashing, evaluation): async callers run it off the event loop.

Safety boundary: the agent may call only the domain's declared agent tools. Any other name (a Python attribute
such as `__class__`, a private method, a user-only tool) and arguments that do not fit the tool's schema become
an error observation and are never executed.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Collection, Sequence
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from tau2.data_model.message import AssistantMessage, Message, MultiToolMessage, ToolCall, ToolMessage, UserMessage
from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE
from tau2.registry import registry
from tau2.user.user_simulator import UserSimulator
from tau2.utils.utils import get_now

from tau2_rl_pipeline.benchmark import judge
from tau2_rl_pipeline.benchmark.actions import ParsedAction, parse_completion, split_reasoning
from tau2_rl_pipeline.benchmark.fast_env import fast_domain, fast_environment, has_fast_path
from tau2_rl_pipeline.benchmark.prompting import agent_system_prompt, to_agent_chat, tool_schemas
from tau2_rl_pipeline.benchmark.tau2_version import DEFAULT_RETRIEVAL_VARIANT, BaseUser, env_kwargs, needs_judge

log = logging.getLogger(__name__)

AGENT_STOP_TOKEN = "###STOP###"
INVALID_TOOL_CALL = "invalid_tool_call"  # the name a malformed completion is recorded under (never a real tool)


class UserSideError(RuntimeError):
    """The user simulator failed (its LLM server, its API key): an infrastructure failure, not the policy's."""


def build_environment(domain: str, fast: bool = False, *, task: Task | None = None,
                      retrieval_variant: str = DEFAULT_RETRIEVAL_VARIANT) -> Environment:
    """tau2's environment for `domain`; `fast`: one sharing the domain's once-parsed database (see fast_env), where
    fast_env has a path for the domain. banking_knowledge (tau2 1.0.1) is built for `task` with its retrieval
    variant, as tau2's runner builds it (tau2_version.env_kwargs)."""
    if fast and has_fast_path(domain):
        return fast_environment(domain)
    return registry.get_env_constructor(domain)(**env_kwargs(domain, task, retrieval_variant))


@dataclass
class ActResult:
    """What the agent sees after one turn: new agent-visible messages, and whether the episode ended."""

    observations: list[Message]
    done: bool


class Episode:
    """A tau2 conversation between a policy (driven from outside) and a user side (tau2's `BaseUser` interface).

    Step and error accounting follow tau2's orchestrator: each message and each batch of tool results is one step;
    `max_steps` and `max_errors` are checked whenever the next message is not addressed to the environment.
    A completion that cannot be parsed counts as one failed tool call (an error) and its error message is the
    observation, so the policy sees what went wrong and the max-errors rule still bounds the episode.
    """

    def __init__(
        self,
        domain: str,
        task: Task,
        user: BaseUser | None,
        *,
        max_steps: int = 200,
        max_errors: int = 10,
        environment: Environment | None = None,
        fast: bool = False,
        retrieval_variant: str = DEFAULT_RETRIEVAL_VARIANT,
    ):
        self.domain = domain
        # cheap environments for this episode and its evaluation (fast_env; same rewards), where it has a path
        self.fast = fast and has_fast_path(domain)
        # what tau2 builds this task's environments with (banking_knowledge's retrieval variant), for its evaluator too
        self.env_kwargs = env_kwargs(domain, task, retrieval_variant)
        self.task = task
        self.user = user
        self.max_steps = max_steps
        self.max_errors = max_errors
        self.env = environment if environment is not None else build_environment(
            domain, self.fast, task=task, retrieval_variant=retrieval_variant)
        # tau2 rebuilds every tool's pydantic model on each get_tools() call (~50 ms in telecom): once per episode
        self._agent_tools = self.env.tools.get_tools() if self.env.tools else {}
        self._user_tools = self.env.user_tools.get_tools() if self.env.user_tools else {}
        self.agent_tool_names = frozenset(self._agent_tools)
        self.user_tool_names = frozenset(self._user_tools)
        self.policy = self.env.get_policy()
        self.system_prompt = agent_system_prompt(self.policy)
        self.tools = tool_schemas(self._agent_tools.values())
        self.messages: list[Message] = []
        self.step_count = 0
        self.num_errors = 0
        self.parse_errors = 0
        self.refused_calls = 0
        self.unknown_tool_calls = 0  # agent calls to names it does not have (user tools included)
        self.user_tool_calls_by_agent = 0
        self.done = False
        self.termination_reason: TerminationReason | None = None
        self._user_state: Any = None
        self.user_wait_s = 0.0  # seconds awaiting an asynchronous user's model calls
        self._start_time = get_now()
        self._t0 = time.perf_counter()
        self._call_seq = 0
        self._refused_ids: set[str] = set()  # calls never executed: kept from the evaluator's replay
        init = task.initial_state
        self._history = deepcopy(init.message_history) if init and init.message_history else []
        self.env.set_state(
            initialization_data=init.initialization_data if init else None,
            initialization_actions=init.initialization_actions if init else None,
            message_history=self._history,
        )

    # -- conversation start ---------------------------------------------------------------------
    def start(self) -> list[Message]:
        """Open the conversation as tau2's orchestrator does; returns the agent-visible messages so far."""
        to_user = self._open()
        if to_user is not None:
            self._run_user(to_user)
        return self.agent_view()

    async def astart(self) -> list[Message]:
        """`start` with an asynchronous user (`agenerate_next_message`), its model call awaited."""
        to_user = self._open()
        if to_user is not None:
            await self._arun_user(to_user)
        return self.agent_view()

    def _open(self) -> Message | None:
        """The conversation's start up to the user's first turn; the message the user answers first, if any."""
        if self._history:
            self._append(*self._history)
            last = self._history[-1]
            to_user = isinstance(last, AssistantMessage) and not last.is_tool_call()
            if self.user is None:
                return None
            seen = self._history[:-1] if to_user else self._history
            self._user_state = self.user.get_init_state(message_history=[m for m in seen if _user_visible(m)])
            return last if to_user else None
        greeting = deepcopy(DEFAULT_FIRST_AGENT_MESSAGE)
        self._append(greeting)
        self._user_state = self.user.get_init_state() if self.user else None
        return greeting if self.user is not None else None

    def agent_view(self) -> list[dict]:
        """The conversation as the policy sees it, as chat messages (see prompting.to_agent_chat)."""
        return to_agent_chat(self.messages)

    # -- policy turns -----------------------------------------------------------------------------
    def parse(self, completion: str) -> ParsedAction:
        return parse_completion(completion, allowed_tools=self.agent_tool_names)

    def act(self, completion: str) -> ActResult:
        """Apply one policy completion (its decoded text): tool calls, a reply to the user, or an error."""
        outcome = self._apply(completion)
        if isinstance(outcome, ActResult):
            return outcome
        before = len(self.messages)
        self._run_user(outcome)
        return self._user_answer(before)

    async def aact(self, completion: str) -> ActResult:
        """`act` with an asynchronous user: its model call awaited, the rest (tools, parsing) run here."""
        outcome = self._apply(completion)
        if isinstance(outcome, ActResult):
            return outcome
        before = len(self.messages)
        await self._arun_user(outcome)
        return self._user_answer(before)

    def _apply(self, completion: str) -> ActResult | AssistantMessage:
        """The policy's side of a turn: its result, or the text message the user must answer next.

        Reasoning (`<think>...</think>`, see actions.split_reasoning) stays in the sampled tokens only: the
        recorded message, which the user simulator and tau2's evaluator read, holds the visible reply, and a tool
        call written inside the reasoning is never parsed, let alone run."""
        if self.done:
            raise RuntimeError("episode is over")
        completion = split_reasoning(completion)[1]
        action = self.parse(completion)
        self._count_foreign_calls(completion)
        if action.error is not None:
            return self._act_parse_error(completion, action)
        if action.is_tool_call:
            calls = [self._new_call(c.name, c.arguments, "assistant") for c in action.tool_calls]
            msg = AssistantMessage(role="assistant", content=action.content or None, tool_calls=calls)
            self._append(msg)
            self.step_count += 1
            results = [self._execute(call) for call in calls]
            self._append(*results)
            self.step_count += 1
            self._check_limits()
            return ActResult(list(results), self.done)
        msg = AssistantMessage(role="assistant", content=action.content)
        self._append(msg)
        self.step_count += 1
        if AGENT_STOP_TOKEN in action.content:
            self._finish(TerminationReason.AGENT_STOP)
            return ActResult([], True)
        if self._check_limits():
            return ActResult([], True)
        return msg

    def _user_answer(self, before: int) -> ActResult:
        new = [m for m in self.messages[before:] if isinstance(m, UserMessage) and not m.is_tool_call()]
        return ActResult(new, self.done)

    def _count_foreign_calls(self, completion: str) -> None:
        for call in parse_completion(completion).tool_calls:
            if call.name not in self.agent_tool_names:
                self.unknown_tool_calls += 1
                self.user_tool_calls_by_agent += call.name in self.user_tool_names

    def _act_parse_error(self, completion: str, action: ParsedAction) -> ActResult:
        self.parse_errors += 1
        call = self._new_call(INVALID_TOOL_CALL, {}, "assistant")
        self._refused_ids.add(call.id)
        msg = AssistantMessage(role="assistant", content=None, tool_calls=[call],
                               raw_data={"unparsed_text": completion, "parse_error": action.error.kind.value})
        result = ToolMessage(id=call.id, role="tool", requestor="assistant", error=True,
                             content=action.error.message)
        self._append(msg, result)
        self.step_count += 2
        self.num_errors += 1
        self._check_limits()
        return ActResult([result], self.done)

    # -- tool calls ---------------------------------------------------------------------------------
    def agent_tool_call(self, name: str, arguments: dict) -> ToolMessage:
        """Run one agent tool call as its own turn (oracle replay, tests); returns the tool result."""
        return self._single_call(name, arguments, "assistant")

    def user_tool_call(self, name: str, arguments: dict) -> ToolMessage:
        """Run one user-side tool call (telecom device tools) as its own user turn."""
        return self._single_call(name, arguments, "user")

    def _single_call(self, name: str, arguments: dict, requestor: str) -> ToolMessage:
        call = self._new_call(name, arguments, requestor)
        message_type = AssistantMessage if requestor == "assistant" else UserMessage
        self._append(message_type(role=requestor, content=None, tool_calls=[call]))
        result = self._execute(call)
        self._append(result)
        self.step_count += 2
        return result

    def agent_says(self, text: str) -> None:
        """Record an agent text message without running the user (oracle replay's final message)."""
        self._append(AssistantMessage(role="assistant", content=text))
        self.step_count += 1

    def _new_call(self, name: str, arguments: dict, requestor: str) -> ToolCall:
        self._call_seq += 1
        return ToolCall(id=f"call_{self._call_seq}", name=name, arguments=arguments, requestor=requestor)

    def _execute(self, call: ToolCall) -> ToolMessage:
        refusal = _refusal(call, self._agent_tools if call.requestor == "assistant" else self._user_tools)
        if refusal is not None:
            self.refused_calls += 1
            self._refused_ids.add(call.id)
            result = ToolMessage(id=call.id, role="tool", requestor=call.requestor, error=True, content=refusal)
        else:
            result = self.env.get_response(call)
        if result.error:
            self.num_errors += 1
        return result

    # -- the user side ----------------------------------------------------------------------------
    def _run_user(self, message: Message) -> None:
        """Let a blocking user respond to `message` until it speaks to the agent or stops."""
        turns = self._user_turns(message)
        request = next(turns)
        with contextlib.suppress(StopIteration):
            while True:
                try:
                    reply = self.user.generate_next_message(request, self._user_state)
                except Exception as e:  # the user LLM's failure is infrastructure: surface it, never score it
                    raise UserSideError(f"user simulator failed: {type(e).__name__}: {e}") from e
                request = turns.send(reply)

    async def _arun_user(self, message: Message) -> None:
        """`_run_user` for an asynchronous user: its model calls awaited on the event loop."""
        turns = self._user_turns(message)
        request = next(turns)
        with contextlib.suppress(StopIteration):
            while True:
                t0 = time.perf_counter()
                try:
                    reply = await self.user.agenerate_next_message(request, self._user_state)
                except Exception as e:  # the user LLM's failure is infrastructure: surface it, never score it
                    raise UserSideError(f"user simulator failed: {type(e).__name__}: {e}") from e
                finally:
                    self.user_wait_s += time.perf_counter() - t0
                request = turns.send(reply)

    def _user_turns(self, message: Message):
        """The user's side of an exchange, as a generator: it yields each message the user must answer, receives
        (user message, user state) from the driver (`_run_user`, `_arun_user`), records the reply and runs the
        user's own tool calls, until the user speaks to the agent or stops."""
        while True:
            user_msg, self._user_state = yield message
            self._append(user_msg)
            self.step_count += 1
            if UserSimulator.is_stop(user_msg):
                self._finish(TerminationReason.USER_STOP)
                return
            if not user_msg.is_tool_call():
                self._check_limits()
                return
            results = [self._execute(call) for call in user_msg.tool_calls]
            self._append(*results)
            self.step_count += 1
            if self._check_limits():
                return
            message = results[0] if len(results) == 1 else MultiToolMessage(role="tool", tool_messages=results)

    # -- termination and evaluation ------------------------------------------------------------------
    def _check_limits(self) -> bool:
        if self.done:
            return True
        if self.step_count >= self.max_steps:
            self._finish(TerminationReason.MAX_STEPS)
        elif self.num_errors >= self.max_errors:
            self._finish(TerminationReason.TOO_MANY_ERRORS)
        return self.done

    def _finish(self, reason: TerminationReason) -> None:
        self.done = True
        self.termination_reason = reason

    def stop(self, reason: TerminationReason) -> None:
        """End the episode from outside (the oracle replay's user stop, a test)."""
        self._finish(reason)

    def _append(self, *messages: Message) -> None:
        for msg in messages:
            msg.timestamp = get_now()
            msg.turn_idx = len(self.messages)
            self.messages.append(msg)

    def simulation_run(self, termination_reason: TerminationReason | None = None) -> SimulationRun:
        reason = termination_reason or self.termination_reason or TerminationReason.MAX_STEPS
        return SimulationRun(
            id=str(uuid.uuid4()),
            task_id=self.task.id,
            start_time=self._start_time,
            end_time=get_now(),
            duration=time.perf_counter() - self._t0,
            termination_reason=reason,
            messages=self.evaluated_messages(),
        )

    @property
    def refused_call_ids(self) -> frozenset[str]:
        """Ids of the calls this episode refused (never executed): see `without_refused_calls`."""
        return frozenset(self._refused_ids)

    def evaluated_messages(self) -> list[Message]:
        return without_refused_calls(self.messages, self._refused_ids)

    def evaluate(self, termination_reason: TerminationReason | None = None, *, native: bool = False) -> RewardInfo:
        """tau2's own evaluation (EvaluationType.ALL); episodes not ended by agent or user stop score 0, as in tau2.

        A fast episode's evaluation runs on fast_env's environments unless `native` asks for tau2's own.
        Raises judge.JudgeError when tau2 1.0.1's NL-assertion judge fails for good.
        """
        domain = fast_domain(self.domain) if self.fast and not native else self.domain
        if needs_judge(self.task):
            judge.active()  # tau2's NL assertions go to our judge client, never to tau2's unguarded call
        by_task = {"env_kwargs": self.env_kwargs} if self.env_kwargs else {}  # (26.3's evaluator has no such argument)
        try:
            return evaluate_simulation(self.simulation_run(termination_reason), self.task, EvaluationType.ALL,
                                       solo_mode=False, domain=domain, **by_task)
        except judge.JudgeError:
            raise  # infrastructure: the caller aborts the episode, it is never scored
        except Exception as e:  # noqa: BLE001 - tau2's own checks raise on states they did not foresee
            # e.g. mock's env assertion raises "Task task_2 not found" when the agent never created task_2: the
            # episode's outcome, not infrastructure. Scored 0 with the reason kept in the episode's reward info
            # (episodes files, docs/limitations.md), and logged at INFO: as a warning it repeated on every run of the
            # demo for an outcome that is the model's, not a fault to act on.
            log.info("tau2's evaluator raised on task %s: %s: %s", self.task.id, type(e).__name__, e)
            return RewardInfo(reward=0.0, info={"evaluation_error": f"{type(e).__name__}: {e}"})


def without_refused_calls(messages: Sequence[Message], refused_ids: Collection[str]) -> list[Message]:
    """The trajectory without refused calls and their error results: the evaluator's view of it.

    tau2's evaluator replays every tool call of the trajectory on a fresh environment and requires each
    result to equal the recorded one; a refused call never ran, so it has nothing to replay (and it cannot
    have changed the state it would be compared on).
    """
    if not refused_ids:
        return list(messages)
    kept: list[Message] = []
    for msg in messages:
        if isinstance(msg, ToolMessage) and msg.id in refused_ids:
            continue
        if isinstance(msg, (AssistantMessage, UserMessage)) and msg.tool_calls:
            calls = [c for c in msg.tool_calls if c.id not in refused_ids]
            if len(calls) != len(msg.tool_calls):
                if not calls and not msg.content:
                    continue
                msg = msg.model_copy(update={"tool_calls": calls or None})
        kept.append(msg)
    return kept


def _user_visible(msg: Message) -> bool:
    if isinstance(msg, AssistantMessage):
        return not msg.is_tool_call()
    if isinstance(msg, ToolMessage):
        return msg.requestor == "user"
    return isinstance(msg, UserMessage)


def _refusal(call: ToolCall, tools: dict[str, Any]) -> str | None:
    """Why a call must not run, or None: unknown names and arguments that don't fit the tool's schema."""
    if call.name not in tools:
        who = "agent" if call.requestor == "assistant" else "user"
        return f"Error: unknown tool {call.name!r} for the {who}. Available tools: {', '.join(sorted(tools))}"
    tool = tools[call.name]
    if not isinstance(call.arguments, dict):
        return f"Error: arguments of {call.name} must be a JSON object"
    unknown = set(call.arguments) - set(tool.params.model_fields)
    if unknown:
        return f"Error: {call.name} got unexpected arguments: {', '.join(sorted(unknown))}"
    try:
        tool.params.model_validate(call.arguments)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
        return f"Error: invalid arguments for {call.name}: {problems}"
    return None
