"""One plan per slime stage, and the cluster around slime's job.

SFT and RFT (slime's train_async.py, training only), GRPO (train.py colocated, or
train_async.py on split GPUs; the PPO loss or AWSFT's), and RFT generation (the rejection sampler).

Each builder reads its stage's variables (the ones the scripts' headers document), refuses in one line what cannot
run, and lays down slime's argv and the steps around it: the cluster plan, the Ray head and workers, the cluster
check, the job. The rules are each written once: the off-policy rule is rollout/offpolicy.py's, the sizing sheet
scale/sizing.py's, slime's placement order scale/placement.py's, the defaults launch/recipe.py's and the presets'.
"""

from __future__ import annotations

import json
import os
import random
import re
import time

from tau2_rl_pipeline.launch.cluster import Placement, place, plan_lines
from tau2_rl_pipeline.launch.common import Common, start_hint
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.recipe import POLICY_LOSS, SLIME_SFT, spelled
from tau2_rl_pipeline.launch.settings import SECRET_NAME, Refused
from tau2_rl_pipeline.scale.sizing import GIB, RAY_MEMORY_THRESHOLD, Layout, Model, Work, gib, render, size

PLUGINS = "tau2_rl_pipeline.slime_plugins"
FULLY_ASYNC = f"{PLUGINS}.adapter.generate_rollout_fully_async"
AWSFT_LOSS = f"{PLUGINS}.awsft.awsft_loss_function"
USER_SIM_WHAT = "user simulator (start it with scripts/start_user_sim.sh)"


# ---- checks of inputs and servers ---------------------------------------------------------------------------------
def need_file(c: Common, path: str, what: str) -> None:
    if not c.machine.is_file(path):
        c.r.problem(f"{what} not found: {path}")


def need_dir(c: Common, path: str, what: str) -> None:
    if not c.machine.is_dir(path):
        c.r.problem(f"{what} not found: {path}")


def need_servers(c: Common, urls: str, suffix: str, what: str, in_ray: bool = False) -> None:
    """Each server of a URL list answers at URL+suffix; a client in the Ray job on several nodes may run on any
    node, where a loopback URL names another machine (unless the nodes are loopback addresses of this one)."""
    for url in filter(None, urls.split(",")):
        if (in_ray and c.cluster.nodes > 1 and not c.cluster.on_loopback
                and re.match(r"https?://(127\.[0-9.]+|localhost|\[::1\])(:|/|$)", url)):
            raise Refused(f"{what} at {url} is on loopback: on {c.cluster.nodes} nodes the rollout runs on any of them; "
                          "give an address every node reaches (a router's: scripts/start_router.sh)")
        full = url.rstrip("/") + suffix
        if c.r.dry:
            c.r.note(f"dry run: not checking that {what} answers at {full}")
        elif not c.machine.answers(full):
            raise Refused(f"{what} not reachable at {full}")


def need_user_sim(c: Common, in_ray: bool = False) -> None:
    if not c.user_api_base:
        c.r.note(f"TAU2_USER_API_BASE is empty: user simulator {c.user_model} at its provider's default endpoint")
        return
    need_servers(c, c.user_api_base, "/models", USER_SIM_WHAT, in_ray)


def need_gpus(c: Common, ids: str, what: str) -> None:
    if c.r.dry:
        c.r.note(f"dry run: not checking that GPUs {ids} ({what}) exist")
        return
    visible = c.machine.gpu_count()
    if visible is None:
        raise Refused(f"nvidia-smi not found: {what} needs GPUs {ids}")
    if max(int(i) for i in ids.split(",")) >= visible:
        raise Refused(f"{what} needs GPUs {ids} but nvidia-smi -L lists {visible} GPU(s)")


def need_port_free(c: Common, port: int, what: str) -> None:
    if c.machine.port_in_use(port):
        c.r.problem(f"port {port} ({what}) is already in use on 127.0.0.1")


