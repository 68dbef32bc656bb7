"""The sizing sheet (tau2_rl_pipeline/scale/sizing.py) and the presets (scale/presets.py): hand-computed numbers,
parameter counts against the models' published sizes, refusals, and every preset layout fitting."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tau2_rl_pipeline.scale.placement import node_loads
from tau2_rl_pipeline.scale.presets import DEFAULT_MODEL, PRESETS, RECIPES, defaults, layout_for
from tau2_rl_pipeline.scale.sizing import (
    ACTOR_BASE,
    ALLOCATOR_MARGIN,
    ENGINE_HOST,
    ENGINE_RESERVE,
    GIB,
    GPU_BYTES,
    MIN_KV_TOKENS,
    Layout,
    Model,
    Work,
    model_args_from_file,
    render,
    size,
    tokens_per_episode,
)

MODELS = Path(__file__).resolve().parents[1] / "scripts" / "models"


def model(name: str) -> Model:
    return Model.from_megatron_args(model_args_from_file((MODELS / PRESETS[name].model_file).read_text()))


def test_qwen3_4b_parameters_by_hand() -> None:
    m = model(DEFAULT_MODEL)
    attention = 2 * 2560 * 4096 + 2 * 2560 * 1024 + 2 * 128 + 2 * 2560  # Q, O; K, V (8 groups); q/k norms; 2 norms
    mlp = 3 * 2560 * 9728
    embeddings = 151936 * 2560 + 2560  # tied output layer; final norm
    assert m.params == 36 * (attention + mlp) + embeddings == 4_022_468_096
    assert m.active_params == m.params


@pytest.mark.parametrize("name, total, active", [
    ("qwen3-1.7b", 1.72e9, 1.72e9), (DEFAULT_MODEL, 4.02e9, 4.02e9), ("qwen3-8b", 8.19e9, 8.19e9),
    ("qwen3-14b", 14.77e9, 14.77e9), ("qwen3-30b-a3b", 30.53e9, 3.35e9)])
def test_parameter_counts_match_the_published_sizes(name: str, total: float, active: float) -> None:
    """Qwen3's model cards: 1.7B, 4.0B, 8.2B, 14.8B, 30.5B total / 3.3B activated."""
    m = model(name)
    assert m.params == pytest.approx(total, rel=2e-3) and m.active_params == pytest.approx(active, rel=2e-3)


def test_moe_parameters_by_hand() -> None:
    m = model("qwen3-30b-a3b")
    attention = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 2 * 2048
    router, expert = 2048 * 128, 3 * 2048 * 768
    embeddings = 2 * 151936 * 2048 + 2048  # untied
    assert m.params == 48 * (attention + router + 128 * expert) + embeddings
    assert m.active_params == 48 * (attention + router + 8 * expert) + embeddings


def test_training_memory_by_hand() -> None:
    """Qwen3-4B, TP2 x DP2 on 4 GPUs, 12288 tokens per GPU (the default layout)."""
    m = model(DEFAULT_MODEL)
    lay = Layout(nodes=1, gpus_per_node=4, tp=2, max_tokens_per_gpu=12288)
    sheet = size(m, lay)
    per_rank = (36 * 100_930_816 + 388_958_720) / 2  # (layers + embedding stage) / TP
    assert sheet.train_weights == int(2 * per_rank)
    assert sheet.train_grads == int(4 * per_rank)
    assert sheet.train_optimizer == int(12 * per_rank / 2)  # sharded over DP2
    saved = 12288 * 2560 * 2 * 36  # each layer's bf16 input
    working = 12288 * 2 * (8 * 2560 + 3 * 9728)  # one layer recomputed
    # GRPO's peak: three fp32 [T, V/TP] buffers (the upcast logits, the temperature-scaled copy, the softmax; in the
    # backward, the softmax and scaled logits kept for the entropy's gradient and that gradient)
    logits = 12288 * 151936 * 12
    assert sheet.train_activations == int((saved + working + logits) / 2)
    sft = size(m, replace(lay, loss="sft"))  # no temperature, no entropy: the upcast logits and the softmax
    assert sft.train_activations == int((saved + working + 12288 * 151936 * 8) / 2)
    assert sheet.refusal is None
    assert 33 * GIB < sheet.train_total < 35 * GIB


