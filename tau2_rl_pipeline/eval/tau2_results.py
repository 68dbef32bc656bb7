"""The evaluator's episodes as tau2's own `Results` files, one per domain.

Written so that tau2's tooling opens them: `tau2 view`, `tau2.metrics.agent_metrics.compute_metrics`, and `tau2
evaluate-trajs` (which re-scores each simulation from its messages).

What differs from a `tau2 run` file, and why:
- Each simulation's messages are the evaluator's view (refused calls left out, `env.without_refused_calls`):
  the full trajectory is in the episode log, and a refused call, never executed, cannot be replayed.
- Truncated episodes (max_turns, max_new_tokens, context length) have no tau2 termination reason; they were
  scored as tau2 scores MAX_STEPS (0), and are written as max_steps.
- Aborted episodes (infrastructure failures) are left out: tau2 has no such outcome. The summary lists them.
- `trial` is our sample index; `seed` the per-episode sampling seed.
- A top-level `benchmark` key (tau2 version, task-set hash; tau2's loader ignores keys it does not know) says
  which tau2 graded the file.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tau2.data_model.simulation import AgentInfo, Info, Results, SimulationRun, TerminationReason, UserInfo
from tau2.data_model.tasks import Task
from tau2.user.user_simulator import get_global_user_sim_guidelines

from tau2_rl_pipeline.benchmark.episode import without_refused_calls
from tau2_rl_pipeline.benchmark.tau2_version import DEFAULT_RETRIEVAL_VARIANT, env_kwargs, retrieval_info

AGENT_IMPLEMENTATION = "tau2_rl_pipeline.rollout.episode_loop"  # what tau2's Info.agent_info.implementation names
_REASONS = {r.value for r in TerminationReason}


def termination_for_tau2(reason: str) -> TerminationReason:
    """tau2's reason for ours: the same one when tau2 has it, else MAX_STEPS (how the episode was scored)."""
    return TerminationReason(reason) if reason in _REASONS else TerminationReason.MAX_STEPS


def simulation_run(record: Mapping[str, Any]) -> SimulationRun:
    """One finished (not aborted) episode record as a tau2 SimulationRun."""
    if record["status"] == "aborted":
        raise ValueError(f"episode {record['task_id']}#{record['sample']} was aborted: tau2 has no such outcome")
    run = SimulationRun.model_validate({
        "id": f"{record['domain']}/{record['task_id']}/sample-{record['sample']}",
        "task_id": record["task_id"],
        "start_time": record["started_at"],
        "end_time": record["ended_at"],
        "duration": record["timings"].get("total_s", 0.0),
        "termination_reason": termination_for_tau2(record["termination_reason"]),
        "reward_info": record["reward_info"],
        "messages": record["messages"],
        "trial": record["sample"],
        "seed": record["seed"],
    })
    return run.model_copy(update={"messages": without_refused_calls(run.messages, record["refused_call_ids"])})


def project_commit() -> str:
    """The git commit of this checkout (the evaluator's code), or "unknown" outside a git checkout."""
    repo = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def results_info(domain: str, settings: Mapping[str, Any], num_trials: int) -> Info:
    """tau2's Info block: who played agent and user with which settings, and the domain's environment (for
    banking_knowledge, built with the run's retrieval variant, which Info records as tau2's runner does)."""
    from tau2.run import get_environment_info

    variant = (settings.get("benchmark") or {}).get("retrieval_variant", DEFAULT_RETRIEVAL_VARIANT)
    by_variant = env_kwargs(domain, None, variant)
    sampling = settings["sampling"]
    llm_user = settings["user"] == "llm"
    return Info(
        git_commit=project_commit(), num_trials=num_trials, max_steps=settings["max_steps"],
        max_errors=settings["max_errors"], seed=settings["seed"],
        user_info=UserInfo(implementation="user_simulator" if llm_user else "scripted_user",
                           llm=settings["user_model"], llm_args=settings["user_llm_args"],
                           global_simulation_guidelines=get_global_user_sim_guidelines() if llm_user else None),
        agent_info=AgentInfo(implementation=AGENT_IMPLEMENTATION, llm=settings["model"],
                             llm_args={k: sampling[k] for k in ("temperature", "top_p", "top_k", "max_new_tokens")}),
        environment_info=get_environment_info(domain, **({"env_kwargs": by_variant} if by_variant else {})),
        **retrieval_info(domain, variant))


def results_json(results: Results, benchmark: Mapping[str, str]) -> str:
    """The Results file's text, with the `benchmark` that produced it."""
    return json.dumps({**results.model_dump(mode="json"), "benchmark": dict(benchmark)}, indent=2)


def tau2_results(domain: str, records: Sequence[Mapping[str, Any]], tasks: Sequence[Task], info: Info) -> Results:
    """A tau2 Results file body for one domain: its tasks and its finished episodes, in (task, sample) order."""
    finished = sorted((r for r in records if r["domain"] == domain and r["status"] != "aborted"),
                      key=lambda r: (r["task_id"], r["sample"]))
    return Results(info=info, tasks=list(tasks), simulations=[simulation_run(r) for r in finished])
