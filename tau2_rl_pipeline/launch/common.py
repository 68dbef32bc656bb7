"""What every stage shares: the paths, the GPU layout, the cluster, the model preset and the TAU2_* settings.

`read_common` reads them in the order the stage scripts always have (so the first bad value is the one named),
fills in the preset's defaults for the training world (a variable set in the environment wins), and says once per
run what a recipe departs from. Its `exports` are what the scripts and every program they start see.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from tau2_rl_pipeline.config import DEFAULT_USER_TEMPERATURE, ConfigError, Tau2Config, unknown_variable_warnings
from tau2_rl_pipeline.launch.cluster import Cluster, read_cluster
from tau2_rl_pipeline.launch.machine import Machine
from tau2_rl_pipeline.launch.recipe import starts_from
from tau2_rl_pipeline.launch.settings import GpuLayout, Paths, Reader, Refused, read_gpu_layout, read_paths
from tau2_rl_pipeline.scale.presets import defaults, recipe_notes
from tau2_rl_pipeline.scale.sizing import model_args_from_file

LOSS_MASK_TYPES = ("qwen", "qwen3", "qwen3_5", "distill_qwen")
USER_SIM_HF_ID = "Qwen/Qwen3-4B-Instruct-2507"  # the user simulator and the judge, whatever MODEL trains
MAX_TURNS = next(f.default for f in fields(Tau2Config) if f.name == "max_turns")


@dataclass
class Common:
    r: Reader
    machine: Machine
    paths: Paths
    gpus: GpuLayout
    cluster: Cluster
    preset: dict[str, str]  # the preset's values for this world, the environment's where it set them
    model_args_script: str
    base_hf: str
    base_torch_dist: str
    user_model: str
    user_api_base: str
    exports: dict[str, str] = field(default_factory=dict)

    def default(self, name: str, fallback: object) -> str:
        """A stage default the recipe (RECIPE=...) may set: the preset's value, else `fallback`."""
        return self.preset.get(name, str(fallback))

    def value(self, name: str) -> str:
        """A preset-governed setting: the environment's if set, else the preset's."""
        return self.r.get(name, self.preset[name])

    def renew_preset(self, world: int) -> None:
        """The preset's layout for another training world (asynchronous GRPO's training GPUs alone)."""
        self.preset = preset_for(self.r, world)
        self.exports.update({k: self.value(k) for k in self.preset})

    @property
    def model_args(self) -> list[str]:
        if not self.machine.is_file(self.model_args_script):
            raise Refused(f"model args script not found: {self.model_args_script}")
        with open(self.model_args_script, encoding="utf-8") as f:
            return model_args_from_file(f.read())

    def start_of(self, stage: str) -> str:
        """The torch_dist checkpoint `stage` starts from by the recipe's stage graph (its INIT_DIR default)."""
        p = self.paths
        return {"base": self.base_torch_dist, "sft": p.sft_ckpt, "rft": p.rft_ckpt}[starts_from(stage)]

    @property
    def max_turns(self) -> int:
        return int(self.r.get("TAU2_MAX_TURNS", self.preset.get("TAU2_MAX_TURNS", str(MAX_TURNS))))

    def tau2_environment(self) -> dict[str, str]:
        """Every TAU2_* variable the stage's programs see: the user's and the ones the scripts set."""
        env = {k: v for k, v in self.r.environ.items() if k.startswith("TAU2_")}
        env.update({k: v for k, v in self.exports.items() if k.startswith("TAU2_")})
        return env


def start_hint(stage: str) -> str:
    """What a missing start of `stage` is, and the script that makes it (the dry run's warning, the run's refusal)."""
    start = starts_from(stage)
    made_by = "convert_hf_to_megatron.sh" if start == "base" else f"train_{start}.sh"
    return f"initial torch_dist checkpoint (scripts/{made_by})"


def preset_for(r: Reader, world: int) -> dict[str, str]:
    try:
        return defaults(r.get("MODEL"), r.get("RECIPE"), world)
    except ValueError as exc:
        raise Refused(str(exc)) from None


def check_settings(r: Reader, environ: dict[str, str]) -> None:
    """The TAU2_* settings as every Ray worker will read them (Tau2Config): a warning for each unknown name (with the
    closest known one), a refusal naming a bad value's variable. Once per run (a script another runs is quiet)."""
    if r.get("STAGE_SETTINGS_CHECKED"):
        return
    unknown = set()
    for line in unknown_variable_warnings(environ):
        unknown.add(line.split()[1])
        r.note(line)
    try:
        Tau2Config.from_env({k: v for k, v in environ.items() if k not in unknown})
    except ConfigError as exc:
        raise Refused(str(exc)) from None


