"""Token-in/token-out bookkeeping: one set of books for what the trainer learns from.

The response holds the policy's sampled tokens exactly as sampled (mask 1, their log-probs) and, between turns,
the chat template's token delta for what the policy observed (mask 0, log-prob 0): tool results, the user's
reply, the template's separators and the next generation prompt. No earlier turn is ever re-tokenized: a model's
sampled ids need not be the canonical tokenization of their text, and re-tokenizing them would train on tokens
the model never produced.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tau2_rl_pipeline.benchmark.prompting import render

_ANCHOR = [{"role": "assistant", "content": "x"}]
_UNSEEN = object()
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # in a Python str every surrogate code point is a lone one
SYSTEM_TURNS_KEPT = 32  # system prompt + tool set pairs whose tokens are kept (a few per domain in practice)


class ObservationTemplate:
    """Renders only the new part of the chat template after an assistant turn; and first prompts as a cached
    system turn plus such a delta.

    The delta is the template's text for `[anchor assistant turn] + observations` (with the generation prompt)
    minus the anchor's text up to and including its end-of-turn token; its cost depends on the observation
    alone, never on the history's length. Tokenizing the delta on its own gives the same ids as tokenizing the
    whole conversation because it starts right after a special token, where BPE never merges across.
    """

    def __init__(self, tokenizer, end_of_turn: str | None = None):
        self.tokenizer = tokenizer
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        anchor = tokenizer.apply_chat_template(_ANCHOR, tokenize=False)
        cut = anchor.rfind(self.end_of_turn)
        if cut < 0:
            raise ValueError(f"the chat template does not end assistant turns with {self.end_of_turn!r}")
        self._anchor = anchor[: cut + len(self.end_of_turn)]
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids(self.end_of_turn)
        self._system_turns: dict[tuple[str, str], tuple[int, ...] | None] = {}
        self._lock = threading.Lock()
        # A fast tokenizer's Rust encoder, called directly: the same ids as tokenizer.encode without transformers'
        # per-call wrapper (~0.06 ms, a third of a short observation's encode); encode_batch releases the GIL.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def delta_text(self, observations: list[dict]) -> str:
        full = self.tokenizer.apply_chat_template(_ANCHOR + observations, tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._anchor):
            raise ValueError("the chat template re-renders earlier turns; token deltas are not valid for it")
        return full[len(self._anchor):]

    def delta_ids(self, observations: list[dict]) -> list[int]:
        return self._encode(self.delta_text(observations))

    def first_prompt_ids(self, chat: list[dict], tools: list[dict] | None) -> list[int]:
        """The ids of `render(chat, tools)` with the generation prompt, `chat` opening with the system turn.

        The system turn (tau2's policy and the tool schemas: the same in every episode of a domain, 5-7k tokens,
        10-20 ms to render and tokenize) is done once per system prompt and tool set; the rest is a delta. The
        first time, the whole prompt is rendered too and the shortcut kept only if it gives the same text.
        """
        if not chat or chat[0].get("role") != "system" or len(chat) < 2:
            return self._encode(render(self.tokenizer, chat, tools, add_generation_prompt=True))
        key = (chat[0]["content"], json.dumps(tools))
        head = self._system_turns.get(key, _UNSEEN)
        if head is not _UNSEEN:
            if head is not None:
                return [*head, *self._encode(self.delta_text(chat[1:]))]
            return self._encode(render(self.tokenizer, chat, tools, add_generation_prompt=True))
        text = render(self.tokenizer, chat, tools, add_generation_prompt=True)
        cut = text.find(self.end_of_turn) + len(self.end_of_turn)
        try:
            fits = cut >= len(self.end_of_turn) and text[:cut] + self.delta_text(chat[1:]) == text
        except ValueError:  # a template whose deltas are not valid
            fits = False
        head = tuple(self._encode(text[:cut])) if fits else None
        with self._lock:
            if len(self._system_turns) >= SYSTEM_TURNS_KEPT:
                self._system_turns.pop(next(iter(self._system_turns)))
            self._system_turns[key] = head
        return [*head, *self._encode(text[cut:])] if fits else self._encode(text)

    def _encode(self, text: str) -> list[int]:
        try:
            return self._encode_unicode(text)
        except (TypeError, UnicodeEncodeError):  # what tokenizers raise on a lone surrogate
            valid = valid_unicode(text)
            if valid == text:
                raise
            return self._encode_unicode(valid)

    def _encode_unicode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode_batch([text], add_special_tokens=False)[0].ids
        return self.tokenizer.encode(text, add_special_tokens=False)


def valid_unicode(text: str) -> str:
    """`text` with each lone UTF-16 surrogate replaced by U+FFFD. The policy's own turns never hold one (they are
    decoded from token ids, and the parser refuses JSON escapes of one), but a user simulator's JSON reply or a
    tool result can: what the policy then observes is U+FFFD, and the episode goes on."""
    return _LONE_SURROGATE.sub("\ufffd", text)


@dataclass(frozen=True)
class TopPSpans:
    """The ids each sampled token's top-p nucleus kept: token i kept `ids[offsets[i]:offsets[i + 1]]`
    (slime's layout for `rollout_top_p_token_ids` / `rollout_top_p_token_offsets`)."""

    ids: list[int]
    offsets: list[int]

    def __post_init__(self) -> None:
        if not self.offsets or self.offsets[0] != 0 or self.offsets[-1] != len(self.ids):
            raise ValueError(f"top-p offsets must run from 0 to len(ids)={len(self.ids)}, got "
                             f"{self.offsets[:1]}..{self.offsets[-1:]}")

    def __len__(self) -> int:
        return len(self.offsets) - 1


class TokenBuffer:
    """Prompt ids, then response ids with a loss mask and rollout log-probs kept in step; and, when the engine
    returns them, the top-p nucleus of every response token (policy tokens: what they were sampled among;
    observation tokens: empty spans, as slime's `Sample.append_response_tokens` pads them).

    The books are tuples, not lists: a list of N ids is N references that every GC pass over it walks, while
    CPython stops tracking a tuple of numbers at the first young pass it survives, so no pass walks it again.
    With 256 episodes in flight the books were about half of the references a full pass walked
    (bench/README.md, P5). Extending a tuple copies it (the pointers, as `all_ids()` does for every request
    anyway); `array.array` would also hide the numbers, but boxing them back into ints for every request cost
    30% more CPU on this path. `lists()` hands the books out as the lists a Trajectory (and slime's Sample)
    holds, once, when the episode ends.
    """

    __slots__ = ("prompt_ids", "response_ids", "loss_mask", "logprobs", "top_p_ids", "top_p_offsets")

    def __init__(self, prompt_ids: Iterable[int] = ()):
        self.prompt_ids = tuple(prompt_ids)
        self.response_ids: tuple[int, ...] = ()
        self.loss_mask: tuple[int, ...] = ()
        self.logprobs: tuple[float, ...] = ()
        self.top_p_ids: tuple[int, ...] | None = None
        self.top_p_offsets: tuple[int, ...] | None = None

    def set_prompt(self, ids: Iterable[int]) -> None:
        self.prompt_ids = tuple(ids)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def all_ids(self) -> list[int]:
        """The next request's prompt: a list made for the request, not kept."""
        return [*self.prompt_ids, *self.response_ids]

    def lists(self) -> tuple[list[int], list[int], list[int], list[float], TopPSpans | None]:
        """(prompt ids, response ids, loss mask, log-probs, top-p spans or None) as lists, for the Trajectory."""
        top_p = (TopPSpans(list(self.top_p_ids), list(self.top_p_offsets))
                 if self.top_p_offsets is not None else None)
        return list(self.prompt_ids), list(self.response_ids), list(self.loss_mask), list(self.logprobs), top_p

    def add_policy(self, ids: list[int], logprobs: list[float], top_p: TopPSpans | None = None) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} log-probs")
        if ids:
            self._add_top_p(ids, top_p)
        self.response_ids += tuple(ids)
        self.loss_mask += (1,) * len(ids)
        self.logprobs += tuple(map(float, logprobs))

    def add_observation(self, ids: list[int]) -> None:
        if self.top_p_offsets is not None:
            self.top_p_offsets += (self.top_p_offsets[-1],) * len(ids)
        self.response_ids += tuple(ids)
        self.loss_mask += (0,) * len(ids)
        self.logprobs += (0.0,) * len(ids)

    def _add_top_p(self, ids: list[int], top_p: TopPSpans | None) -> None:
        """Top-p spans are kept for every policy turn or for none: a book with holes would train on a nucleus
        the token was not sampled from."""
        if top_p is None:
            if self.top_p_offsets is not None:
                raise ValueError("a policy turn came without top-p spans after turns that had them")
            return
        if len(top_p) != len(ids):
            raise ValueError(f"top-p spans for {len(top_p)} tokens, {len(ids)} sampled")
        if self.top_p_offsets is None:
            if self.response_ids:
                raise ValueError("top-p spans began after the first policy turn")
            self.top_p_ids, self.top_p_offsets = (), (0,)
        base = self.top_p_offsets[-1]
        self.top_p_ids += tuple(top_p.ids)
        self.top_p_offsets += tuple(base + o for o in top_p.offsets[1:])

    def policy_ids(self) -> list[int]:
        return [t for t, m in zip(self.response_ids, self.loss_mask) if m]
