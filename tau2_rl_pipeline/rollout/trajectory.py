"""What one episode produced (`Trajectory`) and an episode its caller stopped, kept to go on (`LiveEpisode`).

The rollout's records, apart from the loop that fills them (episode_loop.py): a trajectory's
`prompt_ids + response_ids` is exactly what the policy saw and sampled, with its loss mask and log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tau2.data_model.message import Message
from tau2.data_model.simulation import RewardInfo

from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.rollout.tokens import TokenBuffer, TopPSpans


@dataclass
class Trajectory:
    """Everything one episode produced; `prompt_ids + response_ids` is exactly what the policy saw and sampled."""

    domain: str
    task_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    chat: list[dict]  # the agent's view: system prompt, then the conversation as chat messages
    tools: list[dict]
    messages: list[Message]  # tau2's full trajectory (both sides, user device calls included)
    reward_info: RewardInfo | None
    termination_reason: str
    status: str  # completed | truncated | aborted
    turns: int
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    parse_errors: int = 0
    refused_calls: int = 0
    unknown_tool_calls: int = 0
    user_tool_calls_by_agent: int = 0
    refused_call_ids: list[str] = field(default_factory=list)  # never executed: left out of tau2's replay
    turn_meta: list[dict] = field(default_factory=list)  # per policy turn: prompt_tokens, cached_tokens, weight_version
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # per request: its tokens in response_ids
    top_p: TopPSpans | None = None  # each response token's top-p nucleus, when the engine was asked for it
    judge_score: float | None = None  # an LLM judge's rubric score in [0, 1] (TAU2_USE_JUDGE), else None
    judge_calls: int = 0  # rubric-judge requests made for this episode, retries included (TAU2_USE_JUDGE)
    judge: dict[str, int] = field(default_factory=dict)  # NL-assertion judge calls and tokens (tau2 1.0.1)
    resumes: int = 0  # times this episode went on after its caller had stopped it (slime's partial rollout)
    live: LiveEpisode | None = None  # the episode's state when its caller stopped it: pass as resume= to go on

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    @property
    def reward(self) -> float:
        return float(self.reward_info.reward) if self.reward_info is not None else 0.0


class Clock:
    """Seconds spent per kind of work (env_s, generate_s, ...), over every call of a resumed episode."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.totals[key] = self.totals.get(key, 0.0) + seconds


@dataclass
class LiveEpisode:
    """An episode its caller stopped, with all it needs to go on: the tau2 conversation (environment, user
    simulator, messages), the token book, the turn count and the meta of every request so far."""

    episode: Episode
    system: dict
    buf: TokenBuffer
    asynchronous: bool  # the user's turns are awaited on the loop (user_client.py)
    turns: int = 0
    turn_meta: list[dict] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each request's sampled ids
    clock: Clock = field(default_factory=Clock)
    open_turn: list[int] | None = None  # ids of a turn the abort cut mid-way (maybe none yet): continued on resume
    resumes: int = 0

    def mask_earlier(self) -> None:
        """Out of the loss: every response token so far (slime's --mask-offpolicy-in-partial-rollout, which masks
        a returned sample's earlier response: it was sampled by older weights)."""
        self.buf.loss_mask = (0,) * len(self.buf.loss_mask)