def test_long_contexts_count_the_logits_as_slime_keeps_them() -> None:
    """Qwen3-1.7B at 32768 tokens on one GPU: the tensors other than the logits come to 34.5 GiB, the logits' three
    fp32 buffers to 55.6 GiB; at the 8 B an entry counted before, the sheet accepted it at 71.6 GiB."""
    m = model("qwen3-1.7b")
    sheet = size(m, Layout(nodes=1, gpus_per_node=1, max_tokens_per_gpu=32768))
    sft = size(m, Layout(1, 1, max_tokens_per_gpu=32768, loss="sft"))  # 8 B an entry, as every stage was counted
    assert sheet.train_activations - sft.train_activations == 32768 * 151936 * 4
    assert sft.train_total == pytest.approx(71.6 * GIB, abs=0.05 * GIB) and sft.refusal is not None  # the margin
    assert sheet.train_total == pytest.approx(90.1 * GIB, abs=0.1 * GIB)
    assert sheet.refusal is not None and sheet.refusal.by == "memory" and "training needs 90.1 GiB" in sheet.refusal.line
    assert size(m, Layout(nodes=1, gpus_per_node=1, max_tokens_per_gpu=16384)).refusal is None
    slimes = size(model("qwen3-30b-a3b"), Layout(nodes=1, gpus_per_node=8, tp=4, ep=8, max_tokens_per_gpu=20480))
    old_count = slimes.train_total - 20480 * 151936 * 4 // 4  # at 8 B an entry, as before
    assert old_count == pytest.approx(72.3 * GIB, abs=0.05 * GIB)  # issue 30: accepted then, at slime's 20480 tokens


def test_the_edge_of_one_node_agrees_with_slimes_page() -> None:
    """Qwen3-30B-A3B, TP4 x EP8 on one node's 8 GPUs: slime's docs/en/examples/qwen3-30B-A3B.md needs CPU Adam there.
    The tensors alone (71.1 GiB) would pass; the allocator's margin refuses it, saying why and what to set."""
    m = model("qwen3-30b-a3b")
    bare = Layout(nodes=1, gpus_per_node=8, tp=4, ep=8, max_tokens_per_gpu=12288)
    sheet = size(m, bare)
    assert sheet.train_total < GPU_BYTES - ENGINE_RESERVE < sheet.train_total * (1 + ALLOCATOR_MARGIN)
    assert sheet.refusal is not None and sheet.refusal.by == "memory"
    assert "78.2 with the allocator's 10% margin" in sheet.refusal.line and "set CPU_ADAM=1" in sheet.refusal.line
    assert size(m, replace(bare, loss="sft")).refusal is not None  # SFT's 8 B logits: refused too
    assert size(m, replace(bare, cpu_adam=True)).refusal is None
    assert size(m, replace(bare, nodes=2)).refusal is None  # slime's page: across nodes, no CPU Adam


def test_cpu_adam_takes_the_optimizer_off_the_gpu() -> None:
    m = model(DEFAULT_MODEL)
    on_gpu = size(m, Layout(nodes=1, gpus_per_node=1, max_tokens_per_gpu=8192))
    offloaded = size(m, Layout(nodes=1, gpus_per_node=1, max_tokens_per_gpu=8192, cpu_adam=True))
    assert on_gpu.train_optimizer == int(12 * m.params) and offloaded.train_optimizer == 0
    # on the host: fp32 master weights, pinned fp32 gradients, two moments, and the step's temporaries
    assert offloaded.cpu_adam_host_per_node == int(20 * m.params)
    assert offloaded.host_per_actor == int(20 * m.params) + 2 * int(2 * m.params) + ACTOR_BASE
    assert on_gpu.refusal is not None and on_gpu.refusal.by == "memory" and "CPU_ADAM=1" in on_gpu.refusal.line
    assert offloaded.refusal is None


