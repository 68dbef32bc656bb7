"""The plans of the servers and tools around the slime stages.

The user simulator, the judge and the policy behind
SGLang, SGLang's router, the two checkpoint converters and the download (scripts/start_*.sh, convert_*.sh,
download.sh: each script's header says what its variables mean)."""

from __future__ import annotations

import re

from tau2_rl_pipeline.launch.common import USER_SIM_HF_ID, Common, user_sim_hf
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.settings import Refused
from tau2_rl_pipeline.launch.stages import need_dir, need_file, need_gpus, need_port_free, need_servers, sizing
from tau2_rl_pipeline.scale.sizing import Layout


def served_endpoint(c: Common, base_var: str, model_var: str, example: str, what: str) -> tuple[int, str]:
    """A model server this repository starts for a client of its own: the client's api base must be a local
    http://host:port/v1 and its model openai/<served name>, so the server is where the client looks. (port, name)"""
    base, model = c.r.environ.get(base_var, c.exports.get(base_var, "")), c.r.get(model_var, c.exports.get(model_var, ""))
    if not base:
        raise Refused(f"{base_var} is empty: set {base_var}={example} and {model_var}=openai/<served name> to serve a "
                      f"local {what} here (empty means a provider's {what}: nothing to serve)")
    if "," in base:
        raise Refused(f"{base_var}={base} lists several servers: start each one with {base_var} set to its own URL")
    m = re.fullmatch(r"http://[^/:]+:([0-9]+)/v1/?", base)
    if not m:
        raise Refused(f"{base_var}={base} must look like {example}")
    if not model.startswith("openai/") or model == "openai/":
        raise Refused(f"{model_var}={model} must be openai/<served name> for the {what} client to use this server")
    return int(m[1]), model.removeprefix("openai/")


def sglang(c: Common, plan: StagePlan, gpus: str, model: str, host: str, port: int, tp: int, dp: int, mem: str,
           *extra: str) -> None:
    """An SGLang server in the foreground on `gpus` (the policy, user-simulator and judge servers differ only here)."""
    plan.add("run", "env", f"CUDA_VISIBLE_DEVICES={gpus}", c.r.get("PYTHON", "python3"), "-m", "sglang.launch_server",
             "--model-path", model, "--host", host, "--port", str(port), "--tp-size", str(tp), "--dp-size", str(dp),
             "--mem-fraction-static", mem, *extra)


def user_sim(c: Common, plan: StagePlan) -> None:
    r, gpus = c.r, c.gpus
    model = r.get("USER_SIM_MODEL_PATH", user_sim_hf(c))
    port, name = served_endpoint(c, "TAU2_USER_API_BASE", "TAU2_USER_MODEL", "http://127.0.0.1:30001/v1",
                                 "user simulator")
    mem = r.number("USER_SIM_MEM_FRACTION", "0.85")
    dp = gpus.num_user_sim // gpus.user_sim_tp
    need_file(c, f"{model}/config.json", "user simulator model (scripts/download.sh)")
    need_port_free(c, port, "user simulator")
    need_gpus(c, gpus.user_sim, "user simulator")
    r.note(f"layout {gpus.name}: user simulator on GPUs {gpus.user_sim} (TP{gpus.user_sim_tp} x DP{dp})")
    sglang(c, plan, gpus.user_sim, model, r.get("USER_SIM_HOST", "127.0.0.1"), port, gpus.user_sim_tp, dp, mem,
           "--served-model-name", name, "--tool-call-parser", r.get("USER_SIM_TOOL_PARSER", "qwen25"))


def judge(c: Common, plan: StagePlan) -> None:
    r = c.r
    model = r.get("JUDGE_MODEL_PATH", user_sim_hf(c))
    gpus = r.get("JUDGE_GPUS", c.gpus.user_sim)
    port, name = served_endpoint(c, "TAU2_JUDGE_API_BASE", "TAU2_JUDGE_MODEL", "http://127.0.0.1:30002/v1", "judge")
    mem, tp = r.number("JUDGE_MEM_FRACTION", "0.4"), r.uint("JUDGE_TP", 1)
    dp = len(gpus.split(",")) // tp
    if dp < 1:
        raise Refused(f"JUDGE_TP={tp} is more than the judge GPUs ({gpus})")
    need_file(c, f"{model}/config.json", "judge model")
    need_port_free(c, port, "judge")
    need_gpus(c, gpus, "judge")
    r.note(f"judge server: {model} served as {name} on GPUs {gpus} (TP{tp} x DP{dp}), port {port}")
    sglang(c, plan, gpus, model, r.get("JUDGE_HOST", "127.0.0.1"), port, tp, dp, mem, "--served-model-name", name)


