"""Every stage script's dry-run command, parsed by the real parser of the program it launches (parse_argv.py).

slime ignores unknown flags silently (Megatron parses with ignore_unknown_args=True), so a typo in a script would
train with a default. Here slime's own parse_args (with Megatron's parser and validation, and SGLang's arguments
through slime's --sglang- wrapper), slime's two converters and SGLang's server parser read the exact argv of each
dry run, for every GPU layout and both GRPO modes, in one subprocess for all commands; the tests then check that
nothing was left unknown and that the parsed values are what the scripts meant.
"""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
from test_scripts import SLIME, Result, run_script

from tau2_rl_pipeline.rollout.offpolicy import SLIME_ASYNC_ROLLOUT
from tau2_rl_pipeline.slime_plugins.offpolicy_guard import refusal

HERE = Path(__file__).resolve().parent
LAYOUTS = {"8": (4, 2), "4": (2, 2), "2": (1, 1)}  # layout -> (policy GPUs, Megatron TP)
TYPO = "--eps-clipp"


def program_of(cmd: list[str]) -> tuple[str, list[str], dict] | None:
    """(program, its argv, its environment) of a command that launches one, as parse_argv.py names programs."""
    if cmd[:3] == ["ray", "job", "submit"]:  # ... -- python3 SLIME/<entry> argv: the job's env is its runtime env
        split = cmd.index("--")
        (env_json,) = [o.split("=", 1)[1] for o in cmd[3:split] if o.startswith("--runtime-env-json=")]
        return cmd[split + 2].removeprefix(f"{SLIME}/"), cmd[split + 3:], json.loads(env_json)["env_vars"]
    for i, tok in enumerate(cmd):
        if tok == f"{SLIME}/tools/convert_hf_to_torch_dist.py":
            return "convert_hf_to_torch_dist", cmd[i + 1:], {}
        if tok == f"{SLIME}/tools/convert_torch_dist_to_hf.py":
            return "convert_torch_dist_to_hf", cmd[i + 1:], {}
        if tok == "sglang.launch_server":
            return "sglang.launch_server", cmd[i + 1:], {}
    return None