def test_host_memory_per_node_matches_the_public_report_and_refuses_over_host_mem() -> None:
    """THUDM/slime#1851: Qwen3-30B-A3B with CPU Adam on 8 H100s, colocated GRPO with a KL reference: 8 training
    actors at ~102 GiB each, the node at 999.9 of 1007.5 GiB when Ray killed one. The sheet counts the same node at
    1000 GiB and refuses it against HOST_MEM_GB=1007.5; on two such nodes, half each."""
    m = model("qwen3-30b-a3b")
    one = Layout(nodes=1, gpus_per_node=8, tp=4, ep=8, cpu_adam=True, rollout_gpus=8, engine_gpus=4, colocated=True)
    sheet = size(m, one, Work(16, 4, 30))
    assert sheet.host_per_actor == pytest.approx(102 * GIB, abs=0.5 * GIB)
    assert sheet.host_per_node == 8 * sheet.host_per_actor + 8 * ENGINE_HOST
    assert sheet.refusal is None  # HOST_MEM_GB unset: printed, not checked
    over = size(m, replace(one, host_mem=int(1007.5 * GIB)), Work(16, 4, 30))
    assert over.refusal is not None and over.refusal.by == "memory"
    assert over.refusal.line.startswith("host memory: a node needs 1000.2 GiB, over 95% of HOST_MEM_GB=1007.5")
    two = size(m, replace(one, nodes=2, gpus_per_node=4, host_mem=int(1007.5 * GIB)), Work(16, 4, 30))
    assert two.refusal is None and two.host_per_node == pytest.approx(500.1 * GIB, abs=0.05 * GIB)


def test_each_node_holds_what_slimes_order_gives_it() -> None:
    """(training actors, SGLang GPUs) per node: the actor's GPUs first, the rollout's next (the same ones colocated)."""
    assert node_loads(8, 8, 4, colocated=True) == [(4, 4), (4, 4)]  # sync GRPO, 2 nodes x 4
    assert node_loads(4, 4, 4, colocated=False) == [(4, 0), (0, 4)]  # async GRPO, 2 nodes x 4
    assert node_loads(8, 8, 4, colocated=False) == [(4, 0), (4, 0), (0, 4), (0, 4)]  # async, 4 nodes x 4
    assert node_loads(2, 2, 4, colocated=False) == [(2, 2)]  # async on one node: half trains, half rolls out
    assert node_loads(0, 4, 4, colocated=False) == [(0, 4)]  # the RFT policy server
    assert node_loads(16, 0, 8, colocated=False) == [(8, 0), (8, 0)]  # SFT
    with pytest.raises(ValueError, match="node_gpus must be at least 1"):
        node_loads(4, 4, 0, colocated=False)


def test_async_grpo_counts_the_host_memory_of_the_node_that_holds_it() -> None:
    """Async GRPO on 2 nodes x 4: the training node holds 4 actors and no engine, the rollout node 4 engines; the
    sheet's host memory is the heavier node's (it counted 4 actors + 4 engines on one node before)."""
    m = model("qwen3-30b-a3b")
    lay = Layout(nodes=1, gpus_per_node=4, tp=4, ep=4, cpu_adam=True, rollout_gpus=4, engine_gpus=4, node_gpus=4)
    sheet = size(m, lay, Work(16, 4, 30))
    assert sheet.host_per_node == max(4 * sheet.host_per_actor, 4 * ENGINE_HOST) == 4 * sheet.host_per_actor
    line = next(x for x in render("qwen3-30b-a3b", lay, Work(16, 4, 30), sheet) if "host memory" in x)
    assert line.startswith("  host memory, the heaviest of 2 nodes: ") and "4 training actor(s)" in line
    assert "SGLang" not in line
    one_node = size(m, replace(lay, gpus_per_node=2, rollout_gpus=2), Work(16, 4, 30))  # both on one node of 4
    assert one_node.host_per_node == 2 * one_node.host_per_actor + 2 * ENGINE_HOST


