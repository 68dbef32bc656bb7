"""The user side of an episode, behind tau2's `BaseUser` interface.

- `llm`: tau2's own `UserSimulator` (the real one): gpt-4.1 by default, or an SGLang server's OpenAI-compatible
  endpoint at scale (`TAU2_USER_MODEL=openai/<served name>`, `TAU2_USER_API_BASE=http://host:port/v1`). In telecom
  it gets the user's device tools, and its tool calls run on them. `TAU2_USER_CLIENT` picks how it reaches its
  model: over litellm on worker threads (provider models), or, by default for a local server, tau2's same
  simulator whose call is one request awaited on the event loop (user_client.py: same requests, no thread).
  TAU2_USER_STRATEGY picks one of the original tau-bench's strategies on top of it (user_strategies.py), over
  whichever client was picked.
- `scripted`: an offline user built from the task's scenario, for runs with no LLM at all (the demo, CI). It states
  the request and what it knows, answers the probing oracle's questions for the facts its scenario states
  (scenario.py; word for word `probe_question`, nothing a policy would write by chance), performs the task's user-side gold actions when the agent replies (telecom device
  steps), then ends with ###STOP###. It is a plumbing and learning-signal check, not a tau2 user: scores with it are
  not tau2 scores.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tau2.data_model.message import Message, ToolCall, UserMessage
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment
from tau2.user.user_simulator import UserSimulator

from tau2_rl_pipeline.benchmark import USER_KINDS
from tau2_rl_pipeline.benchmark.scenario import probe_question, scenario_facts
from tau2_rl_pipeline.benchmark.tau2_version import STOP, BaseUser, UserState
from tau2_rl_pipeline.benchmark.user_client import OPENAI_PREFIX, AsyncUserSimulator, chat_client
from tau2_rl_pipeline.benchmark.user_strategies import AsyncStrategyUser, StrategyUser
from tau2_rl_pipeline.config import Tau2Config

UserFactory = Callable[[Task, Environment], BaseUser]


class UserConfigError(ValueError):
    """The user simulator cannot be reached as configured (e.g. no API key for a remote model)."""


def opening_request(task: Task) -> str:
    """What the scripted user says first: the reason for the call and what the user knows."""
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        return instructions.strip()
    parts = [instructions.reason_for_call, instructions.known_info]
    return "\n\n".join(p.strip() for p in parts if p and p.strip())


class ScriptedUser(BaseUser):
    """A deterministic user: the opening request; then, on the user's device, each user-side gold action the agent
    asks for by name (all words of the action's name after its verb, e.g. "data saver" for
    toggle_data_saver_mode), in gold order; then ###STOP### once nothing is left to do or patience runs out.
    """

    def __init__(self, task: Task, *, patience: int = 3, done_reply: str = "I did that. What next?",
                 unsure_reply: str = "I'm not sure what you want me to do on my phone."):
        super().__init__(instructions=str(task.user_scenario))
        self.opening = opening_request(task)
        self.patience = patience
        self.done_reply = done_reply
        self.unsure_reply = unsure_reply
        criteria = task.evaluation_criteria
        self.user_actions = [a for a in (criteria.actions or []) if a.requestor == "user"] if criteria else []
        self.answers = {probe_question(f): f"The {f.label} is {f.value}."
                        for f in scenario_facts(task, str(task.user_scenario))}
        self.history = 0

    def get_init_state(self, message_history: list[Message] | None = None) -> UserState:
        self.history = len(message_history or [])  # a task's earlier conversation: the user has not spoken yet here
        return UserState(system_messages=[], messages=list(message_history or []))

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:  # deterministic: nothing to seed
        pass

    def generate_next_message(self, message, state: UserState) -> tuple[UserMessage, UserState]:
        state.messages.append(message)
        mine = [m for m in state.messages[self.history:] if isinstance(m, UserMessage)]
        done = sum(len(m.tool_calls) for m in mine if m.is_tool_call())
        unsure = sum(1 for m in mine if m.content == self.unsure_reply)
        asked = _last_agent_text(state.messages)
        if not any(not m.is_tool_call() for m in mine):
            reply = UserMessage(role="user", content=self.opening)
        elif done < len(self.user_actions) and _mentions(self.user_actions[done].name, asked):
            action = self.user_actions[done]
            call = ToolCall(id=f"user_call_{done}", name=action.name, arguments=action.arguments, requestor="user")
            reply = UserMessage(role="user", content=None, tool_calls=[call])
        elif getattr(message, "role", None) == "tool":
            reply = UserMessage(role="user", content=self.done_reply)
        elif getattr(message, "content", None) in self.answers:
            reply = UserMessage(role="user", content=self.answers[message.content])
        elif done < len(self.user_actions) and unsure < self.patience:
            reply = UserMessage(role="user", content=self.unsure_reply)
        else:
            reply = UserMessage(role="user", content=STOP)
        state.messages.append(reply)
        return reply, state


def _last_agent_text(messages: list[Message]) -> str:
    for m in reversed(messages):
        if getattr(m, "role", None) == "assistant" and m.content:
            return m.content
    return ""


def _mentions(action_name: str, text: str) -> bool:
    words = action_name.split("_")[1:] or action_name.split("_")
    lowered = text.lower()
    return all(w in lowered for w in words)


def llm_user_args(cfg: Tau2Config) -> dict:
    """tau2's UserSimulator `llm_args` (litellm's arguments; the async client sends the same body); no secret is
    ever placed here (litellm reads keys from env)."""
    args: dict = {"temperature": cfg.user_temperature, "num_retries": cfg.user_max_retries,
                  "timeout": cfg.user_timeout_s}
    if cfg.user_api_base:
        args["api_base"] = cfg.user_api_base
        # A local SGLang server takes any key; litellm's openai/ route insists on one being present.
        if cfg.user_model.startswith("openai/") and not os.environ.get("OPENAI_API_KEY"):
            args["api_key"] = "EMPTY"
        # Qwen3 user simulators must answer, not think (the original cookbook's setting).
        args["extra_body"] = {"chat_template_kwargs": {"enable_thinking": False}}
    return args


def user_client_kind(cfg: Tau2Config) -> str:
    """"async" or "litellm": TAU2_USER_CLIENT, with auto = async for a local OpenAI-compatible server (an API base
    and an openai/ model), litellm otherwise; the same on tau2 26.3 and 1.0.1 (the async client follows the
    installed tau2's user turn)."""
    if cfg.user_client != "auto":
        return cfg.user_client
    return "async" if cfg.user_api_base and cfg.user_model.startswith(OPENAI_PREFIX) else "litellm"


def check_llm_user(cfg: Tau2Config) -> None:
    """Fail early, in one line, when a remote user model has no API key (checked by name, never printed), when
    the async client has no server to talk to, or when litellm's blocking calls would run on the event loop."""
    if user_client_kind(cfg) == "async":
        if not cfg.user_api_base:
            raise UserConfigError("TAU2_USER_CLIENT=async needs TAU2_USER_API_BASE (an OpenAI-compatible server, "
                                  "e.g. http://127.0.0.1:30001/v1 from scripts/start_user_sim.sh)")
        return
    if cfg.episode_workers == 0:
        raise UserConfigError("TAU2_EPISODE_WORKERS=0 runs episode work on the event loop, which litellm's "
                              "blocking calls would stall: set it to 1 or more (default 64), or use the async "
                              "client with a local server (TAU2_USER_CLIENT=async)")
    if cfg.user_api_base:
        if "," in cfg.user_api_base:
            raise UserConfigError("TAU2_USER_API_BASE lists several servers, which only the async client spreads "
                                  "requests over (TAU2_USER_CLIENT=async, an openai/ TAU2_USER_MODEL); for litellm "
                                  "put them behind one router (scripts/start_router.sh) and give its URL")
        return
    import litellm

    missing = litellm.validate_environment(model=cfg.user_model).get("missing_keys") or []
    if missing:
        raise UserConfigError(
            f"user model {cfg.user_model!r} needs {', '.join(missing)} in the environment; set it, or point "
            f"TAU2_USER_API_BASE at an OpenAI-compatible server (e.g. scripts/start_user_sim.sh), or use the "
            f"scripted user (--user scripted)")


class LLMUserFactory:
    """Builds tau2's LLM user per episode. With the async client, one HTTP client serves every user it builds
    (the in-flight bound is per process); `aclose()` closes its session on the loop that used it."""

    def __init__(self, cfg: Tau2Config):
        self.cfg = cfg
        self.args = llm_user_args(cfg)
        self.client = None
        if user_client_kind(cfg) == "async":
            self.client = chat_client(cfg.user_api_base, timeout_s=cfg.user_timeout_s,
                                      max_retries=cfg.user_max_retries, max_in_flight=cfg.user_max_in_flight)
        self.blocks = self.client is None  # litellm's calls block a thread (rollout.episode_threads)

    def __call__(self, task: Task, environment: Environment) -> BaseUser:
        tools = environment.get_user_tools() if environment.user_tools is not None else None
        kwargs = {"tools": tools, "instructions": str(task.user_scenario), "llm": self.cfg.user_model,
                  "llm_args": dict(self.args)}
        if self.client is not None:
            kwargs["client"] = self.client
        if self.cfg.user_strategy != "llm":  # the original tau-bench's strategies, on top of tau2's simulator
            kwargs.update(strategy=self.cfg.user_strategy, max_checks=self.cfg.user_strategy_max_checks)
            return (StrategyUser if self.client is None else AsyncStrategyUser)(**kwargs)
        return (UserSimulator if self.client is None else AsyncUserSimulator)(**kwargs)

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()


def make_user_factory(kind: str, cfg: Tau2Config) -> UserFactory:
    if kind == "scripted":
        return lambda task, environment: ScriptedUser(task)
    if kind == "llm":
        check_llm_user(cfg)
        return LLMUserFactory(cfg)
    raise UserConfigError(f"unknown user kind {kind!r}; valid: {', '.join(USER_KINDS)}")
