"""The slime pipeline as scripts/pipeline.sh runs it, read from the planner's plan of it (so a picture cannot drift).

The pipeline's plan (tau2_rl_pipeline/launch) holds a header per stage (`==> stage 4/9 sft: running, output: ...`)
and the steps it runs, each stage script's own plan included: the commands `DRY_RUN=1 bash scripts/pipeline.sh`
prints. From those commands this module recovers, per stage: the stage scripts it runs, the programs they start,
the files it writes and which earlier stage's files it reads, the servers it talks to, and on which GPUs each
server runs. Reading is pure
(commands in, `Plan` out; `parse_plan` reads the printed dry run the same way); `dry_run_plan` plans in a clean
environment with an empty output directory, so every stage runs and nothing of the caller's settings leaks in.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tau2_rl_pipeline.launch.build import plan_stage
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.settings import GPU_LAYOUTS

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
PIPELINE = SCRIPTS / "pipeline.sh"
# Output files that stand for their directory (a checkpoint, a model): the directory is what later stages read.
DIRECTORY_MARKERS = {".stage_done", "config.json", "latest_checkpointed_iteration.txt"}
# Programs of this package that run tau2 episodes, and so talk to the user simulator (TAU2_USER_API_BASE).
EPISODE_RUNNERS = ("tau2_rl_pipeline.selection.rft", "tau2_rl_pipeline.eval.eval_passk", "tau2_rl_pipeline.slime_plugins.adapter.generate")
USER_SIM_SCRIPT = "start_user_sim.sh"
SERVER_NAMES = {USER_SIM_SCRIPT: "user simulator", "start_policy_server.sh": "policy server"}
HEADER = re.compile(r"^==> stage (\d+)/(\d+) (\w+): running, output: (.*)$")


@dataclass
class Server:
    """A long-running process a stage talks to: an SGLang server, or slime's Ray job (trainer + rollout engines)."""

    key: str
    name: str
    kind: str  # "sglang" or "slime"
    gpus: tuple[int, ...]
    port: int | None = None
    tp: int = 1
    dp: int = 1
    jobs: dict[str, str] = field(default_factory=dict)  # slime: entry point -> what it runs there


@dataclass
class Stage:
    number: int
    name: str
    scripts: list[str]  # stage scripts (basenames), in the order they run
    programs: list[str]  # what those scripts start: python modules, slime tools and entry points
    outputs: list[str]  # paths relative to the output directory ("models/sft_hf/": a directory)
    reads: list[tuple[str, int]]  # (path, the number of the earlier stage that wrote it)
    servers: list[str]  # Server keys


@dataclass
class Plan:
    layout: str
    stages: list[Stage]
    servers: dict[str, Server]

    def stage_scripts(self) -> set[str]:
        return {s for stage in self.stages for s in stage.scripts}