def test_expert_parallel_splits_the_experts() -> None:
    m = model("qwen3-30b-a3b")
    sheet = size(m, Layout(nodes=2, gpus_per_node=8, tp=4, ep=16))
    dense = (48 * (m.attention + 2048 * 128) + m.embeddings) / 4
    experts = 48 * 128 * m.expert / 16
    assert sheet.train_weights == int(2 * (dense + experts))
    assert sheet.train_optimizer == int(12 * (dense / 4 + experts / 1))  # dense DP 16/4, expert DP 16/16


def test_sglang_memory_by_hand() -> None:
    m = model("qwen3-8b")
    sheet = size(m, Layout(nodes=1, gpus_per_node=4, tp=2, rollout_gpus=4, engine_gpus=1, mem_fraction=0.7,
                           colocated=True), Work(16, 4, 30))
    weights = 2 * 8_190_735_360
    kv = int(0.7 * GPU_BYTES) - weights
    assert (sheet.sglang_weights, sheet.kv_cache) == (weights, kv)
    assert sheet.kv_tokens == kv // (2 * 36 * 8 * 128 * 2)
    assert sheet.episodes_per_step == 64 and sheet.tokens_per_step == int(64 * tokens_per_episode(30))


def test_kv_heads_are_split_by_the_engine_until_one_a_gpu() -> None:
    m = model("qwen3-30b-a3b")  # 4 KV heads
    one = size(m, Layout(nodes=1, gpus_per_node=8, rollout_gpus=8, engine_gpus=8, train=False), Work())
    per_token = 2 * 48 * 1 * 128 * 2  # 8 GPUs, 4 heads: one head a GPU (SGLang replicates it)
    assert one.kv_tokens == one.kv_cache // per_token
    assert one.train_total == 0


@pytest.mark.parametrize("name, lay, by, words", [
    (DEFAULT_MODEL, Layout(1, 6, tp=3), "parsers", "TRAIN_TP=3 does not divide"),
    (DEFAULT_MODEL, Layout(1, 4, tp=2, pp=4), "parsers", "does not divide the 4 training GPUs"),
    (DEFAULT_MODEL, Layout(1, 8, pp=8, tp=1), "parsers", "TRAIN_PP=8 does not divide the model's 36 layers"),
    (DEFAULT_MODEL, Layout(1, 4, ep=2), "parsers", "needs a mixture-of-experts model"),
    ("qwen3-30b-a3b", Layout(1, 6, tp=2, ep=3, cpu_adam=True), "parsers", "must divide the 128 experts"),
    ("qwen3-14b", Layout(2, 4, tp=8), "sheet", "spans nodes"),
    ("qwen3-8b", Layout(1, 4, tp=2, rollout_gpus=4, engine_gpus=3), "sheet", "does not divide the 4 rollout GPUs"),
    ("qwen3-14b", Layout(1, 4, tp=4, cpu_adam=True, rollout_gpus=4, engine_gpus=4, mem_fraction=0.7), None, None),
    ("qwen3-30b-a3b", Layout(1, 4, tp=4, ep=4, cpu_adam=True, rollout_gpus=4, engine_gpus=1), "memory",
     "KV cache holds 0 tokens"),
    ("qwen3-8b", Layout(1, 4, tp=1), "memory", "training needs"),
])
def test_refusals_say_why_in_one_line(name: str, lay: Layout, by: str | None, words: str | None) -> None:
    sheet = size(model(name), lay, Work(16, 4, 30))
    if by is None:
        assert sheet.refusal is None
        return
    assert sheet.refusal is not None and sheet.refusal.by == by and words in sheet.refusal.line
    assert "\n" not in sheet.refusal.line


def every_layout() -> list[tuple[str, int]]:
    return [(name, world) for name, p in PRESETS.items() for world in p.layouts]


