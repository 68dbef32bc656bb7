"""The stage scripts with model presets (MODEL=, RECIPE=) and the sizing sheet: what each setting changes in the
dry run's commands, the sheet every slime stage prints, and a layout that cannot fit stopped in one line before
anything starts. Whether slime and Megatron accept these commands: tests/contract/test_preset_argv.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_scripts import cached_dry, command_with, flags, run_script, runtime_env, slime_job

from tau2_rl_pipeline.scale.presets import RECIPES


def grpo(base: Path, entry: str = "train.py", **env: str) -> dict[str, str | None]:
    return flags(slime_job(cached_dry("train_grpo.sh", base, **env), entry)[1])


def sft(base: Path, **env: str) -> dict[str, str | None]:
    return flags(slime_job(cached_dry("train_sft.sh", base, **env), "train_async.py")[1])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale")


def test_model_picks_the_preset(base: Path) -> None:
    got = grpo(base, MODEL="qwen3-30b-a3b")
    assert (got["--num-experts"], got["--num-layers"], got["--hidden-size"]) == ("128", "48", "2048")
    assert (got["--tensor-model-parallel-size"], got["--expert-model-parallel-size"]) == ("4", "4")
    assert "--optimizer-cpu-offload" in got and "--use-precision-aware-optimizer" in got
    assert got["--rollout-num-gpus-per-engine"] == "4"
    assert got["--hf-checkpoint"] == str(base / "out/models/Qwen3-30B-A3B")
    assert got["--ref-load"] == str(base / "out/checkpoints/rft")
    download = cached_dry("download.sh", base, MODEL="qwen3-30b-a3b")
    assert command_with(download, "Qwen/Qwen3-30B-A3B")[-1] == str(base / "out/models/Qwen3-30B-A3B")
    # the user simulator stays on Qwen3-4B-Instruct-2507, downloaded beside it and served by start_user_sim.sh
    assert command_with(download, "Qwen/Qwen3-4B-Instruct-2507")[-1] == str(base / "out/models/Qwen3-4B-Instruct-2507")
    user = flags(command_with(cached_dry("start_user_sim.sh", base, MODEL="qwen3-30b-a3b"), "sglang.launch_server"))
    assert user["--model-path"] == str(base / "out/models/Qwen3-4B-Instruct-2507")
    convert = cached_dry("convert_hf_to_megatron.sh", base, MODEL="qwen3-30b-a3b")
    assert "--moe-grouped-gemm" in command_with(convert, "--save")


def test_the_default_model_downloads_once(base: Path) -> None:
    assert len([c for c in cached_dry("download.sh", base).commands if "download" in c]) == 1


def test_size_dependent_defaults_follow_the_model(base: Path) -> None:
    small, big = sft(base), sft(base, MODEL="qwen3-8b")
    assert (small["--lr"], small["--min-lr"], big["--lr"], big["--min-lr"]) == ("1e-5", "1e-6", "5e-6", "5e-7")
    assert "--untie-embeddings-and-output-weights" in big and "--untie-embeddings-and-output-weights" not in small
    assert grpo(base, MODEL="qwen3-8b")["--lr"] == "1e-6"
    policy = flags(command_with(cached_dry("start_policy_server.sh", base, MODEL="qwen3-14b"), "sglang.launch_server"))
    assert (policy["--tp-size"], policy["--dp-size"]) == ("2", "2")  # the preset's engine size
    assert "--optimizer-cpu-offload" not in grpo(base)


def test_a_variable_you_set_beats_the_preset(base: Path) -> None:
    got = grpo(base, MODEL="qwen3-8b", GRPO_LR="3e-6", GRPO_MAX_TOKENS_PER_GPU="8192", CPU_ADAM="1",
               ROLLOUT_GPUS_PER_ENGINE="2", GRPO_SGLANG_MEM_FRACTION="0.6")
    assert (got["--lr"], got["--max-tokens-per-gpu"], got["--rollout-num-gpus-per-engine"],
            got["--sglang-mem-fraction-static"]) == ("3e-6", "8192", "2", "0.6")
    assert "--optimizer-cpu-offload" in got


def test_small_layouts_get_cpu_adam(base: Path) -> None:
    """One policy GPU holds the 4B only with the optimizer states on the CPU; asynchronous GRPO sizes its training
    GPUs alone (layout 4: one trains, one rolls out)."""
    one = sft(base, TAU2_GPU_LAYOUT="2")
    assert "--optimizer-cpu-offload" in one and one["--max-tokens-per-gpu"] == "8192"
    split = grpo(base, "train_async.py", TAU2_GPU_LAYOUT="4", GRPO_ASYNC="1")
    assert "--optimizer-cpu-offload" in split and split["--tensor-model-parallel-size"] == "1"
    assert "--optimizer-cpu-offload" not in grpo(base, "train_async.py", GRPO_ASYNC="1")


@pytest.mark.parametrize("script", ["train_sft.sh", "train_rft.sh", "train_grpo.sh", "start_policy_server.sh"])
def test_every_slime_stage_prints_the_sizing_sheet(base: Path, script: str) -> None:
    text = cached_dry(script, base, MODEL="qwen3-8b").stderr
    assert f"{script}: sizing qwen3-8b: 8.19e9 parameters" in text
    assert ("training, per GPU:" in text) is (script != "start_policy_server.sh")
    assert ("SGLang" in text) is (script in ("train_grpo.sh", "start_policy_server.sh"))


def test_grpo_sheet_counts_the_step(base: Path) -> None:
    text = cached_dry("train_grpo.sh", base, GRPO_ROLLOUT_BATCH_SIZE="8", GRPO_N_SAMPLES="8", TAU2_MAX_TURNS="12").stderr
    assert "8 prompts x 8 samples = 64 episodes" in text and "(up to 12 turns)" in text


@pytest.mark.parametrize("script, env, words", [
    ("train_grpo.sh", {"MODEL": "qwen3-8b", "TRAIN_TP": "1"}, "training needs 94.5 GiB per GPU"),
    ("train_sft.sh", {"TAU2_GPU_LAYOUT": "2", "CPU_ADAM": "0"}, "set CPU_ADAM=1"),
    ("train_grpo.sh", {"MODEL": "qwen3-30b-a3b", "ROLLOUT_GPUS_PER_ENGINE": "1"}, "KV cache holds 0 tokens"),
    ("start_policy_server.sh", {"MODEL": "qwen3-30b-a3b", "POLICY_TP": "1", "POLICY_MEM_FRACTION": "0.5"},
     "KV cache holds 0 tokens"),
    ("train_sft.sh", {"TRAIN_EP": "2"}, "needs a mixture-of-experts model"),
    ("train_sft.sh", {"MODEL": "qwen3-14b", "TAU2_GPU_LAYOUT": "4"}, "MODEL=qwen3-14b has no layout for 2"),
    ("train_grpo.sh", {"MODEL": "qwen3-9b"}, "MODEL=qwen3-9b is not one of"),
    ("train_grpo.sh", {"RECIPE": "qwen3-8b-tau2", "MODEL": "qwen3-1.7b"}, "trains MODEL=qwen3-8b"),
    ("train_sft.sh", {"CPU_ADAM": "maybe"}, "CPU_ADAM=maybe must be true or false"),
    ("train_sft.sh", {"TRAIN_PP": "0"}, "TRAIN_PP=0 must be a positive integer"),
    # slime's docs/en/examples/qwen3-30B-A3B.md: one node's 8 GPUs need CPU Adam
    ("train_sft.sh", {"MODEL": "qwen3-30b-a3b", "POLICY_GPUS": "0,1,2,3,4,5,6,7", "USER_SIM_GPUS": "8",
                      "CPU_ADAM": "0"}, "76.3 with the allocator's 10% margin"),
    ("train_grpo.sh", {"MODEL": "qwen3-8b", "HOST_MEM_GB": "200"}, "host memory: a node needs 217.0 GiB, over 95% "
                                                                   "of HOST_MEM_GB=200"),
    ("train_sft.sh", {"HOST_MEM_GB": "lots"}, "HOST_MEM_GB=lots must be a non-negative number"),
])
def test_a_layout_that_cannot_fit_stops_in_one_line(tmp_path: Path, script: str, env: dict[str, str],
                                                   words: str) -> None:
    result = run_script(script, tmp_path, **env)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.rc == 1 and len(errors) == 1 and words in errors[0], result.stderr
    assert not any(c[:2] in (["ray", "start"], ["ray", "job"]) for c in result.commands)  # nothing started


def test_sizing_force_goes_on_with_a_warning(tmp_path: Path) -> None:
    result = run_script("train_grpo.sh", tmp_path, MODEL="qwen3-8b", TRAIN_TP="1", SIZING_FORCE="1")
    assert result.rc == 0 and "warning: training needs 94.5 GiB" in result.stderr
    assert "memory: the parsers accept it" in result.stderr


def test_every_slime_stage_prints_host_memory_per_node(base: Path) -> None:
    """Unset HOST_MEM_GB: printed, not checked, in a dry run; set and enough: checked, no warning."""
    text = cached_dry("train_grpo.sh", base, MODEL="qwen3-30b-a3b").stderr
    assert "host memory, per node: " in text and "CPU Adam " in text and "HOST_MEM_GB unset: not checked" in text
    enough = cached_dry("train_sft.sh", base, HOST_MEM_GB="1024").stderr
    assert "(of HOST_MEM_GB=1024, 95% usable)" in enough and "warning: host memory" not in enough


def test_async_grpo_on_two_nodes_counts_each_nodes_own_host_memory(tmp_path: Path) -> None:
    """The scripts give the sheet GPUS_PER_NODE: async GRPO on 2 nodes x 4 trains on one and rolls out on the other,
    and the host memory printed is the heavier node's (training actors only), not actors and engines on one node."""
    hosts = tmp_path / "hostfile"
    hosts.write_text("10.0.0.1 slots=8\n10.0.0.2 slots=8\n")
    result = run_script("train_grpo.sh", tmp_path, GRPO_ASYNC="1", HOSTFILE=str(hosts), MASTER_ADDR="10.0.0.1",
                        SLIME_HOST_IP="10.0.0.1", GLOO_SOCKET_IFNAME="lo", NCCL_SOCKET_IFNAME="lo",
                        TAU2_USER_API_BASE="http://10.0.0.1:30100/v1")
    assert result.rc == 0, result.stderr[-2000:]
    (line,) = [x for x in result.stderr.splitlines() if "host memory, " in x]
    assert "host memory, the heaviest of 2 nodes: " in line and "4 training actor(s)" in line and "SGLang" not in line


def test_recipe_sets_the_published_protocol(base: Path) -> None:
    result = cached_dry("train_grpo.sh", base, RECIPE="qwen3-8b-tau2")
    options, argv = slime_job(result, "train.py")
    got = flags(argv)
    assert (got["--rollout-batch-size"], got["--n-samples-per-prompt"], got["--global-batch-size"],
            got["--num-rollout"], got["--lr"]) == ("64", "16", "1024", "60", "1e-6")
    assert got["--hidden-size"] == "4096"  # Qwen3-8B
    assert runtime_env(options)["env_vars"]["TAU2_MAX_TURNS"] == "40"  # the rollout's turn cap, through Ray
    assert "1024 episodes" in result.stderr and "(up to 40 turns)" in result.stderr
    notes = [line for line in result.stderr.splitlines() if "differs from the published protocol" in line]
    assert len(notes) == len(RECIPES["qwen3-8b-tau2"].differs) >= 3  # said once, though the preset applies twice
    mine = flags(slime_job(cached_dry("train_grpo.sh", base, RECIPE="qwen3-8b-tau2", GRPO_NUM_ROLLOUT="45"),
                           "train.py")[1])
    assert mine["--num-rollout"] == "45"
