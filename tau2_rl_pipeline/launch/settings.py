"""The stage scripts' variables read as typed settings, each bad value refused in one line naming its variable.

Every default is the scripts' `${VAR:-default}`: a variable set (non-empty) in the environment wins. Paths are made
absolute from the directory the script was started in (the scripts change into slime's root before running slime).
A dry run only warns about what the machine lacks today (inputs earlier stages have not written, a busy port); a
real run refuses it (`Reader.problem`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class Refused(Exception):
    """A setting or the machine's state that stops the stage before anything starts: one line, naming the cause."""


@dataclass
class Reader:
    """The environment, read the way the scripts read it; the notes a stage prints on the way (stderr lines)."""

    environ: Mapping[str, str]
    start_dir: str
    dry: bool = False
    notes: list[str] = field(default_factory=list)

    def get(self, name: str, default: str = "") -> str:
        return self.environ.get(name) or default

    def note(self, line: str) -> None:
        self.notes.append(line)

    def problem(self, line: str) -> None:
        """What the machine lacks now: a warning in a dry run, a refusal in a real one."""
        if not self.dry:
            raise Refused(line)
        self.note(f"warning: {line} (the dry run goes on)")

    def uint(self, name: str, default: str | int = "") -> int:
        return positive(name, self.get(name, str(default)))

    def number(self, name: str, default: str = "") -> str:
        value = self.get(name, default)
        if not re.fullmatch(r"[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?", value):
            raise Refused(f"{name}={value} must be a non-negative number")
        return value

    def flag(self, name: str, default: str = "0") -> bool:
        return switch(name, self.get(name, default))

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.get(name, default)
        if value not in choices:
            raise Refused(f"{name}={value} is not one of: {' '.join(choices)}")
        return value

    def path(self, name: str, default: str) -> str:
        return self.absolute(self.get(name, default))

    def absolute(self, path: str) -> str:
        return path if not path or path.startswith("/") else f"{self.start_dir}/{path}"


def positive(name: str, value: str) -> int:
    if not re.fullmatch(r"[1-9][0-9]*", value):
        raise Refused(f"{name}={value} must be a positive integer")
    return int(value)


def switch(name: str, value: str) -> bool:
    """A true/false setting as tau2_rl_pipeline.config reads it (1/true/yes/on, 0/false/no/off)."""
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise Refused(f"{name}={value} must be true or false (1/0, yes/no, on/off)")


# Names that hold credentials (WANDB_API_KEY, HF_TOKEN, ...): their values never reach a command line, a printed
# command or the Ray runtime env. Not MAX_TOKENS_PER_GPU: the word must end the name. (scripts/common.sh's
# quote_cmd masks the values in printed commands by the same rule.)
SECRET_NAME = re.compile(r"(^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$")

# TAU2_GPU_LAYOUT -> (policy GPUs, user-simulator GPUs) on each node.
GPU_LAYOUTS = {"8": ("0,1,2,3", "4,5,6,7"), "4": ("0,1", "2,3"), "2": ("0", "1")}


@dataclass(frozen=True)
class Paths:
    """Where the stages read and write (every one absolute); the base model's follow the preset (`model_paths`)."""

    root: str
    slime: str
    megatron: str
    out: str
    models: str
    data: str
    ckpts: str
    logs: str
    tasks: str
    seed_data: str
    rft_data: str
    rft_episodes: str
    grpo_tasks: str
    sft_ckpt: str
    sft_hf: str
    rft_ckpt: str
    grpo_ckpt: str
    grpo_hf: str


def read_paths(r: Reader, root: str) -> Paths:
    out = r.path("TAU2_OUT_DIR", f"{root}/outputs")
    models, data, ckpts = r.path("MODEL_DIR", f"{out}/models"), r.path("DATA_DIR", f"{out}/data"), \
        r.path("CKPT_DIR", f"{out}/checkpoints")
    tasks = r.path("TASKS_DIR", f"{data}/tasks")
    rft_data = r.path("RFT_DATA", f"{data}/sft_seed_plus_rft.jsonl")
    return Paths(root=root, slime=r.path("SLIME_DIR", "/root/slime"), megatron=r.path("MEGATRON_DIR", "/root/Megatron-LM"),
                 out=out, models=models, data=data, ckpts=ckpts, logs=r.path("LOG_DIR", f"{out}/logs"), tasks=tasks,
                 seed_data=r.path("SEED_DATA", f"{data}/sft_seed.jsonl"), rft_data=rft_data,
                 rft_episodes=r.get("RFT_EPISODES", f"{rft_data}.eval.json.episodes.jsonl"),
                 grpo_tasks=r.get("GRPO_TASKS", f"{tasks}/tau2_train_grpo_tasks.jsonl"),
                 sft_ckpt=r.path("SFT_CKPT_DIR", f"{ckpts}/sft"), sft_hf=r.path("SFT_HF_DIR", f"{models}/sft_hf"),
                 rft_ckpt=r.path("RFT_CKPT_DIR", f"{ckpts}/rft"), grpo_ckpt=r.path("GRPO_CKPT_DIR", f"{ckpts}/grpo"),
                 grpo_hf=r.path("GRPO_HF_DIR", f"{models}/grpo_hf"))


@dataclass(frozen=True)
class GpuLayout:
    """Which GPUs of a node train and serve the policy, and which serve the user simulator."""

    name: str
    policy: str
    user_sim: str
    user_sim_tp: int

    @property
    def num_policy(self) -> int:
        return len(self.policy.split(","))

    @property
    def num_user_sim(self) -> int:
        return len(self.user_sim.split(","))


def read_gpu_layout(r: Reader) -> GpuLayout:
    name = r.get("TAU2_GPU_LAYOUT", "8")
    if name not in GPU_LAYOUTS:
        raise Refused(f"TAU2_GPU_LAYOUT={name} is not one of: 8, 4, 2")
    policy, user_sim = (r.get(n, d) for n, d in zip(("POLICY_GPUS", "USER_SIM_GPUS"), GPU_LAYOUTS[name]))
    for var, value in (("POLICY_GPUS", policy), ("USER_SIM_GPUS", user_sim)):
        if not re.fullmatch(r"[0-9]+(,[0-9]+)*", value):
            raise Refused(f"{var}={value} must be comma-separated GPU ids, e.g. 0,1")
    tp = r.uint("USER_SIM_TP", 1)
    for gpu in policy.split(","):
        if gpu in user_sim.split(","):
            raise Refused(f"GPU {gpu} is in both POLICY_GPUS={policy} and USER_SIM_GPUS={user_sim}")
    lay = GpuLayout(name, policy, user_sim, tp)
    if lay.num_user_sim % tp:
        raise Refused(f"USER_SIM_TP={tp} does not divide the {lay.num_user_sim} user-simulator GPUs ({user_sim})")
    return lay


def script_root() -> str:
    return str(Path(__file__).resolve().parents[2])
