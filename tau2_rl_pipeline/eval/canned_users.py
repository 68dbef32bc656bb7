"""Canned user simulators, well-behaved and misbehaving, for qualifying the qualification.

Canned user simulators for qualifying the qualification (tests, docs/evaluation.md's table): a well-behaved one
and one for each way a user simulator is known to misbehave. Each is a tau2 `BaseUser` playing a real tau2
environment, scored by tau2's own evaluator, with no model at all.

`CannedUser` behaves: it opens with its request (the reason for the call, in a sentence of its own), answers the
oracle's questions with the facts its scenario states (scenario.py), performs a device step when asked for it by
name (as the scripted user does), and ends the conversation once the agent has nothing more to do. Each subclass
changes one thing (`reply`): empty replies, or every other one empty; the agent's last message echoed, or
paraphrased; never ending; ending at once, with ###STOP### or ###TRANSFER###, or after small talk that never states
the request; ending politely before the work is done; saying the same thing every turn; reciting its system prompt
(tau2's guidelines and the scenario) or only its persona; giving facts that differ from the scenario, or a wrong
name of its own accord; answering in Spanish; rambling (about 500 words a message, which qualifies: the rewards
stay right, and the qualification shows its length against the reference user's).
"""

from __future__ import annotations

from tau2.data_model.message import Message, ToolCall, UserMessage
from tau2.data_model.tasks import Task
from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

from tau2_rl_pipeline.benchmark.scenario import Fact, probe_question, scenario_facts, states
from tau2_rl_pipeline.benchmark.tau2_version import STOP, BaseUser, UserState
from tau2_rl_pipeline.benchmark.user_monitors import CONTROL_TOKENS


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


class WrongNameUser(CannedUser):
    """Introduces itself by a name that is not its own (one letter changed when the scenario names it), then
    answers every question right: a wrong fact nobody asked for."""

    def opening(self) -> str:
        named = [f.value for f in self.facts if "name" in f.label and f.value.isalpha()]
        return f"Hello, my name is {altered(named[0]) if named else 'Morgan Avery'}. {self.request}"


_SMALL_TALK = ("I have been meaning to get this sorted for a while now, honestly.",
               "It has been one of those weeks where everything seems to happen at once.",
               "My neighbour says these things usually get fixed quickly, so I am hopeful.",
               "I remember the last time I called it took forever, but that was a different matter.",
               "Anyway, I appreciate you taking the time to listen to all of this.",
               "The weather has been lovely lately, which makes the waiting easier.",
               "I always like to explain things properly so that nothing gets lost along the way.",
               "My family keeps telling me I should just do everything online these days.",
               "I wrote a few notes before calling so that I would not forget anything important.",
               "Sometimes I wonder whether these systems were designed with people like me in mind.",
               "I do not mean to complain, of course, I am just thinking out loud here.",
               "Thank you for being patient with me while I go through all of this.")


class RamblingUser(CannedUser):
    """Says what the well-behaved user says, wrapped in about 500 words of small talk, different every turn."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        ending = STOP if STOP in text else ""
        said = text.replace(STOP, "").strip()
        talk = [_SMALL_TALK[(self.turn * 5 + i * 7) % len(_SMALL_TALK)] for i in range(36)]
        return " ".join([*talk[:18], said, *talk[18:], ending]).strip()


class LoopingUser(CannedUser):
    """Says its opening again, word for word, whatever the agent says."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        return self.opening()


_SWAPS = {"you": "I", "your": "my", "i": "you", "my": "your", "me": "you", "can": "could", "is": "would be",
          "what": "which", "please": "kindly", "have": "got", "the": "that"}


def paraphrased(text: str) -> str:
    """`text` with its pronouns and a few common words swapped ("Could you tell me your id?" -> "Could I tell you
    my id?"): the same message said back, nothing new in it."""
    return " ".join(_SWAPS.get(w.lower(), w) for w in text.split())


class ParaphrasingUser(CannedUser):
    """Says the agent's last message back, paraphrased (similarity about 0.8: under the verbatim threshold)."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        return paraphrased(agent) if agent else text


class EndsPolitelyUser(CannedUser):
    """Thanks the agent and ends the conversation at its second message, whatever is left to do."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        return f"Thank you so much for your help, that is all I needed today. {STOP}" if self.turn > 1 else text


class SmallTalkUser(CannedUser):
    """Talks (small talk, no word of its request), then ends the conversation."""

    def reply(self, kind: str, text: str, agent: str) -> str:
        if self.turn == 1:
            return "Hello there! I hope you are having a lovely day, it is so nice and sunny outside."
        return f"Well, it was lovely chatting with you. Goodbye! {STOP}"


class TransfersAtOnceUser(CannedUser):
    def reply(self, kind: str, text: str, agent: str) -> str:
        return CONTROL_TOKENS[1]


class PersonaReciterUser(CannedUser):
    """Opens by reciting its persona word for word (tau2's personas run from a few words to a paragraph)."""

    def opening(self) -> str:
        persona = (self.task.user_scenario.persona or "").strip()
        return f"Hello. {persona} {self.request}" if persona else super().opening()


CANNED_USERS = {"canned": CannedUser, "empty": EmptyUser, "half-empty": HalfEmptyUser, "echo": EchoUser,
                "paraphrases": ParaphrasingUser, "never-ends": NeverEndingUser, "stops-at-once": StopsAtOnceUser,
                "transfers-at-once": TransfersAtOnceUser, "small-talk": SmallTalkUser,
                "ends-politely": EndsPolitelyUser, "loops": LoopingUser, "reveals": RevealingUser,
                "recites-persona": PersonaReciterUser, "wrong-facts": WrongFactsUser, "wrong-name": WrongNameUser,
                "spanish": SpanishUser, "rambles": RamblingUser}