@pytest.mark.parametrize("name, world", every_layout())
@pytest.mark.parametrize("per_node", [4, 8])
def test_every_preset_layout_fits(name: str, world: int, per_node: int) -> None:
    """Sync GRPO (colocated) at the cookbook's defaults and at the recipe's 1024 episodes, and SFT, on 4 or 8
    training GPUs a node (the default split, or a node given wholly to the policy)."""
    d = defaults(name, "", world)
    par = layout_for(PRESETS[name], world)
    per_node = min(per_node, world)
    common = dict(nodes=world // per_node, gpus_per_node=per_node, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep,
                  cpu_adam=par.cpu_adam, max_tokens_per_gpu=par.max_tokens_per_gpu)
    grpo = Layout(**common, rollout_gpus=world, engine_gpus=par.engine_gpus, mem_fraction=par.mem_fraction,
                  colocated=True)
    for work in (Work(16, 4, 30), Work(64, 16, 40)):
        assert size(model(name), grpo, work).refusals == []
    room = GPU_BYTES - ENGINE_RESERVE - size(model(name), grpo).train_total * (1 + ALLOCATOR_MARGIN)
    assert room > 9 * GIB  # docs/models-and-sizing.md: every preset layout keeps 9 GiB under the margin
    assert size(model(name), Layout(**common), Work()).refusals == []
    assert int(d["TRAIN_TP"]) == par.tp and int(d["SFT_BATCH_SIZE"]) % (world // (par.tp * par.pp * par.cp)) == 0


def test_budget_is_the_h100_less_the_reserve() -> None:
    assert GPU_BYTES - ENGINE_RESERVE == pytest.approx(73.6 * GIB, abs=0.05 * GIB)
    assert MIN_KV_TOKENS == 32768


def test_defaults_follow_the_model() -> None:
    small, big = defaults("qwen3-1.7b", "", 1), defaults("qwen3-30b-a3b", "", 16)
    assert small["HF_MODEL_ID"] == "Qwen/Qwen3-1.7B" and small["TRAIN_TP"] == "1" and small["CPU_ADAM"] == "0"
    assert big["HF_MODEL_ID"] == "Qwen/Qwen3-30B-A3B" and big["TRAIN_EP"] == "16" and big["CPU_ADAM"] == "0"
    assert defaults("qwen3-30b-a3b", "", 8)["CPU_ADAM"] == "1"  # one node's 8 GPUs: slime's run-qwen3-30B-A3B.sh
    assert defaults("", "", 4)["MODEL"] == DEFAULT_MODEL
    assert defaults("qwen3-8b", "", 4)["SFT_LR"] == "5e-6" and defaults(DEFAULT_MODEL, "", 4)["SFT_LR"] == "1e-5"
    assert defaults(DEFAULT_MODEL, "", 12)["TRAIN_TP"] == "2"  # a world between two listed: the smaller one's layout


def test_recipe_sets_the_published_protocol() -> None:
    d = defaults("", "qwen3-8b-tau2", 16)
    assert d["MODEL"] == "qwen3-8b"
    assert (d["GRPO_ROLLOUT_BATCH_SIZE"], d["GRPO_N_SAMPLES"], d["TAU2_MAX_TURNS"]) == ("64", "16", "40")
    assert 45 <= int(d["GRPO_NUM_ROLLOUT"]) <= 75 and 1e-6 <= float(d["GRPO_LR"]) <= 2e-6
    assert RECIPES["qwen3-8b-tau2"].differs


@pytest.mark.parametrize("model_, recipe, world, words", [
    ("qwen3-9b", "", 4, "MODEL=qwen3-9b is not one of"),
    ("qwen3-4b-instruct-2507", "qwen3-8b-tau2", 4, "trains MODEL=qwen3-8b"),
    ("", "paper", 4, "RECIPE=paper is not one of"),
    ("qwen3-14b", "", 2, "has no layout for 2 training GPU(s)"),
])
def test_bad_preset_is_one_line(model_: str, recipe: str, world: int, words: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        defaults(model_, recipe, world)
    assert words in str(err.value)