def read_common(r: Reader, machine: Machine, root: str) -> Common:
    paths = read_paths(r, root)
    r.choice("LOSS_MASK_TYPE", "qwen3", LOSS_MASK_TYPES)
    user_model = r.get("TAU2_USER_MODEL", "openai/Qwen/Qwen3-4B-Instruct-2507")
    user_api_base = r.environ.get("TAU2_USER_API_BASE", "http://127.0.0.1:30001/v1")  # empty: the provider's
    exports = {"TAU2_OUT_DIR": paths.out, "TAU2_USER_MODEL": user_model, "TAU2_USER_API_BASE": user_api_base,
               "TAU2_USER_TEMPERATURE": r.number("TAU2_USER_TEMPERATURE", str(DEFAULT_USER_TEMPERATURE))}
    r.uint("POLICY_PORT", 30000)
    gpus = read_gpu_layout(r)
    exports["TAU2_GPU_LAYOUT"] = gpus.name
    cluster = read_cluster(r, gpus, machine)
    # Loopback traffic (Ray's job API, SGLang) and the nodes' must not go through a proxy.
    hosts = ",".join(filter(None, ["127.0.0.1,localhost", r.get("no_proxy"), cluster.master, *cluster.workers]))
    exports["no_proxy"] = ",".join(dict.fromkeys(hosts.split(",")))  # each once (a stage another script runs)
    if not cluster.master:
        cluster = replace(cluster, master="127.0.0.1")
    r.flag("SIZING_FORCE")
    check_settings(r, {**r.environ, **exports})
    preset = preset_for(r, cluster.nodes * cluster.gpus_per_node)
    for line in recipe_notes(r.get("RECIPE")):
        r.note(line)
    models = paths.models
    c = Common(r=r, machine=machine, paths=paths, gpus=gpus, cluster=cluster, preset=preset,
               model_args_script=r.path("MODEL_ARGS_SCRIPT", f"{root}/scripts/models/{preset['MODEL_FILE']}"),
               base_hf=r.path("BASE_HF_DIR", f"{models}/{preset['MODEL_DIR_NAME']}"),
               base_torch_dist=r.path("BASE_TORCH_DIST_DIR", f"{models}/{preset['MODEL_DIR_NAME']}_torch_dist"),
               user_model=user_model, user_api_base=user_api_base, exports=exports)
    c.exports.update({k: c.value(k) for k in preset})
    for name in ("TRAIN_TP", "TRAIN_PP", "TRAIN_CP", "TRAIN_EP", "ROLLOUT_GPUS_PER_ENGINE"):
        r.uint(name, c.value(name))
    r.flag("CPU_ADAM", c.value("CPU_ADAM"))
    tp = int(c.value("TRAIN_TP"))
    if gpus.num_policy % tp:
        raise Refused(f"TRAIN_TP={tp} does not divide the {gpus.num_policy} policy GPUs ({gpus.policy})")
    if r.get("HOST_MEM_GB"):
        r.number("HOST_MEM_GB")
    return c


def shared_exports(c: Common) -> dict[str, str]:
    """What every stage script exports to the programs it starts (and what the scripts without a plan of their own,
    the servers, converters and download, read): the paths, the layout, the cluster, the preset's values."""
    p, r, k = c.paths, c.r, c.cluster
    env = {"SLIME_DIR": p.slime, "MEGATRON_DIR": p.megatron, "PYTHON": r.get("PYTHON", "python3"),
           "MODEL_DIR": p.models, "DATA_DIR": p.data, "CKPT_DIR": p.ckpts, "LOG_DIR": p.logs,
           "DOMAINS": r.get("DOMAINS", "airline,retail,telecom"), "TASKS_DIR": p.tasks, "SEED_DATA": p.seed_data,
           "RFT_DATA": p.rft_data, "RFT_EPISODES": p.rft_episodes, "GRPO_TASKS": p.grpo_tasks,
           "SFT_CKPT_DIR": p.sft_ckpt, "SFT_HF_DIR": p.sft_hf, "RFT_CKPT_DIR": p.rft_ckpt, "GRPO_CKPT_DIR": p.grpo_ckpt,
           "GRPO_HF_DIR": p.grpo_hf, "LOSS_MASK_TYPE": r.get("LOSS_MASK_TYPE", "qwen3"),
           "POLICY_PORT": r.get("POLICY_PORT", "30000"), "POLICY_GPUS": c.gpus.policy, "USER_SIM_GPUS": c.gpus.user_sim,
           "USER_SIM_TP": str(c.gpus.user_sim_tp), "NUM_POLICY_GPUS": str(c.gpus.num_policy),
           "NUM_USER_SIM_GPUS": str(c.gpus.num_user_sim), "NUM_NODES": str(k.nodes),
           "GPUS_PER_NODE": str(k.gpus_per_node), "MODEL_ARGS_SCRIPT": c.model_args_script, "BASE_HF_DIR": c.base_hf,
           "BASE_TORCH_DIST_DIR": c.base_torch_dist, "USER_SIM_HF_ID": r.get("USER_SIM_HF_ID", USER_SIM_HF_ID),
           "RAY_DASHBOARD_PORT": str(k.dashboard_port), "RAY_GCS_PORT": str(k.gcs_port), "MASTER_ADDR": k.master,
           "RECIPE": r.get("RECIPE"), **k.network}
    env["USER_SIM_HF_DIR"] = user_sim_hf(c)
    env.update(c.exports)
    env["NO_PROXY"] = env["no_proxy"]
    return env


def user_sim_hf(c: Common) -> str:
    """The user simulator's (and the judge's) model directory: Qwen3-4B-Instruct-2507 whatever MODEL trains."""
    hf_id = c.r.get("USER_SIM_HF_ID", USER_SIM_HF_ID)
    return c.r.path("USER_SIM_HF_DIR", f"{c.paths.models}/{hf_id.split('/')[-1]}")
