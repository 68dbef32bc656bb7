"""Oracle demonstrations: tau2's gold actions as SFT rows, built offline.

Oracle demonstrations: tau2's gold actions played as agent completions against the scripted user, kept as SFT
rows where the replay scores 1.0 (built offline, no model or API needed)."""

from __future__ import annotations

from dataclasses import dataclass

from tau2.data_model.tasks import Action, Task

from tau2_rl_pipeline.benchmark.actions import render_assistant_text
from tau2_rl_pipeline.benchmark.episode import Episode
from tau2_rl_pipeline.benchmark.oracle import final_message, gold_actions
from tau2_rl_pipeline.benchmark.tasks import load_tasks
from tau2_rl_pipeline.benchmark.users import ScriptedUser
from tau2_rl_pipeline.learning.sft_rows import sft_chat, sft_row


@dataclass
class OracleDemo:
    task_id: str
    reward: float
    row: dict | None  # None when the replay did not reach reward 1.0


def ask_user_text(actions: list[Action]) -> str:
    """The agent asking the user to do device steps, naming each action (what the scripted user listens for)."""
    steps = []
    for action in actions:
        args = ", ".join(f"{k}: {v}" for k, v in action.arguments.items())
        steps.append(action.name.replace("_", " ") + (f" ({args})" if args else ""))
    return f"Please do this on your phone: {', then '.join(steps)}."


def demo_turns(task: Task) -> list[str]:
    """The agent's completions of an oracle demonstration: each gold agent action as its own tool-call turn, each
    run of gold user actions as one request to the user, then the communicate info."""
    turns: list[str] = []
    asks: list[Action] = []
    for action in gold_actions(task):
        if action.requestor == "user":
            asks.append(action)
            continue
        if asks:
            turns.append(ask_user_text(asks))
            asks = []
        turns.append(render_assistant_text("", [(action.name, action.arguments)]))
    if asks:
        turns.append(ask_user_text(asks))
    turns.append(final_message(task))
    return turns


def play_turns(domain: str, task: Task, turns: list[str], fast: bool = True) -> Episode:
    """Play agent completions against the scripted user (it performs the device steps it is asked for), on
    fast_env's environments unless `fast` is off (the same rewards: tests/test_fast_env.py)."""
    episode = Episode(domain, task, ScriptedUser(task), fast=fast)
    episode.start()
    for text in turns:
        if episode.done:
            break
        episode.act(text)
    return episode


def oracle_demo(domain: str, task: Task, split: str) -> OracleDemo:
    episode = play_turns(domain, task, demo_turns(task))
    reward = float(episode.evaluate().reward)
    row = sft_row(domain, sft_chat(episode.messages), {"task_id": task.id, "source": "oracle", "split": split}) \
        if reward == 1.0 else None
    return OracleDemo(task.id, reward, row)


def oracle_demos(domain: str, split: str) -> list[OracleDemo]:
    return [oracle_demo(domain, task, split) for task in load_tasks(domain, split)]


def oracle_demonstrations(domain: str, split: str) -> list[dict]:
    """SFT rows of the tasks of a split whose oracle demonstration scores 1.0 (`oracle_demos` shows the others)."""
    return [d.row for d in oracle_demos(domain, split) if d.row is not None]
