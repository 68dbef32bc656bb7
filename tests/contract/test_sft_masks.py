"""slime's real SFT rollout over our SFT rows: slime's data source reads the JSONL, slime's sft_rollout builds tokens
and masks with its `MultiTurnLossMaskGenerator` (loss-mask type qwen3, the real Qwen3 tokenizer), and the mask the
stage scripts train with (tau2_rl_pipeline.slime_plugins.sft) equals the local trainer's token for token.

The one decision (tau2_rl_pipeline/slime_plugins/sft.py): the `\\n` after `<|im_end|>` is never a target; slime's raw qwen3
mask differs from ours exactly there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from tau2_rl_pipeline.learning.oracle_demos import oracle_demonstrations
from tau2_rl_pipeline.learning.seed_data import load_seed
from tau2_rl_pipeline.local.examples import sft_example_from_chat
from tau2_rl_pipeline.slime_plugins.sft import generate_rollout, mask_after_end_of_turn

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "seed_fixture.jsonl"
DOMAINS = ("airline", "retail", "telecom")
SCRIPTS_ROLLOUT_FUNCTION = "tau2_rl_pipeline.slime_plugins.sft.generate_rollout"  # train_sft.sh's --rollout-function-path


@pytest.fixture(scope="module")
def oracle_rows() -> list[dict]:
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [row for rows in pool.map(oracle_demonstrations, DOMAINS, ["train"] * len(DOMAINS)) for row in rows]


def seed_rows() -> list[dict]:
    """The valid rows of the seed fixture, as scripts/download.sh writes them (sft_data's loader, rejects left out)."""
    return load_seed(str(FIXTURE))[0]


def slime_args(prompt_data: Path, tokenizer_dir: Path, rows: int) -> argparse.Namespace:
    """What slime's data source and SFT rollout read, as scripts/train_sft.sh sets it (one batch of every row)."""
    return argparse.Namespace(
        prompt_data=str(prompt_data), hf_checkpoint=str(tokenizer_dir), input_key="messages", tool_key="tools",
        metadata_key="metadata", label_key=None, multimodal_keys=None, apply_chat_template=False,
        apply_chat_template_kwargs=None, rollout_max_prompt_len=None, rollout_seed=42, rollout_shuffle=False,
        rollout_global_dataset=True, dump_details=None, n_samples_per_prompt=1, rollout_batch_size=rows,
        loss_mask_type="qwen3", buffer_filter_path=None)


def slime_samples(rows: list[dict], tmp_path: Path, tokenizer_dir: Path, rollout) -> list:
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    args = slime_args(data, tokenizer_dir, len(rows))
    groups = rollout(args, 0, RolloutDataSourceWithBuffer(args))
    assert all(len(group) == 1 for group in groups) and len(groups) == len(rows)
    return [group[0] for group in groups]


def full_mask(sample) -> list[int]:
    return [0] * (len(sample.tokens) - len(sample.loss_mask)) + list(sample.loss_mask)


def compare(rows: list[dict], tmp_path: Path, tokenizer: object, *, through_wrapper: bool) -> tuple[int, int]:
    """Asserts slime's SFT as the scripts run it and the local trainer train the same tokens; returns (positions of
    slime's raw qwen3 mask left untrained, `<|im_end|>` tokens followed by `\\n` in trained turns).

    slime's rollout runs once over `rows` when not `through_wrapper` (the oracle rows: the costly case): the raw
    samples are then masked with the wrapper's own function, which the seed rows test end to end."""
    import copy

    from slime.rollout import sft_rollout

    tokenizer_dir = Path(tokenizer.name_or_path)
    raw = slime_samples(rows, tmp_path, tokenizer_dir, sft_rollout.generate_rollout)
    end, newline = tokenizer.convert_tokens_to_ids(tokenizer.eos_token), tokenizer.encode("\n")[0]
    if through_wrapper:  # as slime's RolloutManager runs it: loaded by the scripts' path, called through slime
        from slime.rollout.base_types import call_rollout_fn
        from slime.utils.misc import load_function

        rollout = load_function(SCRIPTS_ROLLOUT_FUNCTION)
        assert rollout is generate_rollout
        ours = slime_samples(rows, tmp_path, tokenizer_dir,
                             lambda *a: call_rollout_fn(rollout, *a, evaluation=False).samples)
    else:
        ours = copy.deepcopy(raw)
        for sample in ours:
            sample.loss_mask = mask_after_end_of_turn(sample.tokens, sample.loss_mask, end)
    cleared = ends = 0
    for row, sample, raw_sample in zip(rows, ours, raw):
        local = sft_example_from_chat(tokenizer, row["messages"], row["tools"])
        n = len(local.input_ids)
        mask, raw_mask = full_mask(sample), full_mask(raw_sample)
        assert sample.tokens == raw_sample.tokens
        assert sample.tokens[:n] == local.input_ids, row["metadata"]
        assert mask[:n] == local.loss_mask, row["metadata"]
        assert not any(mask[n:])  # trailing observations: context only, as locally
        diff = [i for i, (a, b) in enumerate(zip(mask, raw_mask)) if a != b]
        assert all(raw_mask[i] == 1 and mask[i] == 0 and sample.tokens[i - 1] == end for i in diff)
        cleared += len(diff)
        ends += sum(1 for i in range(1, len(mask)) if raw_mask[i - 1] == 1 and sample.tokens[i - 1] == end
                    and sample.tokens[i] == newline)
    return cleared, ends


def test_slime_sft_masks_equal_the_local_ones_on_every_oracle_row(oracle_rows, tmp_path, qwen3_tokenizer) -> None:
    cleared, ends = compare(oracle_rows, tmp_path, qwen3_tokenizer, through_wrapper=False)
    assert len(oracle_rows) == 178
    assert cleared == ends > 0  # slime's qwen3 mask trains exactly one `\n` per trained turn; we train none


def test_slime_sft_masks_equal_the_local_ones_on_the_seed_rows(tmp_path, qwen3_tokenizer) -> None:
    rows = seed_rows()
    cleared, ends = compare(rows, tmp_path, qwen3_tokenizer, through_wrapper=True)
    assert rows and cleared == ends > 0


def test_only_the_token_after_an_end_of_turn_is_cleared() -> None:
    tokens = [5, 9, 1, 7, 9, 2]  # 9 ends a turn
    assert mask_after_end_of_turn(tokens, [1, 1, 1, 1], end_of_turn_id=9) == [0, 1, 1, 0]  # over tokens[2:]
    assert mask_after_end_of_turn(tokens, [1, 1, 1, 1, 1, 1], end_of_turn_id=9) == [1, 1, 0, 1, 1, 0]
    with pytest.raises(ValueError, match="a loss mask of 7 over 6 tokens"):
        mask_after_end_of_turn(tokens, [1] * 7, end_of_turn_id=9)
