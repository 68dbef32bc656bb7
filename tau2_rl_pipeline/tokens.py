"""Token-in/token-out bookkeeping: one set of books for what the trainer learns from.

The response holds the policy's sampled tokens exactly as sampled (mask 1, their log-probs) and, between turns,
the chat template's token delta for what the policy observed (mask 0, log-prob 0): tool results, the user's
reply, the template's separators and the next generation prompt. No earlier turn is ever re-tokenized: a model's
sampled ids need not be the canonical tokenization of their text, and re-tokenizing them would train on tokens
the model never produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_ANCHOR = [{"role": "assistant", "content": "x"}]


class ObservationTemplate:
    """Renders only the new part of the chat template after an assistant turn.

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

    def delta_text(self, observations: list[dict]) -> str:
        full = self.tokenizer.apply_chat_template(_ANCHOR + observations, tokenize=False, add_generation_prompt=True)
        if not full.startswith(self._anchor):
            raise ValueError("the chat template re-renders earlier turns; token deltas are not valid for it")
        return full[len(self._anchor):]

    def delta_ids(self, observations: list[dict]) -> list[int]:
        return self.tokenizer.encode(self.delta_text(observations), add_special_tokens=False)


@dataclass
class TokenBuffer:
    """Prompt ids, then response ids with a loss mask and rollout log-probs kept in step."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def add_policy(self, ids: list[int], logprobs: list[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} sampled ids but {len(logprobs)} log-probs")
        self.response_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)

    def add_observation(self, ids: list[int]) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def policy_ids(self) -> list[int]:
        return [t for t, m in zip(self.response_ids, self.loss_mask) if m]
