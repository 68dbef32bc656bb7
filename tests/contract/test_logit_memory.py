"""The sizing sheet's bytes per logit entry (scale/sizing.py, LOGIT_BYTES) measured on slime's own loss code.

slime's GRPO loss upcasts the [tokens, vocab/TP] logits (Megatron's Float16Module), divides them by the rollout
temperature and runs slime's vocab-parallel log-softmax and entropy (slime/utils/ppo_utils.py,
calculate_log_probs_and_entropy) with the entropy's gradient on; SFT has neither temperature nor entropy. Here that
code runs on CPU under a dispatch mode that counts every buffer alive, and the peaks of the forward and of the
backward are what the sheet counts. One difference from a GPU, from slime's own comment: on CPU the entropy's
sum of softmax x logits materializes a product buffer (4 B an entry) that the GPU's einsum does not.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tau2_rl_pipeline.scale.sizing import LOGIT_BYTES

CPU_ONLY_PRODUCT = 4  # slime: "Avoid materializing the full [seq_len, vocab] product buffer" (CUDA only)


class LiveBytes(TorchDispatchMode):
    """Bytes of the buffers the ops inside it created and that are still referenced; the peak of that."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}
        self.now = self.peak = 0

    def _drop(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.now -= entry[0]
                del self.live[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr in self.live:
                    self.live[ptr][1] += 1
                else:
                    self.live[ptr] = [t.untyped_storage().nbytes(), 1]
                    self.now += self.live[ptr][0]
                    self.peak = max(self.peak, self.now)
                weakref.finalize(t, self._drop, ptr)
        return out


def peaks(temperature: float, entropy: bool) -> tuple[float, float]:
    """Bytes per logit entry at the forward's peak and at the backward's, as slime's loss path runs."""
    from slime.utils.ppo_utils import calculate_log_probs_and_entropy

    tokens_n, vocab = 256, 4096
    logits = torch.randn(tokens_n, vocab, dtype=torch.bfloat16, requires_grad=True)  # the output layer's
    tokens = torch.randint(0, vocab, (tokens_n,))
    with LiveBytes() as mem:
        upcast = logits.float()  # Megatron's Float16Module
        scaled = upcast / temperature if temperature != 1.0 else upcast  # get_log_probs_and_entropy
        log_prob, ent = calculate_log_probs_and_entropy(scaled, tokens, None, with_entropy=entropy,
                                                        with_entropy_grad=entropy)
        loss = -log_prob.sum() - (0.001 * ent.sum() if entropy else 0)
        del upcast, scaled  # Megatron's forward step lets the logits go once the loss is computed
        forward, mem.peak = mem.peak, mem.now
        loss.backward()
    return forward / (tokens_n * vocab), mem.peak / (tokens_n * vocab)


def test_grpo_keeps_three_fp32_buffers_at_its_peaks() -> None:
    forward, backward = peaks(0.7, entropy=True)  # the stage's GRPO_TEMPERATURE and GRPO_ENTROPY_COEF != 0
    assert forward - CPU_ONLY_PRODUCT == pytest.approx(LOGIT_BYTES["grpo"], abs=0.1) == 12
    assert backward == pytest.approx(LOGIT_BYTES["grpo"], abs=0.1)


def test_sft_keeps_two() -> None:
    forward, backward = peaks(1.0, entropy=False)
    assert forward == pytest.approx(LOGIT_BYTES["sft"], abs=0.1) == 8
    assert backward < forward
