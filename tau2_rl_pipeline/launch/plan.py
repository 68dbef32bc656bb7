"""The plan of one stage, as data: what the dry run prints, what the script runs, what the tests and pictures read.

`StagePlan.steps` are the runner's verbs (scripts/common.sh defines each: it runs, the plan decides): `cd DIR`,
`run CMD...`, `head CMD...` (the Ray head; the EXIT trap stops it), `worker IP DIR LEASH CMD...` (join a worker), `workers_wait`, `check TOKEN DIR... -- CMD...` (the cluster check), `job CMD...`
(slime's job, watched on a cluster started here), and for the pipeline `header`, `stage`, `server`, `stop_server`,
`need`, `done`, `note`. `to_bash` hands them over as shell words (shlex-quoted, so no value is ever re-parsed).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from tau2_rl_pipeline.launch.cluster import Cluster, Placement
from tau2_rl_pipeline.scale.sizing import Sheet


@dataclass(frozen=True)
class Step:
    verb: str
    args: tuple[str, ...] = ()


@dataclass
class StagePlan:
    """One stage, decided: its notes (stderr lines, before anything runs), its steps, and what they are made of."""

    stage: str
    prog: str
    notes: list[str] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    variables: dict[str, list[str]] = field(default_factory=dict)  # shell arrays the runner reads (WORKER_SSH, ...)
    exports: dict[str, str] = field(default_factory=dict)  # what the programs it starts see
    entry: str = ""  # slime's entry point: train.py or train_async.py
    argv: list[str] = field(default_factory=list)  # slime's argv
    runtime_env: dict[str, dict[str, str]] = field(default_factory=dict)
    cluster: Cluster | None = None
    placement: Placement | None = None
    sheet: Sheet | None = None

    def add(self, verb: str, *args: str) -> None:
        self.steps.append(Step(verb, tuple(args)))

    def to_bash(self) -> str:
        """The exports, the runner's variables and the steps, as lines of shell words for scripts/common.sh."""
        lines = [f"export {k}={shlex.quote(v)}" for k, v in self.exports.items()]
        lines += [f"{k}=({' '.join(map(shlex.quote, v))})" for k, v in self.variables.items()]
        lines += [" ".join(["step_" + s.verb, *map(shlex.quote, s.args)]) for s in self.steps]
        return "\n".join(lines) + "\n"