# ---- the sizing sheet ---------------------------------------------------------------------------------------------
def sizing(c: Common, plan: StagePlan, stage: str, lay: Layout, work: Work | None = None) -> None:
    """The stage's sizing sheet into the notes; a layout that cannot fit refused (SIZING_FORCE=1: warned)."""
    model = Model.from_megatron_args(c.model_args)
    host_gb = c.r.get("HOST_MEM_GB")
    lay = Layout(**{**lay.__dict__, "host_mem": int(float(host_gb) * GIB) if host_gb else 0,
                    "node_gpus": c.cluster.gpus_per_node, "loss": "sft" if stage == "sft" else "grpo"})
    work = work or Work()
    sheet = size(model, lay, work)
    plan.sheet = sheet
    for line in render(c.value("MODEL"), lay, work, sheet):
        c.r.note(line)
    total = c.machine.mem_total() if not lay.host_mem and not c.r.dry else 0
    if total and sheet.host_per_node > RAY_MEMORY_THRESHOLD * total:
        c.r.note(f"warning: host memory: a node needs {gib(sheet.host_per_node)} GiB, over {RAY_MEMORY_THRESHOLD:.0%} "
                 f"of this machine's {gib(total)} GiB (Ray kills an actor past it); set HOST_MEM_GB to the nodes' "
                 "memory to refuse such a layout")
    if sheet.refusal is None:
        return
    if c.r.flag("SIZING_FORCE"):
        for refusal in sheet.refusals:
            c.r.note(f"warning: {refusal.line} (SIZING_FORCE=1: going on; {refusal.by}: {refusal.why})")
        return
    raise Refused(f"{sheet.refusal.line} (SIZING_FORCE=1 to try anyway)")


def train_layout(c: Common, p: Placement, max_tokens: int, **rollout: object) -> Layout:
    return Layout(nodes=p.actor_nodes, gpus_per_node=p.actor_gpus_per_node, tp=int(c.value("TRAIN_TP")),
                  pp=int(c.value("TRAIN_PP")), cp=int(c.value("TRAIN_CP")), ep=int(c.value("TRAIN_EP")),
                  cpu_adam=c.r.flag("CPU_ADAM", c.value("CPU_ADAM")), max_tokens_per_gpu=max_tokens,
                  engine_gpus=int(c.value("ROLLOUT_GPUS_PER_ENGINE")), **rollout)  # type: ignore[arg-type]


# ---- flag groups shared by SFT and GRPO ------------------------------------------------------------------------------
def resuming(c: Common, save: str) -> bool:
    """A run resumes when its save directory holds a checkpoint: Megatron's tracker, which slime's --load reads."""
    return c.machine.is_file(f"{save}/latest_checkpointed_iteration.txt")


def checkpoint_flags(c: Common, init: str, save: str) -> list[str]:
    """Fresh: INIT's weights only, at step 0 (not its optimizer or step count). Resumed: SAVE's checkpoint."""
    if resuming(c, save):
        c.r.note(f"resuming from {save}")
        return ["--load", save, "--save", save]
    return ["--load", init, "--finetune", "--no-load-optim", "--no-load-rng", "--start-rollout-id", "0", "--save", save]


def perf_flags(c: Common, tp: int, max_tokens: str) -> list[str]:
    out = ["--tensor-model-parallel-size", str(tp), *(["--sequence-parallel"] if tp > 1 else []),
           "--pipeline-model-parallel-size", c.value("TRAIN_PP"), "--context-parallel-size", c.value("TRAIN_CP"),
           "--expert-model-parallel-size", c.value("TRAIN_EP"), "--expert-tensor-parallel-size", "1",
           "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
           "--use-dynamic-batch-size", "--max-tokens-per-gpu", max_tokens]
    if c.r.flag("CPU_ADAM", c.value("CPU_ADAM")):  # optimizer states in host memory, as slime's scripts spell it
        out += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
    return out


# Megatron's dropout defaults to 0.1; fp32 reductions and softmax for stability (as slime's Qwen3 scripts do).
MISC_FLAGS = ["--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
              "--attention-softmax-in-fp32", "--attention-backend", "flash"]


def wandb_flags(c: Common, group: str) -> list[str]:
    """slime's wandb flags when WANDB_API_KEY is set; the key itself is never a flag (slime logs its arguments)."""
    if c.r.get("WANDB_API_KEY"):
        return ["--use-wandb", "--wandb-project", c.r.get("WANDB_PROJECT", "tau2-rl-pipeline"), "--wandb-group",
                c.r.get("WANDB_GROUP", group)]
    c.r.note("WANDB_API_KEY not set: no wandb logging")
    return []