def policy_server(c: Common, plan: StagePlan) -> None:
    """The SFT policy behind SGLang on the policy GPUs, for the RFT sampling (the preset's engine size)."""
    r, gpus = c.r, c.gpus
    model = r.get("POLICY_MODEL_PATH", c.paths.sft_hf)
    tp = r.uint("POLICY_TP", c.value("ROLLOUT_GPUS_PER_ENGINE"))
    mem = r.number("POLICY_MEM_FRACTION", "0.7")
    if gpus.num_policy % tp:
        raise Refused(f"POLICY_TP={tp} does not divide the {gpus.num_policy} policy GPUs ({gpus.policy})")
    need_file(c, f"{model}/config.json", "policy model (scripts/convert_megatron_to_hf.sh)")
    port = r.uint("POLICY_PORT", 30000)
    need_port_free(c, port, "policy server")
    need_gpus(c, gpus.policy, "policy server")
    sizing(c, plan, "policy-server", Layout(nodes=1, gpus_per_node=gpus.num_policy, rollout_gpus=gpus.num_policy,
                                            engine_gpus=tp, mem_fraction=float(mem), train=False))
    r.note(f"layout {gpus.name}: policy server on GPUs {gpus.policy} (TP{tp} x DP{gpus.num_policy // tp})")
    sglang(c, plan, gpus.policy, model, r.get("POLICY_HOST", "127.0.0.1"), port, tp, gpus.num_policy // tp, mem)


def router(c: Common, plan: StagePlan) -> None:
    r = c.r
    urls = [u for u in r.get("ROUTER_WORKER_URLS").split(",") if u]
    if not urls:
        raise Refused("ROUTER_WORKER_URLS is empty: list the SGLang servers to route to, comma-separated "
                      "(http://host:port,...)")
    for url in urls:
        if not re.fullmatch(r"https?://[^/]+:[0-9]+/?", url):
            raise Refused(f"ROUTER_WORKER_URLS: '{url}' is not http://host:port (a server's root, without /v1)")
    port, metrics = r.uint("ROUTER_PORT", 30100), r.uint("ROUTER_METRICS_PORT", 29000)
    policy = r.choice("ROUTER_POLICY", "cache_aware", ("cache_aware", "round_robin", "power_of_two", "random"))
    need_port_free(c, port, "router")
    need_port_free(c, metrics, "router metrics (ROUTER_METRICS_PORT; another router on this node?)")
    for url in urls:
        need_servers(c, url, "/health", "SGLang server behind the router")
    host = r.get("ROUTER_HOST", "127.0.0.1")
    r.note(f"router on {host}:{port} ({policy}) in front of {len(urls)} server(s)")
    # exec: a signal to the script (Ctrl-C, a supervisor's SIGTERM) reaches the router itself.
    plan.add("exec", r.get("PYTHON", "python3"), "-m", "sglang_router.launch_router", "--host", host, "--port",
             str(port), "--prometheus-port", str(metrics), "--policy", policy, "--worker-urls", *urls)


def convert_hf(c: Common, plan: StagePlan) -> None:
    r, p = c.r, c.paths
    args = c.model_args
    hf, out = r.path("CONVERT_HF_DIR", c.base_hf), r.path("CONVERT_OUT_DIR", c.base_torch_dist)
    gpu = r.get("CONVERT_GPU", c.gpus.policy.split(",")[0])
    need_file(c, f"{hf}/config.json", "Hugging Face model (scripts/download.sh)")
    need_file(c, f"{p.slime}/tools/convert_hf_to_torch_dist.py", "slime's converter (SLIME_DIR)")
    need_dir(c, p.megatron, "Megatron-LM (MEGATRON_DIR)")
    if c.machine.exists(f"{out}/latest_checkpointed_iteration.txt"):
        raise Refused(f"{out} already holds a checkpoint; remove it to convert again")
    need_gpus(c, gpu, "conversion")
    plan.add("cd", p.slime)
    plan.add("run", "env", f"CUDA_VISIBLE_DEVICES={gpu}", f"PYTHONPATH={p.megatron}:{p.slime}",
             r.get("PYTHON", "python3"), f"{p.slime}/tools/convert_hf_to_torch_dist.py", *args,
             "--hf-checkpoint", hf, "--save", out)


def convert_megatron(c: Common, plan: StagePlan) -> None:
    r, p = c.r, c.paths
    ckpt, out = r.path("CKPT_IN", p.sft_ckpt), r.path("HF_OUT", p.sft_hf)
    origin, it = r.path("ORIGIN_HF_DIR", c.base_hf), r.get("ITER")
    tracker = f"{ckpt}/latest_checkpointed_iteration.txt"
    if not it and c.machine.is_file(tracker):
        with open(tracker, encoding="utf-8") as f:
            it = "".join(f.read().split())
    if not it:
        if not r.dry:
            raise Refused(f"no checkpoint in {ckpt} ({tracker} missing); set CKPT_IN or ITER")
        r.note(f"warning: {tracker} not there yet; the dry run shows iter_LATEST")
        it_dir = f"{ckpt}/iter_LATEST"
    else:
        if it == "release":  # what slime's convert_hf_to_torch_dist.py writes
            it_dir = f"{ckpt}/release"
        elif re.fullmatch(r"[0-9]+", it):
            it_dir = f"{ckpt}/iter_{int(it):07d}"  # Megatron's directory naming
        else:
            raise Refused(f"ITER={it} must be an iteration number or release")
        need_dir(c, it_dir, "checkpoint iteration")
    need_file(c, f"{origin}/config.json", "base model (scripts/download.sh)")
    need_file(c, f"{p.slime}/tools/convert_torch_dist_to_hf.py", "slime's converter (SLIME_DIR)")
    if c.machine.exists(f"{out}/config.json"):
        raise Refused(f"{out} already holds a model; remove it to export again")
    plan.add("cd", p.slime)
    plan.add("run", "env", f"PYTHONPATH={p.megatron}:{p.slime}", r.get("PYTHON", "python3"),
             f"{p.slime}/tools/convert_torch_dist_to_hf.py", "--input-dir", it_dir, "--output-dir", out,
             "--origin-hf-dir", origin)


def download(c: Common, plan: StagePlan) -> None:
    r, p = c.r, c.paths
    cli = r.get("HF_CLI", "hf")
    source = r.choice("SEED_SOURCE", "hub", ("hub", "oracle"))
    if r.get("HF_HUB_OFFLINE", "0") == "1":
        r.problem("HF_HUB_OFFLINE=1 switches downloads off")
    if not r.dry and not c.machine.has_tool(cli):
        raise Refused(f"{cli} not found on PATH (the Hugging Face CLI from huggingface_hub; set HF_CLI to another)")
    plan.add("run", cli, "download", c.exports["HF_MODEL_ID"], "--local-dir", c.base_hf)
    if user_sim_hf(c) != c.base_hf:
        plan.add("run", cli, "download", r.get("USER_SIM_HF_ID", USER_SIM_HF_ID), "--local-dir", user_sim_hf(c))
    plan.add("cd", p.root)
    python = r.get("PYTHON", "python3")
    if source == "hub":
        plan.add("run", python, "-m", "tau2_rl_pipeline.learning.sft_data", "seed", "--dataset",
                 r.get("SEED_DATASET", "Jarrodbarnes/tau2-sft-seed-v3"), "--out", p.seed_data)
    else:
        plan.add("run", python, "-m", "tau2_rl_pipeline.learning.sft_data", "oracle", "--domains",
                 r.get("DOMAINS", "airline,retail,telecom"), "--split", "train", "--out", p.seed_data)
