"""A stand-in for slime's `Sample` (slime/utils/types.py at 624b824): the same fields, defaults and Status
members, and the checks slime's RolloutManager applies before training (slime/ray/rollout.py,
`_convert_samples_to_train_data`). slime cannot be installed here; the adapter is tested against this contract.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0


SLIME_SAMPLE_FIELDS = (
    "group_index index rollout_id prompt tokens multimodal_inputs multimodal_train_inputs multimodal_train_input_id "
    "apply_chat_template_kwargs response response_length label reward loss_mask weight_versions rollout_log_probs "
    "rollout_top_p_token_ids rollout_top_p_token_offsets rollout_routed_experts remove_sample teacher_log_probs "
    "status metadata generate_function_path custom_rm_path train_metadata session_id non_generation_time"
).split()  # spec_info and prefix_cache_info (nested stats classes) are left out: the adapter never touches them


def check_like_slime(samples: list[Sample], raw_rewards: list[float] | None = None,
                     rewards: list[float] | None = None) -> None:
    """The assertions slime makes on returned samples before building train data."""
    for s in samples:
        assert isinstance(s.status, Sample.Status), f"status must be a Sample.Status, got {type(s.status)}"
        assert s.reward is not None, "slime needs a reward on every sample (or a reward model)"
        assert s.tokens and s.response_length > 0
        assert len(s.tokens) > s.response_length
        assert len(s.loss_mask) == s.response_length, "loss mask length != response length"
        if samples[0].rollout_log_probs is not None:
            assert s.rollout_log_probs is not None and len(s.rollout_log_probs) == s.response_length
    if raw_rewards is not None:
        assert len(raw_rewards) == len(samples) and len(rewards) == len(samples)