def runtime_env(c: Common) -> dict[str, dict[str, str]]:
    """The Ray runtime env: slime's and Megatron's roots and this package on PYTHONPATH, every TAU2_* setting, the
    network settings as slime's multi-node scripts pass them (not SLIME_HOST_IP: each node has its own). No secret:
    it lands on the command line and in Ray's job table (workers inherit secrets from the Ray head's environment)."""
    p = c.paths
    env = {"PYTHONPATH": f"{p.slime}:{p.megatron}:{p.root}", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "PYTHONUNBUFFERED": "1"}
    for name, value in sorted(c.tau2_environment().items()):
        if SECRET_NAME.search(name):
            c.r.note(f"not putting {name} in the Ray runtime env (secret); workers inherit it from the Ray head")
        else:
            env[name] = value
    if c.r.get("WANDB_PROJECT"):
        env["WANDB_PROJECT"] = c.r.get("WANDB_PROJECT")
    env.update({"MASTER_ADDR": c.cluster.master, "no_proxy": c.exports["no_proxy"]})
    env.update({n: v for n, v in c.cluster.network.items() if n != "SLIME_HOST_IP"})
    for name, value in env.items():
        if re.search(r"[\x00-\x1f\x7f]", value) or re.search(r"[\x00-\x1f\x7f]", name):
            raise Refused(f"cannot pass a value with control characters to Ray: {value[:40]}...")
    return {"env_vars": env}


# ---- the cluster around slime's job ---------------------------------------------------------------------------------
def cluster_steps(c: Common, plan: StagePlan, p: Placement, written: str, reads: list[str]) -> None:
    """Print the plan; start the cluster (head, then workers) or join RAY_ADDRESS; check it; run the job there.
    `written`: the checkpoint directory every node must see; `reads`: the cluster check's --data/--checkpoint/
    --hf-model flags (what each node must see as the head has it)."""
    k, r, paths = c.cluster, c.r, c.paths
    for line in plan_lines(k, p, int(c.value("ROLLOUT_GPUS_PER_ENGINE")), c.user_api_base, c.gpus.user_sim):
        r.note(line)
    plan.add("cd", paths.slime)
    plan.variables["WORKER_SSH"] = list(k.ssh) if k.launch == "ssh" else []
    if not k.joined:
        if k.nodes > 1 and not r.dry:
            head_here(c)
        if not r.dry and k.launch == "ssh":  # each worker answers over ssh before anything starts
            for ip in k.workers:
                ok, last = c.machine.ssh_answers(list(k.ssh), ip)
                if not ok:
                    raise Refused(f"worker {ip} (HOSTFILE) is not reachable over ssh ({' '.join(k.ssh)}): {last}")
        need_port_free(c, k.gcs_port, "Ray GCS; a Ray head already running? stop it with: ray stop")
        need_port_free(c, k.dashboard_port, "Ray dashboard")
        need_gpus(c, c.gpus.policy, "policy (slime)")
        if not r.dry and not c.machine.has_tool("ray"):
            raise Refused("ray not found on PATH (Ray ships in the slime image)")
        temp = ["--temp-dir", k.temp_dir] if k.temp_dir else []
        plan.add("head", "env", f"CUDA_VISIBLE_DEVICES={c.gpus.policy}", "ray", "start", "--head", "--node-ip-address",
                 k.master, "--port", str(k.gcs_port), "--num-gpus", str(c.gpus.num_policy), "--disable-usage-stats",
                 "--dashboard-host", "127.0.0.1", "--dashboard-port", str(k.dashboard_port), *temp)
        for ip in k.workers:
            join = ["env", f"CUDA_VISIBLE_DEVICES={c.gpus.policy}", f"SLIME_HOST_IP={ip}",
                    *(f"{n}={v}" for n, v in k.network.items() if n != "SLIME_HOST_IP"),
                    "ray", "start", "--address", f"{k.master}:{k.gcs_port}", "--node-ip-address", ip, "--num-gpus",
                    str(k.gpus_per_node), "--disable-usage-stats",
                    *(["--temp-dir", f"{k.temp_dir}/node-{ip}"] if k.temp_dir else [])]
            plan.add("worker", ip, paths.slime, "1" if k.launch == "ssh" else "0", *join)
        if k.workers:
            plan.add("workers_wait")
    if k.nodes > 1:
        check_step(c, plan, written, reads)
    plan.runtime_env = runtime_env(c)
    python = c.r.get("PYTHON", "python3")
    watch = not k.joined and k.nodes > 1
    plan.variables["WATCH_CMD"] = ["env", f"PYTHONPATH={paths.root}", python, "-m", "tau2_rl_pipeline.cluster.watch",
                                   "--address", f"{k.master}:{k.gcs_port}", "--expect",
                                   ",".join((k.master, *k.workers))] if watch else []
    plan.add("job", "ray", "job", "submit", f"--address={k.jobs_api}",
             f"--runtime-env-json={json.dumps(plan.runtime_env, ensure_ascii=False)}", "--", python,
             f"{paths.slime}/{plan.entry}", *plan.argv)


