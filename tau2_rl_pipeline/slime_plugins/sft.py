"""slime's SFT rollout with this project's loss mask: the scripts' `--rollout-function-path` for SFT and RFT.

One decision, the same in local and slime SFT: an assistant turn is trained on its text and its end-of-turn token
(`<|im_end|>`), never on the `\\n` the chat template writes after that token. The policy never samples that `\\n`:
generation stops at `<|im_end|>`, and in GRPO rollouts (local and slime) the `\\n` arrives as part of the next
observation's template delta, mask 0. SFT therefore trains on exactly the targets GRPO trains on. slime's `qwen3`
loss mask (slime/utils/mask_utils.py `gen_multi_turn_loss_mask_qwen3` at 624b824) also marks that `\\n` (817
tokens over the 178 oracle rows of the three domains); this wrapper runs slime's own SFT rollout
(slime/rollout/sft_rollout.py, which builds tokens and masks with slime's `MultiTurnLossMaskGenerator`) and clears
only those positions. The local trainer's mask (`trainer.sft_example_from_chat`) is the same token for token
(tests/contract/test_sft_masks.py).

slime is imported only inside `generate_rollout`, which runs in slime's Ray job; the mask function is pure.
"""

from __future__ import annotations

from typing import Any


def mask_after_end_of_turn(tokens: list[int], loss_mask: list[int], end_of_turn_id: int) -> list[int]:
    """`loss_mask` (over the last len(loss_mask) tokens, as slime stores it) with 0 on every token that directly
    follows an end-of-turn token."""
    offset = len(tokens) - len(loss_mask)
    if offset < 0:
        raise ValueError(f"a loss mask of {len(loss_mask)} over {len(tokens)} tokens")
    return [0 if offset + i > 0 and tokens[offset + i - 1] == end_of_turn_id else m for i, m in enumerate(loss_mask)]


def generate_rollout(args: Any, rollout_id: int, data_buffer: Any, evaluation: bool = False) -> list:
    """slime's `slime.rollout.sft_rollout.generate_rollout`, then the `\\n` after each `<|im_end|>` left untrained."""
    # slime's own SFT rollout: present in slime's Ray job, where this runs
    from slime.rollout import sft_rollout

    samples = sft_rollout.generate_rollout(args, rollout_id, data_buffer, evaluation)
    tokenizer = sft_rollout.TOKENIZER  # loaded by the call above from --hf-checkpoint
    end_of_turn_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    for group in samples:  # slime returns groups (lists) of samples, one sample each in SFT
        for sample in group:
            sample.loss_mask = mask_after_end_of_turn(sample.tokens, sample.loss_mask, end_of_turn_id)
    return samples
