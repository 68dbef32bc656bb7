"""Canned user simulators, well-behaved and misbehaving, for qualifying the qualification.

Canned user simulators for qualifying the qualification (tests, docs/evaluation.md's table): a well-behaved one
and one for each way a user simulator is known to misbehave. Each is a tau2 `BaseUser` playing a real tau2
environment, scored by tau2's own evaluator, with no model at all.

`CannedUser` behaves: it opens with its request (the reason for the call, in a sentence of its own), answers the
oracle's questions with the facts its scenario states (scenario.py), performs a device step when asked for it by
name (as the scripted user does), and ends the conversation once the agent has nothing more to do. Each subclass
changes one thing (`reply`): empty replies, or every other one empty; the agent's last message echoed; never
ending; ending at once; reciting its system prompt (tau2's guidelines and the scenario); giving facts that differ
from the scenario; answering in Spanish.
"""

from __future__ import annotations

from tau2.data_model.message import Message, ToolCall, UserMessage
from tau2.data_model.tasks import Task
from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

from tau2_rl_pipeline.benchmark.scenario import Fact, probe_question, scenario_facts, states
from tau2_rl_pipeline.benchmark.tau2_version import STOP, BaseUser, UserState


def _last_agent_text(messages: list[Message]) -> str:
    return next((m.content for m in reversed(messages) if getattr(m, "role", None) == "assistant" and m.content), "")


class CannedUser(BaseUser):
    """The well-behaved canned user (module docstring)."""

    def __init__(self, task: Task):
        super().__init__(instructions=str(task.user_scenario))
        self.task = task
        instructions = task.user_scenario.instructions
        reason = instructions if isinstance(instructions, str) else instructions.reason_for_call or ""
        self.request = reason.strip()
        self.facts = scenario_facts(task, str(task.user_scenario))
        self.questions = {probe_question(f): f for f in self.facts}
        criteria = task.evaluation_criteria
        self.user_actions = [a for a in (criteria.actions or []) if a.requestor == "user"] if criteria else []
        self.turn = 0

    def get_init_state(self, message_history: list[Message] | None = None) -> UserState:
        return UserState(system_messages=[], messages=list(message_history or []))

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return STOP in (message.content or "")

    def set_seed(self, seed: int) -> None:
        pass

    # -- what a well-behaved user says -----------------------------------------------------------------------
    def opening(self) -> str:
        return f"Hello, I need some help. {self.request}"

    def answer(self, fact: Fact) -> str:
        return f"Sure, the {fact.label} is {fact.value}."

    def closing(self) -> str:
        return f"Thank you, that is all I needed. {STOP}"

    def reply(self, kind: str, text: str, agent: str) -> str:
        """The text said for `kind` (opening, answer, done, closing, unsure): a misbehaving user changes it."""
        return text

    # -- the conversation ------------------------------------------------------------------------------------
    def generate_next_message(self, message, state: UserState) -> tuple[UserMessage, UserState]:
        state.messages.append(message)
        agent = _last_agent_text(state.messages)
        self.turn += 1
        done = sum(len(m.tool_calls) for m in state.messages if isinstance(m, UserMessage) and m.is_tool_call())
        pending = self.user_actions[done] if done < len(self.user_actions) else None
        if self.turn == 1:
            kind, text = "opening", self.opening()
        elif pending is not None and all(w in agent.lower() for w in pending.name.split("_")[1:]) \
                and getattr(message, "role", None) == "assistant":
            call = ToolCall(id=f"canned_{done}", name=pending.name, arguments=pending.arguments, requestor="user")
            reply = UserMessage(role="user", content=None, tool_calls=[call])
            state.messages.append(reply)
            return reply, state
        elif getattr(message, "role", None) == "tool":
            kind, text = "done", "I did that. What next?"
        elif agent in self.questions:
            kind, text = "answer", self.answer(self.questions[agent])
        elif pending is None:
            kind, text = "closing", self.closing()
        else:
            kind, text = "unsure", "I'm not sure what you want me to do."
        reply = UserMessage(role="user", content=self.reply(kind, text, agent))
        state.messages.append(reply)
        return reply, state


class EmptyUser(CannedUser):
    def reply(self, kind: str, text: str, agent: str) -> str:
        return ""


class HalfEmptyUser(CannedUser):
    """Every other message empty, from its second on."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        return "" if self.turn % 2 == 0 else text


class EchoUser(CannedUser):
    def reply(self, kind: str, text: str, agent: str) -> str:
        return agent or text


class NeverEndingUser(CannedUser):
    def reply(self, kind: str, text: str, agent: str) -> str:
        return "Thanks. Could you check everything once more for me?" if kind == "closing" else text


class StopsAtOnceUser(CannedUser):
    def reply(self, kind: str, text: str, agent: str) -> str:
        return STOP


class RevealingUser(CannedUser):
    """Recites its whole system prompt as tau2's user simulator gets it, as its opening."""

    def opening(self) -> str:
        guidelines = get_global_user_sim_guidelines(use_tools=bool(self.user_actions))
        return SYSTEM_PROMPT.format(global_user_sim_guidelines=guidelines, instructions=self.instructions)


def altered(value: str) -> str:
    """The value with its last letter or digit changed ("user_1" -> "user_2", "Meeting" -> "Meetinh")."""
    for i in range(len(value) - 1, -1, -1):
        ch = value[i]
        if ch.isdigit():
            return value[:i] + str((int(ch) + 1) % 10) + value[i + 1:]
        if ch.isalpha():
            nxt = "a" if ch.lower() == "z" else chr(ord(ch.lower()) + 1)
            return value[:i] + (nxt.upper() if ch.isupper() else nxt) + value[i + 1:]
    return value + "x"


class WrongFactsUser(CannedUser):
    """States every fact of its scenario with one character changed."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        for fact in self.facts:
            if states(text, fact.value):
                text = text.replace(fact.value, altered(fact.value))
        return text


class SpanishUser(CannedUser):
    def opening(self) -> str:
        values = ", ".join(f.value for f in self.facts)
        return f"Hola, necesito ayuda con mi solicitud, por favor. Los datos son: {values}." if values else \
            "Hola, necesito ayuda con mi solicitud, por favor."

    def answer(self, fact: Fact) -> str:
        return f"Claro, el dato que me pide es {fact.value}, gracias."

    def closing(self) -> str:
        return f"Muchas gracias, eso es todo por hoy. {STOP}"

    def reply(self, kind: str, text: str, agent: str) -> str:
        return "Lo hice. ¿Y ahora qué hago con el teléfono?" if kind == "done" else text


CANNED_USERS = {"canned": CannedUser, "empty": EmptyUser, "half-empty": HalfEmptyUser, "echo": EchoUser,
                "never-ends": NeverEndingUser, "stops-at-once": StopsAtOnceUser, "reveals": RevealingUser,
                "wrong-facts": WrongFactsUser, "spanish": SpanishUser}