def head_here(c: Common) -> None:
    """The head runs here: MASTER_ADDR and SLIME_HOST_IP must be addresses of this node (a 127.x one always is)."""
    own = c.machine.own_addresses()
    if not own:
        return
    for name in ("MASTER_ADDR", "SLIME_HOST_IP"):
        value = c.r.get(name)
        if value and not value.startswith("127.") and value not in own:
            raise Refused(f"{name}={value} is not an address of this node (it has: {' '.join(own)}): run the stage on "
                          "the head, MASTER_ADDR")


def check_step(c: Common, plan: StagePlan, written: str, reads: list[str]) -> None:
    """Before training: every node joined with its GPUs and interfaces, and sees the stage's paths as the head does
    (a check file with a fresh token in `written`; the data identical, the checkpoints and HF model complete)."""
    k = c.cluster
    token = f"{time.time_ns()}-{os.getpid()}-{random.randrange(32768)}"
    check = ["-m", "tau2_rl_pipeline.cluster.check", "--nodes", str(k.nodes), "--gpus-per-node", str(k.gpus_per_node),
             "--timeout", str(k.join_timeout), *(x for s in k.interfaces for x in ("--interface", s)),
             "--token", f"{written}/.tau2-shared-check={token}", *reads]
    python = c.r.get("PYTHON", "python3")
    if k.joined:
        cmd = ["ray", "job", "submit", f"--address={k.jobs_api}",
               f"--runtime-env-json={json.dumps(runtime_env(c), ensure_ascii=False)}", "--", python, *check]
    else:
        cmd = ["env", f"PYTHONPATH={c.paths.root}", python, *check, "--address", f"{k.master}:{k.gcs_port}",
               "--expect", ",".join((k.master, *k.workers))]
    plan.add("check", f"{c.paths.logs}/cluster_check.log", token, written, "--", *cmd)


def loaded(c: Common, init: str, save: str) -> str:
    """The checkpoint the actor loads (slime's --load): SAVE on a resume, else INIT."""
    return save if resuming(c, save) else init


def extra_flags(c: Common) -> list[str]:
    return c.r.get("EXTRA_SLIME_ARGS").split()