def _gpus(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _env_and_argv(cmd: list[str]) -> tuple[dict[str, str], list[str]]:
    """`env A=1 B=2 prog args` -> ({A: 1, B: 2}, [prog, args]); other commands have no assignments."""
    env: dict[str, str] = {}
    i = 0
    if cmd and cmd[0] == "setsid":
        i = 1
    if i < len(cmd) and cmd[i] == "env":
        i += 1
        while i < len(cmd) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", cmd[i]):
            name, value = cmd[i].split("=", 1)
            env[name] = value
            i += 1
    return env, cmd[i:]


def _flag(argv: list[str], name: str) -> str | None:
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return None


def _artifact(path: str) -> str:
    p = Path(path)
    return f"{p.parent}/" if p.name in DIRECTORY_MARKERS else str(p)


def _mentions(token: str, artifact: str) -> bool:
    value = token.split("=", 1)[1] if re.match(r"^-*[A-Za-z_][A-Za-z0-9_-]*=", token) else token
    if artifact.endswith("/"):
        return value == artifact[:-1] or value.startswith(artifact)
    return value == artifact


def _rel(path: str, out_dir: str) -> str:
    return path[len(out_dir) + 1:] if path.startswith(out_dir + "/") else path


class _StageReader:
    """One stage's commands, read one by one: the stage scripts, the programs and the servers they name."""

    def __init__(self, servers: dict[str, Server]) -> None:
        self.servers = servers  # shared by all stages: a server started in one stage is used by later ones
        self.scripts: list[str] = []
        self.programs: list[str] = []
        self.used: list[str] = []
        self.ray_gpus: tuple[int, ...] = ()

    def read(self, cmd: list[str]) -> None:
        env, argv = _env_and_argv(cmd)
        if not argv:
            return
        for tok in argv:
            if tok.endswith(".sh") and Path(tok).parent == SCRIPTS and Path(tok).name not in self.scripts:
                self.scripts.append(Path(tok).name)
        if any(tok in EPISODE_RUNNERS for tok in argv):
            self.used.append(USER_SIM_SCRIPT.removesuffix(".sh"))
        module = _flag(argv, "-m")
        if module == "sglang.launch_server":
            self._sglang(env, argv)
        elif module and module.split(".")[0] == "tau2_rl_pipeline":
            self.programs.append(f"python -m {module}")
        elif argv[:2] == ["ray", "start"]:
            self.ray_gpus = _gpus(env.get("CUDA_VISIBLE_DEVICES", "0"))
        elif argv[:3] == ["ray", "job", "submit"] and "--" in argv:
            self._slime_job(argv[argv.index("--") + 1:])
        elif len(argv) > 1 and argv[1].endswith(".py"):  # one of slime's tools (the converters)
            gpus = env.get("CUDA_VISIBLE_DEVICES")
            self.programs.append(f"slime {Path(argv[1]).name}" + (f" (GPU {gpus})" if gpus else ""))
        for server in self.servers.values():  # a server named by its address (not in the Ray job's env dump)
            if server.port and any(f"127.0.0.1:{server.port}" in tok for tok in argv
                                   if not tok.startswith("--runtime-env-json")):
                self.used.append(server.key)

    def _sglang(self, env: dict[str, str], argv: list[str]) -> None:
        launcher = self.scripts[-1] if self.scripts else "sglang"
        key = launcher.removesuffix(".sh")
        self.servers[key] = Server(key, SERVER_NAMES.get(launcher, launcher), "sglang",
                                   _gpus(env.get("CUDA_VISIBLE_DEVICES", "0")), int(_flag(argv, "--port") or 0),
                                   int(_flag(argv, "--tp-size") or 1), int(_flag(argv, "--dp-size") or 1))
        self.used.append(key)

    def _slime_job(self, job: list[str]) -> None:
        entry = Path(job[1]).name
        n_gpus = int(_flag(job, "--actor-num-gpus-per-node") or 1)
        tp = int(_flag(job, "--tensor-model-parallel-size") or 1)
        slime = self.servers.setdefault("slime", Server("slime", "Ray + slime", "slime", self.ray_gpus, tp=tp,
                                                        dp=n_gpus // tp))
        what = "training only" if "--debug-train-only" in job else "training"
        if "--colocate" in job:
            engines = n_gpus // int(_flag(job, "--rollout-num-gpus-per-engine") or 1)
            what += f" + {engines} colocated SGLang rollout engines"
        slime.jobs.setdefault(entry, what)
        self.programs.append(f"slime {entry}")
        self.used.append("slime")


def parse_plan(stdout: str, out_dir: str, layout: str = "8") -> Plan:
    """Read a pipeline dry run's printed stdout (out_dir: the TAU2_OUT_DIR it ran with) into a Plan."""
    blocks: list[tuple[str, list[list[str]]]] = []
    for line in stdout.splitlines():
        if HEADER.match(line):
            blocks.append((line, []))
        elif line.startswith("+ ") and blocks:
            blocks[-1][1].append(shlex.split(line[2:]))
    return read_blocks(blocks, out_dir, layout)


def read_blocks(blocks: list[tuple[str, list[list[str]]]], out_dir: str, layout: str = "8") -> Plan:
    """A Plan from each stage's header and the commands it runs."""
    out_dir = out_dir.rstrip("/")
    if not blocks:
        raise ValueError("no stage headers in the dry run's output (is it scripts/pipeline.sh?)")
    servers: dict[str, Server] = {}
    stages: list[Stage] = []
    written: list[tuple[str, int]] = []  # (absolute artifact, stage number), in stage order
    for line, commands in blocks:
        header = HEADER.match(line)
        assert header is not None
        number, name = int(header.group(1)), header.group(3)
        outputs = list(dict.fromkeys(_artifact(o) for o in header.group(4).split()))
        reader = _StageReader(servers)
        for cmd in commands:
            reader.read(cmd)
        tokens = [tok for cmd in commands for tok in cmd]
        reads = [(_rel(art, out_dir), by) for art, by in written
                 if art not in outputs and any(_mentions(tok, art) for tok in tokens)]
        written.extend((art, number) for art in outputs)
        stages.append(Stage(number, name, reader.scripts, list(dict.fromkeys(reader.programs)),
                            [_rel(a, out_dir) for a in outputs], reads, list(dict.fromkeys(reader.used))))
    for stage in stages:  # a server named by an episode runner but never started here is not drawn
        stage.servers = [k for k in stage.servers if k in servers]
    return Plan(layout, stages, servers)


def step_commands(plan: StagePlan, env: dict[str, str], start_dir: str) -> list[list[str]]:
    """The commands a stage plan runs, a stage script's own plan's after the command that runs it."""
    out: list[list[str]] = []
    for step in plan.steps:
        if step.verb in ("stage", "server"):
            cmd = list(step.args if step.verb == "stage" else step.args[2:])
            out.append(cmd if step.verb == "stage" else ["setsid", *cmd])
            assigned, argv = _env_and_argv(cmd)
            script = Path(argv[-1]).name
            child = plan_stage(SCRIPT_STAGES[script], script, {**env, **plan.exports, **assigned}, start_dir)
            out += step_commands(child, env, start_dir)
        elif step.verb == "cd":
            out.append(["cd", *step.args])
        elif step.verb == "check":
            out.append(list(step.args[step.args.index("--") + 1:]))
        elif step.verb == "worker":
            out.append(list(step.args[3:]))
        elif step.verb in ("run", "head", "job", "exec"):
            out.append(list(step.args))
    return out


# The stage scripts the pipeline runs, by the planner's stage names.
SCRIPT_STAGES = {"download.sh": "download", "convert_hf_to_megatron.sh": "convert_hf", "train_sft.sh": "sft",
                 "convert_megatron_to_hf.sh": "convert_megatron", "start_user_sim.sh": "user_sim",
                 "start_policy_server.sh": "policy_server", "generate_rft.sh": "rft_gen", "train_rft.sh": "rft",
                 "train_grpo.sh": "grpo"}


def dry_run_plan(layout: str = "8") -> Plan:
    """The pipeline's plan on GPU layout `layout`, from the planner's objects (what `DRY_RUN=1 bash
    scripts/pipeline.sh` prints) in a clean environment with an empty output directory: every stage runs."""
    with tempfile.TemporaryDirectory(prefix="tau2-plan-") as tmp:
        out_dir = os.path.join(tmp, "outputs")
        env = {"DRY_RUN": "1", "TAU2_OUT_DIR": out_dir, "TAU2_GPU_LAYOUT": layout}
        top = plan_stage("pipeline", "pipeline.sh", env, tmp)
        blocks: list[tuple[str, list[list[str]]]] = []
        for step in top.steps:
            if step.verb == "header":
                blocks.append((step.args[0], []))
            elif blocks:
                sub = StagePlan(top.stage, top.prog, steps=[step], exports=top.exports)
                blocks[-1][1].extend(step_commands(sub, env, tmp))
        return read_blocks(blocks, out_dir, layout)


def gpu_layouts() -> list[str]:
    """The GPU layouts the stage scripts accept (TAU2_GPU_LAYOUT), as the planner defines them."""
    return list(GPU_LAYOUTS)
