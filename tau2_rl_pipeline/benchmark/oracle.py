"""Gold-action replays: the check that the episode and tau2's evaluator agree.

Gold-action replays through the episode core: the check that the episode, its tool boundary and tau2's
evaluator agree (every test task's oracle replay scores 1.0), and the source of offline demonstrations.

    python -m tau2_rl_pipeline.benchmark.oracle --domain airline --split test     # prints a table of oracle rewards
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from tau2.data_model.simulation import RewardInfo, TerminationReason
from tau2.data_model.tasks import Action, Task
from tau2.environment.toolkit import ToolType

from tau2_rl_pipeline.benchmark.episode import Episode, build_environment


def gold_actions(task: Task) -> list[Action]:
    criteria = task.evaluation_criteria
    return list(criteria.actions or []) if criteria else []


def final_message(task: Task) -> str:
    """The agent's closing message: the task's communicate info, which tau2 checks for verbatim."""
    info = task.evaluation_criteria.communicate_info if task.evaluation_criteria else None
    return " ".join(info) if info else "Your request has been completed."


def last_write_index(domain: str, task: Task) -> int | None:
    """Index of the last state-changing gold action, or None when the task has none."""
    env = build_environment(domain, task=task)
    last = None
    for i, action in enumerate(gold_actions(task)):
        toolkit = env.user_tools if action.requestor == "user" else env.tools
        if toolkit is not None and toolkit.has_tool(action.name) and toolkit.tool_type(action.name) == ToolType.WRITE:
            last = i
    return last


def replay_episode(domain: str, task: Task, *, keep: Callable[[int, Action], bool] | None = None,
                   fast: bool = False) -> Episode:
    """Replay the gold actions (agent ones as agent tool calls, user ones as user tool calls), then the final
    agent message, on a fresh episode that ends with an agent stop (`fast`: on fast_env's environments)."""
    episode = Episode(domain, task, user=None, fast=fast)
    episode.start()
    for i, action in enumerate(gold_actions(task)):
        if keep is not None and not keep(i, action):
            continue
        call = episode.user_tool_call if action.requestor == "user" else episode.agent_tool_call
        call(action.name, action.arguments)
    episode.agent_says(final_message(task))
    episode.stop(TerminationReason.AGENT_STOP)
    return episode


def replay_gold_actions(domain: str, task: Task, *, keep: Callable[[int, Action], bool] | None = None,
                        fast: bool = False) -> RewardInfo:
    return replay_episode(domain, task, keep=keep, fast=fast).evaluate()


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    from tau2_rl_pipeline.benchmark.tasks import TaskLookupError, load_tasks

    parser = argparse.ArgumentParser(description="Replay gold actions and score them with tau2's evaluator.")
    parser.add_argument("--domain", default="mock")
    parser.add_argument("--split", default=None, help="default: test (mock: base)")
    args = parser.parse_args(argv)
    split = args.split or ("base" if args.domain == "mock" else "test")
    try:
        tasks = load_tasks(args.domain, split)
    except TaskLookupError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    table = Table(title=f"oracle replay: {args.domain}/{split}")
    for col in ("task", "gold actions", "reward", "without last write"):
        table.add_column(col)
    full = 0
    for task in track(tasks, description="replaying"):
        reward = replay_gold_actions(args.domain, task).reward
        full += reward == 1.0
        last = last_write_index(args.domain, task)
        dropped = "-" if last is None else f"{replay_gold_actions(args.domain, task, keep=lambda i, _, last=last: i != last).reward:.1f}"
        table.add_row(task.id, str(len(gold_actions(task))), f"{reward:.1f}", dropped)
    console = Console()
    console.print(table)
    console.print(f"{full}/{len(tasks)} tasks score 1.0 on the oracle replay")
    return 0 if full == len(tasks) else 1


if __name__ == "__main__":
    sys.exit(main())
