"""The slime pipeline's stage graph: the stages in order, what each runs and the outputs that mark it done.

A stage whose outputs all exist is skipped (delete them to redo it), so an interrupted run picks up where it
stopped; a training stage resumes from its own last checkpoint, and its marker (`.stage_done`) is written only once
it has succeeded. The user simulator is started (in the background) for rft_data and grpo unless one answers at
TAU2_USER_API_BASE already; what the pipeline starts, it stops.
"""

from __future__ import annotations

from dataclasses import dataclass

from tau2_rl_pipeline.launch.common import Common
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.settings import Refused

DONE_MARKER = ".stage_done"


@dataclass(frozen=True)
class GraphStage:
    name: str
    outputs: tuple[str, ...]


def stages(c: Common) -> list[GraphStage]:
    p = c.paths
    return [GraphStage("download", (f"{c.base_hf}/config.json", p.seed_data)),
            GraphStage("convert", (f"{c.base_torch_dist}/latest_checkpointed_iteration.txt",)),
            GraphStage("tasks", (f"{p.tasks}/tau2_train_all_tasks.jsonl", f"{p.tasks}/tau2_test_all_tasks.jsonl")),
            GraphStage("sft", (f"{p.sft_ckpt}/{DONE_MARKER}",)),
            GraphStage("sft_hf", (f"{p.sft_hf}/config.json",)),
            GraphStage("rft_data", (p.rft_data,)),
            GraphStage("rft", (f"{p.rft_ckpt}/{DONE_MARKER}",)),
            GraphStage("grpo_tasks", (p.grpo_tasks,)),
            GraphStage("grpo", (f"{p.grpo_ckpt}/{DONE_MARKER}",)),
            GraphStage("grpo_hf", (f"{p.grpo_hf}/config.json",))]


def pipeline(c: Common, plan: StagePlan) -> None:
    r, p = c.r, c.paths
    timeout = r.uint("SERVER_START_TIMEOUT", 900)
    plan.variables["SERVER_START_TIMEOUT"] = [str(timeout)]
    plan.exports["STAGE_SETTINGS_CHECKED"] = "1"  # the stage scripts need not say it again
    scripts, python = f"{p.root}/scripts", r.get("PYTHON", "python3")
    if not r.dry and not c.machine.has_tool("curl"):
        raise Refused("curl not found on PATH (to wait for the servers the pipeline starts)")
    r.note(f"layout {c.gpus.name}: policy GPUs {c.gpus.policy}, user simulator GPUs {c.gpus.user_sim}; outputs in {p.out}")
    user_sim = [False]

    def ensure_user_sim() -> None:
        if user_sim[0]:
            return
        user_sim[0] = True
        if not c.user_api_base:
            plan.add("note", f"TAU2_USER_API_BASE is empty: user simulator {c.user_model} at its provider; nothing to start")
            return
        url = c.user_api_base.rstrip("/") + "/models"
        if not r.dry and c.machine.answers(url):
            plan.add("note", f"user simulator already answers at {url}; using it (and leaving it running)")
            return
        plan.add("server", "user_sim", url, "bash", f"{scripts}/start_user_sim.sh")

    def convert(ckpt: str, hf: str) -> None:
        plan.add("stage", "env", f"CKPT_IN={ckpt}", f"HF_OUT={hf}", "bash", f"{scripts}/convert_megatron_to_hf.sh")

    run = {
        "download": lambda: plan.add("stage", "bash", f"{scripts}/download.sh"),
        "convert": lambda: plan.add("stage", "bash", f"{scripts}/convert_hf_to_megatron.sh"),
        "tasks": lambda: (plan.add("cd", p.root), plan.add(
            "run", python, "-m", "tau2_rl_pipeline.benchmark.tasks", "--local_dir", p.tasks, "--domains",
            r.get("DOMAINS", "airline,retail,telecom"), "--splits", "train,test")),
        "sft": lambda: plan.add("stage", "bash", f"{scripts}/train_sft.sh"),
        "sft_hf": lambda: convert(p.sft_ckpt, p.sft_hf),
        "rft_data": lambda: (ensure_user_sim(), plan.add(
            "server", "policy", f"http://127.0.0.1:{r.get('POLICY_PORT', '30000')}/health", "env",
            f"POLICY_MODEL_PATH={p.sft_hf}", "bash", f"{scripts}/start_policy_server.sh"),
            plan.add("stage", "bash", f"{scripts}/generate_rft.sh"), plan.add("stop_server", "policy")),
        "rft": lambda: plan.add("stage", "bash", f"{scripts}/train_rft.sh"),
        "grpo_tasks": lambda: (plan.add("need", p.rft_episodes,
                                        "the RFT stage's episode file (scripts/generate_rft.sh) not found: "
                                        f"{p.rft_episodes}"), plan.add("cd", p.root), plan.add(
            "run", python, "-m", "tau2_rl_pipeline.selection.difficulty", "--episodes", p.rft_episodes, "--tasks",
            f"{p.tasks}/tau2_train_all_tasks.jsonl", "--out", p.grpo_tasks)),
        "grpo": lambda: (ensure_user_sim(), plan.add(
            "stage", "env", f"GRPO_PROMPT_DATA={r.get('GRPO_PROMPT_DATA', p.grpo_tasks)}", "bash",
            f"{scripts}/train_grpo.sh")),
        "grpo_hf": lambda: convert(p.grpo_ckpt, p.grpo_hf),
    }
    graph = stages(c)
    for i, stage in enumerate(graph, 1):
        outputs = " ".join(stage.outputs)
        if all(c.machine.exists(o) for o in stage.outputs):
            plan.add("header", f"==> stage {i}/{len(graph)} {stage.name}: skipped, output exists: {outputs}")
            continue
        plan.add("header", f"==> stage {i}/{len(graph)} {stage.name}: running, output: {outputs}")
        run[stage.name]()
        if not r.dry:
            plan.add("done", stage.name, *stage.outputs)
