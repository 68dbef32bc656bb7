"""What the local trainer learns from: one sequence with its loss mask, and padded micro-batches.

What the local trainer learns from: one sequence with its loss mask (and advantage, weight, rollout log-probs),
built from a rollout's trajectory or from an SFT chat, and a micro-batch of them as padded tensors. Pure
bookkeeping: no model, no optimizer."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TrainExample:
    """One sequence with per-token arrays aligned to `input_ids` (index i is about predicting token i)."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 = a target token (the policy's own), 0 = context (prompt, observations)
    advantage: float = 0.0  # GRPO: the sequence's advantage, applied to each of its mask-1 tokens
    weight: float = 1.0  # AWSFT: the sequence's weight (learning/awsft.py), applied to each of its mask-1 tokens
    old_logprobs: list[float] | None = None  # GRPO: rollout log-probs (0 where mask 0); None = on-policy

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if n < 2:
            raise ValueError(f"a training sequence needs at least 2 tokens, got {n}")
        if len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} input ids")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask must hold only 0 and 1")
        if self.loss_mask[0]:
            raise ValueError("loss_mask[0] must be 0: nothing precedes the first token to predict it")
        if self.old_logprobs is not None and len(self.old_logprobs) != n:
            raise ValueError(f"old_logprobs has {len(self.old_logprobs)} entries for {n} input ids")
        if not math.isfinite(self.advantage):
            raise ValueError(f"advantage must be finite, got {self.advantage}")
        if not (math.isfinite(self.weight) and self.weight >= 0):
            raise ValueError(f"weight must be a finite number >= 0, got {self.weight}")

    @property
    def num_targets(self) -> int:
        return sum(self.loss_mask)


def examples_from_trajectory(prompt_ids: Sequence[int], response_ids: Sequence[int], loss_mask: Sequence[int],
                             rollout_logprobs: Sequence[float] | None, advantage: float,
                             weight: float = 1.0) -> TrainExample:
    """A rollout's books (slime's Sample layout: mask and log-probs cover the response only) as one example."""
    if len(loss_mask) != len(response_ids):
        raise ValueError(f"loss_mask has {len(loss_mask)} entries for {len(response_ids)} response ids")
    if rollout_logprobs is not None and len(rollout_logprobs) != len(response_ids):
        raise ValueError(f"rollout_logprobs has {len(rollout_logprobs)} entries for {len(response_ids)} response ids")
    pad = [0] * len(prompt_ids)
    return TrainExample(
        input_ids=list(prompt_ids) + list(response_ids), loss_mask=pad + list(loss_mask), advantage=float(advantage),
        weight=float(weight),
        old_logprobs=None if rollout_logprobs is None else [0.0] * len(pad) + [float(x) for x in rollout_logprobs])


def sft_example_from_chat(tokenizer: Any, chat: list[dict], tools: list[dict] | None = None) -> TrainExample:
    """A demonstration as one example: mask 1 exactly on each assistant turn's text and its end-of-turn token.

    Spans come from rendering prefixes with the chat template: an assistant turn starts where the prefix before
    it plus the generation prompt ends, and stops after the end-of-turn token that rendering it appends. The
    header, the newline after the end-of-turn token, and system/user/tool turns stay 0. The newline is the one
    documented decision (tau2_rl_pipeline/slime_plugins/sft.py): never a target, since the policy never samples it
    (rollouts stop at <|im_end|>); slime's qwen3 loss mask trains it, so the scripts run slime's SFT through
    slime_plugins.sft, which clears it, and slime's mask then equals this one token for token (tests/contract).
    Each span is tokenized on its own, exactly as a rollout keeps its books (prompt encoded once, sampled turns
    as sampled, observations as template deltas), so SFT trains on the token sequences GRPO sees.
    Trailing observations after the last assistant turn are dropped: nothing after them is a target. An
    assistant message with `"step_loss_mask": 0` (slime's per-message switch; sft_data marks the fixed greeting
    and rejected completions so) stays in the context and is not a target.
    """
    from tau2_rl_pipeline.benchmark.prompting import render  # imports tau2 and litellm (seconds): only this needs them

    end = tokenizer.eos_token
    if not end:
        raise ValueError("the tokenizer has no eos_token to end assistant turns with")
    full = render(tokenizer, chat, tools, add_generation_prompt=False)
    bounds = [0]
    trainable: list[int] = []
    for k, message in enumerate(chat):
        if message.get("role") != "assistant":
            continue
        trainable.append(1 if message.get("step_loss_mask", 1) else 0)
        head = render(tokenizer, chat[:k], tools, add_generation_prompt=True)
        upto = render(tokenizer, chat[:k + 1], tools, add_generation_prompt=False)
        stop = upto.rfind(end)
        if not (full.startswith(upto) and upto.startswith(head) and stop >= len(head)):
            raise ValueError(f"the chat template does not render turn {k} as a prefix of the whole chat")
        bounds += [len(head), stop + len(end)]
    if not any(trainable):
        raise ValueError("the chat has no trainable assistant turn: nothing to learn from")
    ids: list[int] = []
    mask: list[int] = []
    for i in range(len(bounds) - 1):
        piece = tokenizer.encode(full[bounds[i]:bounds[i + 1]], add_special_tokens=False)
        ids += piece
        mask += [trainable[i // 2] if i % 2 else 0] * len(piece)  # odd segments are assistant turns
    return TrainExample(input_ids=ids, loss_mask=mask)


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    has_old: torch.Tensor  # [batch, 1] bool: rows without rollout log-probs are scored on-policy
    advantages: torch.Tensor  # [batch, 1]
    weights: torch.Tensor  # [batch, 1]


def collate(examples: Sequence[TrainExample], pad_id: int, device: torch.device) -> Batch:
    """Right-padded tensors; padding has attention 0 and mask 0 (causal attention keeps real tokens unaffected)."""
    width = max(len(e.input_ids) for e in examples)

    def rows(get: Callable[[TrainExample], list], fill: float, dtype: torch.dtype) -> torch.Tensor:
        padded = [get(e) + [fill] * (width - len(e.input_ids)) for e in examples]
        return torch.tensor(padded, dtype=dtype, device=device)

    return Batch(
        input_ids=rows(lambda e: list(e.input_ids), pad_id, torch.long),
        attention_mask=rows(lambda e: [1] * len(e.input_ids), 0, torch.long),
        loss_mask=rows(lambda e: list(e.loss_mask), 0, torch.float32),
        old_logprobs=rows(lambda e: list(e.old_logprobs or [0.0] * len(e.input_ids)), 0.0, torch.float32),
        has_old=torch.tensor([[e.old_logprobs is not None] for e in examples], device=device),
        advantages=torch.tensor([[e.advantage] for e in examples], dtype=torch.float32, device=device),
        weights=torch.tensor([[e.weight] for e in examples], dtype=torch.float32, device=device))