# ---- SFT and RFT -----------------------------------------------------------------------------------------------------
def sft(c: Common, plan: StagePlan, rft: bool = False) -> None:
    r, paths = c.r, c.paths
    args = c.model_args
    short = c.value("MODEL_SHORT")
    if rft:
        data, init, save = paths.rft_data, r.get("RFT_INIT_DIR", c.start_of("rft")), paths.rft_ckpt
        group = r.get("RFT_WANDB_GROUP", f"rft-{short}")
    else:
        data, init = r.get("SFT_DATA", paths.seed_data), r.get("SFT_INIT_DIR", c.start_of("sft"))
        save, group = r.get("SFT_SAVE_DIR", paths.sft_ckpt), r.get("SFT_WANDB_GROUP", f"sft-{short}")
    d = SLIME_SFT
    epochs, batch = r.uint("SFT_EPOCHS", d.epochs), r.uint("SFT_BATCH_SIZE", c.value("SFT_BATCH_SIZE"))
    save_interval, max_tokens = r.uint("SFT_SAVE_INTERVAL", d.save_interval), r.uint("SFT_MAX_TOKENS_PER_GPU",
                                                                                      c.value("SFT_MAX_TOKENS_PER_GPU"))
    lr, min_lr = r.number("SFT_LR", c.value("SFT_LR")), r.number("SFT_MIN_LR", c.value("SFT_MIN_LR"))
    warmup = r.number("SFT_WARMUP_FRACTION", spelled(d.warmup_fraction))
    decay = r.number("SFT_WEIGHT_DECAY", spelled(d.weight_decay))
    p = place(c.cluster, "train")
    tp = int(c.value("TRAIN_TP"))
    dp = p.actor_gpus // (tp * int(c.value("TRAIN_PP")) * int(c.value("TRAIN_CP")))
    if batch % dp:
        raise Refused(f"SFT_BATCH_SIZE={batch} is not a multiple of the data-parallel size {dp}")
    need_file(c, data, "SFT data (scripts/download.sh, or generate_rft.sh for RFT)")
    need_dir(c, init, start_hint("rft" if rft else "sft"))
    need_file(c, f"{c.base_hf}/config.json", "base model (scripts/download.sh)")
    need_dir(c, paths.slime, "slime (SLIME_DIR)")
    sizing(c, plan, "sft", train_layout(c, p, max_tokens))
    r.note(f"layout {c.gpus.name}: training on GPUs {c.gpus.policy} of {c.cluster.nodes} node(s) (TP{tp} x DP{dp})")
    ckpt = ["--hf-checkpoint", c.base_hf, *checkpoint_flags(c, init, save), "--save-interval", str(save_interval)]
    sft_args = ["--rollout-function-path", f"{PLUGINS}.sft.generate_rollout", "--prompt-data", data,
                "--input-key", "messages", "--tool-key", "tools", "--loss-mask-type", r.get("LOSS_MASK_TYPE", "qwen3"),
                "--rollout-shuffle", "--num-epoch", str(epochs), "--rollout-batch-size", str(batch),
                "--global-batch-size", str(batch), "--loss-type", "sft_loss", "--calculate-per-token-loss",
                "--disable-compute-advantages-and-returns", "--debug-train-only"]
    optimizer = ["--optimizer", "adam", "--lr", lr, "--lr-decay-style", "cosine", "--min-lr", min_lr,
                 "--lr-warmup-fraction", warmup, "--weight-decay", decay, *adam_betas()]
    perf = perf_flags(c, tp, str(max_tokens))
    wandb = wandb_flags(c, group)
    plan.entry, plan.placement = "train_async.py", p
    plan.argv = [*p.flags(), *args, *ckpt, *sft_args, *optimizer, *perf, *MISC_FLAGS, *wandb, *extra_flags(c)]
    cluster_steps(c, plan, p, save, ["--data", data, "--checkpoint", loaded(c, init, save), "--hf-model", c.base_hf])


def adam_betas() -> list[str]:
    return ["--adam-beta1", spelled(POLICY_LOSS.betas[0]), "--adam-beta2", spelled(POLICY_LOSS.betas[1])]


# ---- RFT generation -----------------------------------------------------------------------------------------------------
def rft_gen(c: Common, plan: StagePlan) -> None:
    """Rejection sampling: each train task RFT_NUM_SAMPLES times with the served SFT policy against the user
    simulator; the successful trajectories (else a task's best partial one), merged with the seed data."""
    r, paths = c.r, c.paths
    url = r.get("RFT_POLICY_URL", f"http://127.0.0.1:{r.get('POLICY_PORT', '30000')}")
    samples, temperature = r.uint("RFT_NUM_SAMPLES", 8), r.number("RFT_TEMPERATURE", "0.8")
    served = r.get("RFT_HF_CHECKPOINT", r.get("POLICY_MODEL_PATH", paths.sft_hf))  # its tokenizer makes the tokens
    need_file(c, paths.seed_data, "seed SFT data (scripts/download.sh)")
    need_file(c, f"{served}/config.json", "the served policy checkpoint (RFT_HF_CHECKPOINT)")
    need_servers(c, url, "/health", "policy server (scripts/start_policy_server.sh)")
    need_user_sim(c)
    plan.add("cd", paths.root)
    plan.add("run", r.get("PYTHON", "python3"), "-m", "tau2_rl_pipeline.selection.rft", "--sglang-url", url,
             "--hf-checkpoint", served, "--domains", r.get("DOMAINS", "airline,retail,telecom"), "--num-samples",
             str(samples), "--temperature", temperature, "--out", paths.rft_data, "--merge-with", paths.seed_data)

