"""tau2 as a gymnasium environment, for users who drive an episode step by step with text in and text out.

The token-in/token-out rollout (rollout/episode_loop.py) drives `Episode` directly; this wrapper is the same
episode behind gymnasium's reset/step, with tau2's task reward when it ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gymnasium as gym
from tau2.data_model.tasks import Task
from tau2.environment.environment import Environment

from tau2_rl_pipeline.benchmark.episode import Episode, build_environment
from tau2_rl_pipeline.benchmark.prompting import to_agent_chat
from tau2_rl_pipeline.benchmark.tau2_version import DEFAULT_RETRIEVAL_VARIANT, BaseUser


class Tau2GymEnv(gym.Env):
    """A tau2 episode gym-style: the action is the policy's completion text; the observation is the text of
    what the agent sees next; the reward is tau2's task reward, given when the episode ends.

    `user_factory(task, environment) -> BaseUser` builds the user side per episode (see `users.py`);
    `retrieval_variant`: banking_knowledge's (tau2 1.0.1), as TAU2_RETRIEVAL_VARIANT.
    """

    metadata = {"render_modes": []}

    def __init__(self, domain: str, tasks: Sequence[Task], user_factory: Callable[[Task, Environment], BaseUser],
                 *, max_steps: int = 200, max_errors: int = 10, max_turns: int = 30, fast: bool = True,
                 retrieval_variant: str = DEFAULT_RETRIEVAL_VARIANT):
        self.domain = domain
        self.retrieval_variant = retrieval_variant
        self.tasks = list(tasks)
        self.user_factory = user_factory
        self.max_steps, self.max_errors, self.max_turns = max_steps, max_errors, max_turns
        self.fast = fast
        self.observation_space = gym.spaces.Text(max_length=1 << 20)
        self.action_space = gym.spaces.Text(max_length=1 << 20)
        self.episode: Episode | None = None
        self._turns = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            task = next((t for t in self.tasks if t.id == options["task_id"]), None)
            if task is None:
                raise ValueError(f"unknown task id {options['task_id']!r} for {self.domain}")
        else:
            task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        environment = build_environment(self.domain, self.fast, task=task, retrieval_variant=self.retrieval_variant)
        self.episode = Episode(self.domain, task, self.user_factory(task, environment),
                               max_steps=self.max_steps, max_errors=self.max_errors, environment=environment,
                               retrieval_variant=self.retrieval_variant,
                               fast=self.fast)
        self._turns = 0
        view = self.episode.start()
        info = {"task_id": task.id, "system_prompt": self.episode.system_prompt, "tools": self.episode.tools}
        return _chat_text(view), info

    def step(self, action: str):
        if self.episode is None:
            raise RuntimeError("call reset() first")
        self._turns += 1
        result = self.episode.act(action)
        truncated = not result.done and self._turns >= self.max_turns
        reward, info = 0.0, {"turns": self._turns}
        if result.done or truncated:
            reward_info = self.episode.evaluate()
            reward = float(reward_info.reward)
            info["reward_info"] = reward_info
            info["termination_reason"] = (
                self.episode.termination_reason.value if self.episode.termination_reason else "max_turns")
        return _chat_text(to_agent_chat(result.observations)), reward, result.done, truncated, info


def _chat_text(chat: list[dict]) -> str:
    return "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in chat)