def runs() -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (script, environment): every stage script that launches slime, Megatron or SGLang, every layout."""
    out = {}
    for layout in LAYOUTS:
        for script in ("train_sft.sh", "train_rft.sh", "train_grpo.sh", "start_user_sim.sh", "start_policy_server.sh"):
            out[f"{script}@{layout}"] = (script, {"TAU2_GPU_LAYOUT": layout})
        if layout != "2":  # asynchronous GRPO needs separate training and rollout GPUs
            out[f"train_grpo.sh@{layout}-async"] = ("train_grpo.sh", {"TAU2_GPU_LAYOUT": layout, "GRPO_ASYNC": "1"})
    out["train_grpo.sh-all-options"] = ("train_grpo.sh", {
        "WANDB_API_KEY": "sk-test-SECRET", "TAU2_FILTER_ZERO_STD": "1",
        "EXTRA_SLIME_ARGS": "--optimizer-cpu-offload --use-precision-aware-optimizer"})
    out["train_grpo.sh-async-no-options"] = ("train_grpo.sh", {"GRPO_ASYNC": "1", "GRPO_PARTIAL_ROLLOUT": "0",
                                                               "GRPO_USE_TIS": "0"})
    out["train_grpo.sh-async-unmasked"] = ("train_grpo.sh", {"GRPO_ASYNC": "1", "GRPO_MASK_OFFPOLICY": "0"})
    out["train_grpo.sh-awsft-token-mean"] = ("train_grpo.sh", {"GRPO_ALGORITHM": "awsft",
                                                               "TAU2_LOSS_REDUCTION": "token_mean"})
    out["train_grpo.sh-typo"] = ("train_grpo.sh", {"EXTRA_SLIME_ARGS": f"{TYPO} 0.3"})
    out["convert_hf_to_megatron.sh"] = ("convert_hf_to_megatron.sh", {})
    out["convert_megatron_to_hf.sh"] = ("convert_megatron_to_hf.sh", {})
    return out


def parse_all(base: Path) -> dict[str, list[dict]]:
    """name -> one entry per launched program: its argv and what the real parser made of it."""
    (base / "out/checkpoints/rft").mkdir(parents=True)  # the KL reference slime's validation looks for
    jobs, names = [], []
    for name, (script, env) in runs().items():
        result: Result = run_script(script, base, **env)
        assert result.rc == 0, (name, result.text)
        for cmd in result.commands:
            found = program_of(cmd)
            if found is not None:
                program = "slime" if found[0] in ("train.py", "train_async.py") else found[0]
                jobs.append({"program": program, "entry": found[0], "argv": found[1], "env": found[2]})
                names.append(name)
    (base / "jobs.json").write_text(json.dumps(jobs))
    proc = subprocess.run([sys.executable, str(HERE / "parse_argv.py"), str(base / "jobs.json"), str(base / "out.json")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, list[dict]] = {}
    for name, job, answer in zip(names, jobs, json.loads((base / "out.json").read_text())):
        out.setdefault(name, []).append({**job, **answer})
    return out


@pytest.fixture(scope="session")
def parsed(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, list[dict]]:
    """parse_all, once per test run: under pytest-xdist the first worker computes it, the others read it."""
    if worker_id == "master":
        return parse_all(tmp_path_factory.mktemp("argv"))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # the same for every worker of this run
    done = shared / "stage_argv.json"
    with FileLock(str(shared / "stage_argv.lock")):
        if not done.exists():
            done.write_text(json.dumps(parse_all(shared / "stage_argv")))
        return json.loads(done.read_text())


def only(parsed: dict[str, list[dict]], name: str) -> dict:
    (entry,) = parsed[name]
    assert entry["error"] is None and entry["unknown"] == [], (name, entry["error"], entry["unknown"])
    return entry["args"]


def test_every_command_parses_with_no_unknown_flag(parsed: dict[str, list[dict]]) -> None:
    assert set(parsed) == set(runs())  # every run launched something the tier can parse
    bad = {name: (e["program"], e["error"], e["unknown"]) for name, entries in parsed.items() if name != "train_grpo.sh-typo"
           for e in entries if e["error"] or e["unknown"]}
    assert not bad


def test_a_misspelt_flag_is_caught(parsed: dict[str, list[dict]]) -> None:
    (entry,) = parsed["train_grpo.sh-typo"]
    assert entry["unknown"] == [TYPO, "0.3"]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_grpo_parses_as_meant(parsed: dict[str, list[dict]], layout: str) -> None:
    gpus, tp = LAYOUTS[layout]
    args = only(parsed, f"train_grpo.sh@{layout}")
    assert parsed[f"train_grpo.sh@{layout}"][0]["entry"] == "train.py"
    assert args["colocate"] is True and args["rollout_num_gpus"] == gpus  # slime puts the engines on the actor GPUs
    assert (args["world_size"], args["tensor_model_parallel_size"], args["data_parallel_size"]) == (gpus, tp, gpus // tp)
    assert args["sequence_parallel"] is (tp > 1)
    assert (args["rollout_batch_size"], args["n_samples_per_prompt"], args["global_batch_size"]) == (16, 4, 64)
    assert (args["lr"], args["eps_clip"], args["eps_clip_high"], args["kl_loss_coef"]) == (1e-6, 0.2, 0.28, 0.01)
    assert args["use_kl_loss"] is True and args["kl_loss_type"] == "low_var_kl" and args["advantage_estimator"] == "grpo"
    assert args["rollout_function_path"] == "slime.rollout.sglang_rollout.generate_rollout"
    assert args["custom_generate_function_path"] == "tau2_rl_pipeline.slime_plugins.adapter.generate"
    assert args["loss_mask_type"] == "qwen3" and args["sglang_mem_fraction_static"] == 0.7
    # partial rollout, the old-weight mask and TIS in the synchronous mode too; aborted groups filtered, always
    assert args["use_tis"] is args["partial_rollout"] is args["mask_offpolicy_in_partial_rollout"] is True
    assert args["dynamic_sampling_filter_path"] == "tau2_rl_pipeline.slime_plugins.batch.filter_groups"
    assert args["custom_rollout_log_function_path"] == "tau2_rl_pipeline.slime_plugins.rollout_log.log_rollout_data"


@pytest.mark.parametrize("layout", ["8", "4"])
def test_async_grpo_parses_as_meant(parsed: dict[str, list[dict]], layout: str) -> None:
    gpus, tp = LAYOUTS[layout]
    args = only(parsed, f"train_grpo.sh@{layout}-async")
    assert parsed[f"train_grpo.sh@{layout}-async"][0]["entry"] == "train_async.py"
    assert args["colocate"] is False  # train_async.py asserts it
    assert args["rollout_function_path"] == "tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async"
    assert args["custom_generate_function_path"] == "tau2_rl_pipeline.slime_plugins.adapter.generate"
    assert args["partial_rollout"] is args["mask_offpolicy_in_partial_rollout"] is args["use_tis"] is True
    assert args["use_rollout_logprobs"] is False  # slime refuses it together with --use-tis
    assert args["rollout_num_gpus"] == gpus // 2 and args["actor_num_gpus_per_node"] == gpus - gpus // 2
    assert args["tensor_model_parallel_size"] == min(tp, gpus - gpus // 2)
    assert args["world_size"] == gpus - gpus // 2


def test_the_off_policy_guard_passes_every_grpo_argv_but_slime_own_async_rollout(parsed: dict[str, list[dict]],
                                                                                  tmp_path: Path) -> None:
    """The guard (offpolicy_guard.refusal) over slime's own parse of each GRPO dry run: every mode the script offers
    passes; slime's own fully async rollout in an async argv is refused in one line (the staleness bound and the
    abort-storm stop do not hold under it), and the stage script refuses GRPO_ASYNC_ROLLOUT_FUNCTION naming it with
    that same line before anything starts (the planner applies the same rule)."""
    guarded = {name: refusal(Namespace(**only(parsed, name))) for name in parsed
               if name.startswith("train_grpo.sh") and name != "train_grpo.sh-typo"}
    assert guarded and set(guarded.values()) == {None}, guarded
    line = refusal(Namespace(**{**only(parsed, "train_grpo.sh@8-async"), "rollout_function_path": SLIME_ASYNC_ROLLOUT}))
    assert line is not None and "\n" not in line
    assert line.startswith(f"--rollout-function-path {SLIME_ASYNC_ROLLOUT} runs this project's generate without")
    refused = run_script("train_grpo.sh", tmp_path, GRPO_ASYNC="1", GRPO_ASYNC_ROLLOUT_FUNCTION=SLIME_ASYNC_ROLLOUT)
    assert refused.rc == 1 and refused.text.strip().splitlines()[-1] == f"train_grpo.sh: error: {line}", refused.text


def test_async_grpo_options_switch_off(parsed: dict[str, list[dict]]) -> None:
    args = only(parsed, "train_grpo.sh-async-no-options")
    assert args["partial_rollout"] is args["use_tis"] is False
    assert args["mask_offpolicy_in_partial_rollout"] is True  # old-weight turns stay out without TIS
    assert args["rollout_function_path"] == "tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async"


def test_the_loss_reduction_parses_as_slimes_flag(parsed: dict[str, list[dict]]) -> None:
    assert only(parsed, "train_grpo.sh@8")["calculate_per_token_loss"] is False  # slime's per-sample mean
    args = only(parsed, "train_grpo.sh-awsft-token-mean")
    assert args["calculate_per_token_loss"] is True and args["loss_type"] == "custom_loss"
    assert args["custom_loss_function_path"] == "tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function"


def test_grpo_options_parse(parsed: dict[str, list[dict]]) -> None:
    args = only(parsed, "train_grpo.sh-all-options")
    assert args["dynamic_sampling_filter_path"] == "tau2_rl_pipeline.slime_plugins.batch.filter_groups"
    assert args["use_wandb"] is True and args["wandb_group"] == "grpo-qwen3-4b"
    assert args["optimizer_cpu_offload"] is True and args["use_precision_aware_optimizer"] is True


@pytest.mark.parametrize("script, data", [("train_sft.sh", "sft_seed.jsonl"), ("train_rft.sh", "sft_seed_plus_rft.jsonl")])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sft_parses_as_meant(parsed: dict[str, list[dict]], script: str, data: str, layout: str) -> None:
    gpus, tp = LAYOUTS[layout]
    args = only(parsed, f"{script}@{layout}")
    assert parsed[f"{script}@{layout}"][0]["entry"] == "train_async.py"
    assert args["debug_train_only"] is True and args["loss_type"] == "sft_loss"
    assert args["rollout_function_path"] == "tau2_rl_pipeline.slime_plugins.sft.generate_rollout"
    assert args["input_key"] == "messages" and args["tool_key"] == "tools" and args["loss_mask_type"] == "qwen3"
    assert args["prompt_data"].endswith(f"out/data/{data}") and args["num_epoch"] == 2
    assert args["calculate_per_token_loss"] is True and args["compute_advantages_and_returns"] is False
    assert (args["world_size"], args["tensor_model_parallel_size"]) == (gpus, tp)
    assert not any(k.startswith("sglang_") for k in args)  # --debug-train-only: slime skips SGLang's parser


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sglang_servers_parse_as_meant(parsed: dict[str, list[dict]], layout: str) -> None:
    gpus, _ = LAYOUTS[layout]
    user = only(parsed, f"start_user_sim.sh@{layout}")
    assert (user["tp_size"], user["dp_size"], user["tool_call_parser"]) == (1, gpus, "qwen25")
    assert user["mem_fraction_static"] == 0.85 and user["port"] == 30001
    policy = only(parsed, f"start_policy_server.sh@{layout}")
    assert (policy["tp_size"], policy["dp_size"], policy["port"]) == (1, gpus, 30000)
    assert policy["model_path"].endswith("out/models/sft_hf")


def test_converters_parse_as_meant(parsed: dict[str, list[dict]]) -> None:
    to_dist = only(parsed, "convert_hf_to_megatron.sh")
    assert to_dist["hf_checkpoint"].endswith("out/models/Qwen3-4B-Instruct-2507")
    assert to_dist["save"].endswith("out/models/Qwen3-4B-Instruct-2507_torch_dist")
    assert (to_dist["num_layers"], to_dist["hidden_size"], to_dist["num_query_groups"]) == (36, 2560, 8)
    to_hf = only(parsed, "convert_megatron_to_hf.sh")
    assert to_hf["output_dir"].endswith("out/models/sft_hf") and to_hf["input_dir"].endswith("iter_LATEST")
    assert to_hf["origin_hf_dir"].endswith("out/models/Qwen3-4B-Instruct-2507")
