"""`plan_stage`: the plan of a stage by its name, from an environment (the scripts', or a test's) and a machine."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tau2_rl_pipeline.launch.common import Common, read_common, shared_exports
from tau2_rl_pipeline.launch.graph import pipeline
from tau2_rl_pipeline.launch.grpo import grpo
from tau2_rl_pipeline.launch.machine import Machine
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.restarts import supervise
from tau2_rl_pipeline.launch.servers import (
    convert_hf,
    convert_megatron,
    download,
    judge,
    policy_server,
    router,
    user_sim,
)
from tau2_rl_pipeline.launch.settings import Reader, Refused, script_root
from tau2_rl_pipeline.launch.stages import rft_gen, sft


def _rft(c: Common, plan: StagePlan) -> None:
    sft(c, plan, rft=True)


STAGES: dict[str, Callable[[Common, StagePlan], None]] = {
    "sft": sft, "rft": _rft, "grpo": grpo, "rft_gen": rft_gen, "policy_server": policy_server,
    "pipeline": pipeline, "user_sim": user_sim, "judge": judge, "router": router, "convert_hf": convert_hf,
    "convert_megatron": convert_megatron, "download": download,
}


def plan_stage(stage: str, prog: str, environ: Mapping[str, str], start_dir: str, machine: Machine | None = None,
               notes: list[str] | None = None) -> StagePlan:
    """The plan of `stage` as script `prog` runs it; Refused (one line) if it cannot run. `notes` collects the notes
    said before a refusal too."""
    dry = environ.get("DRY_RUN") or "0"
    if dry not in ("0", "1"):
        raise Refused(f"DRY_RUN={dry} must be 0 or 1")
    r = Reader(environ, start_dir, dry=dry == "1", notes=notes if notes is not None else [])
    c = read_common(r, machine or Machine(), script_root())
    plan = StagePlan(stage, prog, notes=r.notes, cluster=c.cluster)
    STAGES[stage](c, plan)
    supervise(c, plan)
    plan.exports = {**shared_exports(c), "STAGE_SETTINGS_CHECKED": "1", **plan.exports}
    plan.variables.update({"RAY_HEAD_LOST_TIMEOUT": [str(c.cluster.head_lost_timeout)],
                           "WORKER_LAUNCH": [c.cluster.launch]})
    return plan
