"""Every model preset x layout x node count: the stage scripts' dry-run argv through slime's and Megatron's real
parsers and validation (parse_argv.py, one process for all), and the sizing sheet's refusals held to its word.

Accepted: the SFT and sync GRPO dry runs of each preset on 1, 2 and 4 nodes (4 policy GPUs a node, the default
split) and the 1.7B trial on 1 and 2 GPUs parse with no error and no unknown flag, into the layout the preset
names. Refused: a layout the sheet refuses stops the script in one line; forced through (SIZING_FORCE=1), its argv
meets the parsers, which refuse it too where the sheet says "parsers" and accept it where the sheet says why they
cannot see it (memory, a placement rule, SGLang's own check at start).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_scripts import run_script
from test_stage_argv import program_of

from tau2_rl_pipeline.scale.presets import PRESETS, layout_for

HERE = Path(__file__).resolve().parent
# Several nodes need the scripts' cluster placement (scripts/cluster.sh: NUM_NODES, RAY_ADDRESS, ...).
MULTI_NODE = (HERE.parents[1] / "scripts" / "cluster.sh").is_file()
NODE_COUNTS = (1, 2, 4)
PER_NODE = 4  # TAU2_GPU_LAYOUT=8: 4 policy GPUs a node


def multi_node_env(nodes: int) -> dict[str, str]:
    """A dry run on `nodes` nodes: a cluster that is already up (scripts/cluster.sh's joined-cluster path, with the
    interfaces it asks for and a user simulator every node reaches)."""
    return {} if nodes == 1 else {"NUM_NODES": str(nodes), "RAY_ADDRESS": "http://10.0.0.1:8265",
                                  "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
                                  "TAU2_USER_API_BASE": "http://10.0.0.1:30100/v1"}


def async_world(nodes: int) -> int:
    """Asynchronous GRPO's training GPUs: half of one node's policy GPUs, or half the nodes (whole nodes)."""
    return PER_NODE // 2 if nodes == 1 else nodes // 2 * PER_NODE


def accepted() -> dict[str, tuple[str, dict[str, str], int]]:
    """name -> (script, environment, training world size)."""
    out = {}
    for model in PRESETS:
        for nodes in NODE_COUNTS:
            env = {"MODEL": model, **multi_node_env(nodes)}
            for script in ("train_sft.sh", "train_grpo.sh"):
                out[f"{script}@{model}x{nodes}"] = (script, env, nodes * PER_NODE)
            if layout_for(PRESETS[model], async_world(nodes)) is not None:
                out[f"train_grpo.sh-async@{model}x{nodes}"] = ("train_grpo.sh", {**env, "GRPO_ASYNC": "1"},
                                                               async_world(nodes))
        out[f"start_policy_server.sh@{model}"] = ("start_policy_server.sh", {"MODEL": model}, PER_NODE)
    for layout, world in (("2", 1), ("4", 2)):
        for script in ("train_sft.sh", "train_grpo.sh"):
            out[f"{script}@qwen3-1.7b/layout{layout}"] = (script, {"MODEL": "qwen3-1.7b", "TAU2_GPU_LAYOUT": layout},
                                                          world)
    return out


# name -> (script, environment, the refusal's kind, words of its line)
REFUSED = {
    "8b-tp1-no-cpu-adam": ("train_grpo.sh", {"MODEL": "qwen3-8b", "TRAIN_TP": "1"}, "memory", "training needs"),
    "4b-world1-no-cpu-adam": ("train_sft.sh", {"TAU2_GPU_LAYOUT": "2", "CPU_ADAM": "0"}, "memory", "training needs"),
    "30b-kv-cache": ("train_grpo.sh", {"MODEL": "qwen3-30b-a3b", "ROLLOUT_GPUS_PER_ENGINE": "1"}, "memory",
                     "KV cache holds 0 tokens"),
    # slime's docs/en/examples/qwen3-30B-A3B.md: TP4 x EP8 on one node's 8 GPUs needs CPU Adam
    "30b-one-node-no-cpu-adam": ("train_sft.sh", {"MODEL": "qwen3-30b-a3b", "POLICY_GPUS": "0,1,2,3,4,5,6,7",
                                                  "USER_SIM_GPUS": "8", "CPU_ADAM": "0"}, "memory",
                                 "with the allocator's 10% margin"),
    "8b-host-memory": ("train_grpo.sh", {"MODEL": "qwen3-8b", "HOST_MEM_GB": "200"}, "memory",
                       "host memory: a node needs"),
    "30b-ep3": ("train_sft.sh", {"MODEL": "qwen3-30b-a3b", "TRAIN_EP": "3"}, "parsers", "must divide the 128 experts"),
    "4b-ep-dense": ("train_sft.sh", {"TRAIN_EP": "2"}, "parsers", "needs a mixture-of-experts model"),
    "14b-pp3": ("train_sft.sh", {"MODEL": "qwen3-14b", "POLICY_GPUS": "0,1,2,3,4,5", "USER_SIM_GPUS": "6,7",
                                 "TRAIN_TP": "2", "TRAIN_PP": "3", "CPU_ADAM": "1"}, "parsers",
                "TRAIN_PP=3 does not divide the model's 40 layers"),
    "8b-engine3": ("train_grpo.sh", {"MODEL": "qwen3-8b", "POLICY_GPUS": "0,1,2,3,4,5", "USER_SIM_GPUS": "6,7",
                                     "ROLLOUT_GPUS_PER_ENGINE": "4", "GRPO_ROLLOUT_BATCH_SIZE": "12"}, "sheet", "does not divide the 6 rollout GPUs"),
    "14b-engine3": ("train_grpo.sh", {"MODEL": "qwen3-14b", "POLICY_GPUS": "0,1,2,3,4,5", "USER_SIM_GPUS": "6,7",
                                      "TRAIN_TP": "2", "CPU_ADAM": "1", "ROLLOUT_GPUS_PER_ENGINE": "3",
                                      "GRPO_ROLLOUT_BATCH_SIZE": "12"}, "sglang",
                    "does not divide the model's 40 attention heads"),
}


def jobs_of(result, name: str) -> list[dict]:
    """The slime job or SGLang server a dry run launches, as parse_argv.py takes it."""
    jobs = []
    for cmd in result.commands:
        found = program_of(cmd)
        if found is not None and found[0] in ("train.py", "train_async.py", "sglang.launch_server"):
            program = "sglang.launch_server" if found[0] == "sglang.launch_server" else "slime"
            jobs.append({"program": program, "entry": found[0], "argv": found[1], "env": found[2], "name": name})
    return jobs


def parse_all(base: Path) -> dict[str, dict]:
    """name -> {"args"/"error"/"unknown" of slime's parse_args, "stderr" of the dry run, "refused": stopped rc}."""
    (base / "out/checkpoints/rft").mkdir(parents=True)  # the KL reference slime's validation looks for
    runs = {name: (script, env) for name, (script, env, _) in accepted().items() if "NUM_NODES" not in env or MULTI_NODE}
    for name, (script, env, _, _) in REFUSED.items():
        runs[f"{name}/stopped"], runs[name] = (script, env), (script, {**env, "SIZING_FORCE": "1"})
    with ThreadPoolExecutor(max_workers=4) as pool:  # dry runs are processes: a few at once
        results = dict(zip(runs, pool.map(lambda run: run_script(run[0], base, **run[1]), runs.values())))
    jobs, out = [], {}
    for name, result in results.items():
        if name.endswith("/stopped"):
            continue
        assert result.rc == 0, (name, result.text)
        jobs += jobs_of(result, name)
        out[name] = {"stderr": result.stderr}
        if name in REFUSED:
            out[name].update(refused_rc=results[f"{name}/stopped"].rc, refused_stderr=results[f"{name}/stopped"].stderr)
    (base / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(HERE / "parse_argv.py"), str(base / "jobs.json"), str(base / "out.json")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for job, answer in zip(jobs, json.loads((base / "out.json").read_text())):
        out[job["name"]].update(answer, entry=job["entry"], argv=job["argv"])
    return out


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return parse_all(tmp_path_factory.mktemp("presets"))


def actor_nodes(entry: dict) -> int:
    return entry["args"].get("actor_num_nodes", 0)


@pytest.mark.parametrize("name", sorted(accepted()))
def test_every_preset_layout_parses_as_the_preset_says(parsed: dict[str, dict], name: str) -> None:
    script, env, world = accepted()[name]
    nodes = int(env.get("NUM_NODES", "1"))
    if nodes > 1 and not MULTI_NODE:
        pytest.skip("the stage scripts in this tree place slime on one node (multi-node placement: scripts/cluster.sh)")
    entry = parsed[name]
    assert entry["error"] is None and entry["unknown"] == [], (entry["error"], entry["unknown"])
    args = entry["args"]
    par = layout_for(PRESETS[env["MODEL"]], world)
    if script == "start_policy_server.sh":  # SGLang's own parser: the preset's engine size, DP over the rest
        assert (args["tp_size"], args["dp_size"]) == (par.engine_gpus, PER_NODE // par.engine_gpus)
        assert "SGLang" in entry["stderr"] and f"sizing {env['MODEL']}:" in entry["stderr"]
        return
    if env.get("GRPO_ASYNC"):
        assert entry["entry"] == "train_async.py" and args["colocate"] is False
        assert args["rollout_num_gpus"] == nodes * PER_NODE - world
    else:
        assert actor_nodes(entry) == nodes
    assert args["world_size"] == world
    assert (args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"], args["context_parallel_size"],
            args["expert_model_parallel_size"]) == (par.tp, par.pp, par.cp, par.ep)
    assert args["sequence_parallel"] is (par.tp > 1)
    assert args["optimizer_cpu_offload"] is par.cpu_adam and args["use_precision_aware_optimizer"] is par.cpu_adam
    assert args["max_tokens_per_gpu"] == par.max_tokens_per_gpu
    assert f"sizing {env['MODEL']}:" in entry["stderr"]  # the dry run printed the sheet
    if script == "train_grpo.sh":
        assert args["rollout_num_gpus_per_engine"] == par.engine_gpus
        assert args["sglang_mem_fraction_static"] == par.mem_fraction
        assert env.get("GRPO_ASYNC") or args["rollout_num_gpus"] == world  # colocated: every training GPU


@pytest.mark.parametrize("model", [m for m in PRESETS if layout_for(PRESETS[m], async_world(1)) is None])
def test_async_grpo_on_one_node_refuses_a_model_its_half_cannot_hold(tmp_path: Path, model: str) -> None:
    result = run_script("train_grpo.sh", tmp_path, MODEL=model, GRPO_ASYNC="1")
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.rc == 1 and len(errors) == 1 and f"MODEL={model} has no layout for 2 training GPU(s)" in errors[0]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_layouts_are_refused_by_whom_the_sheet_says(parsed: dict[str, dict], name: str) -> None:
    _, _, by, words = REFUSED[name]
    entry = parsed[name]
    errors = [line for line in entry["refused_stderr"].splitlines() if "error:" in line]
    assert entry["refused_rc"] == 1 and len(errors) == 1 and words in errors[0]
    warning = [line for line in entry["stderr"].splitlines() if "warning:" in line and words in line]
    assert warning and f"; {by}: " in warning[0]
    if by == "parsers":
        assert entry["error"] is not None, "the sheet says slime's or Megatron's validation refuses this"
    else:
        assert entry["error"] is None and entry["unknown"] == [], (entry["error"], entry["unknown"])
