"""MAX_RESTARTS in the plan: a training stage on a hostfile cluster reruns itself under the supervisor.

The supervisor (tau2_rl_pipeline/cluster/restarts.py) runs the same stage script again from its checkpoint after a
node fault (the watch's exit status), at most MAX_RESTARTS times; it sets STAGE_RESTARTS for the stage it runs, so
the rerun is planned as usual and not supervised twice. A dry run prints the supervisor's command and goes on.
"""

from __future__ import annotations

import os
import re

from tau2_rl_pipeline.launch.common import Common
from tau2_rl_pipeline.launch.plan import StagePlan, Step
from tau2_rl_pipeline.launch.settings import Refused

SUPERVISED = ("sft", "rft", "grpo")  # the stages that run slime's job on the cluster the scripts start


def supervise(c: Common, plan: StagePlan) -> None:
    """Put the supervisor's re-exec first in `plan` when MAX_RESTARTS asks for it; refuse what it cannot restart."""
    r, k = c.r, c.cluster
    raw = r.get("MAX_RESTARTS", "0")
    if not re.fullmatch(r"[0-9]+", raw):
        raise Refused(f"MAX_RESTARTS={raw} must be a whole number of restarts (0: off)")
    restarts = int(raw)
    wait = r.uint("RESTART_WAIT_TIMEOUT", 1800)
    if restarts == 0 or r.get("STAGE_RESTARTS") or plan.stage not in SUPERVISED:
        return
    if k.joined:
        raise Refused(f"MAX_RESTARTS={restarts} restarts a stage on a cluster the scripts start (HOSTFILE); a cluster "
                      "joined with RAY_ADDRESS restarts jobs by its own manager (Slurm: --requeue)")
    if not k.workers:
        r.note(f"MAX_RESTARTS={restarts}: one node, no node fault to restart after (it applies with HOSTFILE)")
        return
    root = c.paths.root
    cmd = ["env", f"PYTHONPATH={root}" + (f":{r.get('PYTHONPATH')}" if r.get("PYTHONPATH") else ""),
           "python3", "-m", "tau2_rl_pipeline.cluster.restarts", "--prog", plan.prog, "--max-restarts", str(restarts),
           "--wait-timeout", str(wait), "--workers", ",".join(k.workers), "--ssh", " ".join(k.ssh),
           "--head", f"{k.master}:{k.gcs_port}", "--dashboard-port", str(k.dashboard_port),
           "--", "bash", os.path.join(root, "scripts", plan.prog)]
    plan.steps.insert(0, Step("supervise", tuple(cmd)))
