"""Model presets (MODEL=...) and the named recipe (RECIPE=...).

Which model, its layout per training world size, and the stage defaults that depend on its size.

One table, so the scripts, the sizing sheet and the cost table cannot disagree. A layout is keyed by the number of
training GPUs (nodes x policy GPUs per node): the 8-GPU node's default split gives the policy 4 GPUs, so 1, 2 and 4
nodes are worlds 4, 8 and 16 (32 when a node gives all 8 to the policy); 1 and 2 are the 2- and 4-GPU layouts.
Every layout here fits by the sizing sheet (tests/test_sizing.py) and parses with slime's and Megatron's own parsers
(tests/contract/test_preset_argv.py). The parallel sizes follow slime's run scripts at 624b824: TP2 for Qwen3-4B
(run-qwen3-4B.sh), TP4 x EP8 with CPU Adam for Qwen3-30B-A3B on one node and without it on several
(run-qwen3-30B-A3B.sh, docs/en/examples/qwen3-30B-A3B.md), TP8 with CPU Adam for the dense 32B (run-qwen3-32B.sh);
smaller worlds here add CPU Adam where the sheet says the optimizer states would not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    cpu_adam: bool = False
    max_tokens_per_gpu: int = 12288
    engine_gpus: int = 1
    mem_fraction: float = 0.7


@dataclass(frozen=True)
class Preset:
    name: str
    hf_id: str
    model_file: str  # under scripts/models/
    short: str  # wandb groups: sft-<short>, rft-<short>, grpo-<short>
    layouts: dict[int, ParallelLayout]
    sft_lr: str = "1e-5"  # as the flags spell them
    sft_min_lr: str = "1e-6"
    grpo_lr: str = "1e-6"


DEFAULT_MODEL = "qwen3-4b-instruct-2507"

PRESETS: dict[str, Preset] = {p.name: p for p in (
    # A trial on 1-2 GPUs (TAU2_GPU_LAYOUT=2: one policy GPU).
    Preset("qwen3-1.7b", "Qwen/Qwen3-1.7B", "qwen3-1.7B.sh", "qwen3-1.7b", {
        1: ParallelLayout(),
        2: ParallelLayout(),
        4: ParallelLayout(),
        8: ParallelLayout(),
        16: ParallelLayout(),
        32: ParallelLayout(),
    }),
    # Today's default: TP2 (slime's run-qwen3-4B.sh); on one policy GPU the optimizer states go to the CPU.
    Preset(DEFAULT_MODEL, "Qwen/Qwen3-4B-Instruct-2507", "qwen3-4B-Instruct-2507.sh", "qwen3-4b", {
        1: ParallelLayout(cpu_adam=True, max_tokens_per_gpu=8192),
        2: ParallelLayout(tp=2),
        4: ParallelLayout(tp=2),
        8: ParallelLayout(tp=2),
        16: ParallelLayout(tp=2),
        32: ParallelLayout(tp=2),
    }),
    Preset("qwen3-8b", "Qwen/Qwen3-8B", "qwen3-8B.sh", "qwen3-8b", {
        2: ParallelLayout(tp=2, cpu_adam=True),
        4: ParallelLayout(tp=2),
        8: ParallelLayout(tp=2),
        16: ParallelLayout(tp=2),
        32: ParallelLayout(tp=2),
    }, sft_lr="5e-6", sft_min_lr="5e-7"),
    Preset("qwen3-14b", "Qwen/Qwen3-14B", "qwen3-14B.sh", "qwen3-14b", {
        4: ParallelLayout(tp=4, cpu_adam=True, engine_gpus=2),
        8: ParallelLayout(tp=4, engine_gpus=2),
        16: ParallelLayout(tp=4, engine_gpus=2),
        32: ParallelLayout(tp=4, engine_gpus=2),
    }, sft_lr="5e-6", sft_min_lr="5e-7"),
    # MoE: experts spread over EP ranks; CPU Adam while each rank holds 16 or more experts' optimizer states.
    Preset("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "qwen3-30B-A3B.sh", "qwen3-30b-a3b", {
        4: ParallelLayout(tp=4, ep=4, cpu_adam=True, engine_gpus=4),
        8: ParallelLayout(tp=4, ep=8, cpu_adam=True, engine_gpus=4),
        16: ParallelLayout(tp=4, ep=16, engine_gpus=4),
        32: ParallelLayout(tp=4, ep=32, engine_gpus=4),
    }, sft_lr="5e-6", sft_min_lr="5e-7"),
)}


@dataclass(frozen=True)
class Recipe:
    """A named set of stage defaults on a preset, and how it departs from what it reproduces."""

    name: str
    model: str
    settings: dict[str, str]
    differs: list[str] = field(default_factory=list)


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("qwen3-8b-tau2", "qwen3-8b", {
        # GRPO: 64 prompts x 16 samples a step, one optimizer step per rollout, up to 40 turns, lr 1e-6 (the
        # published range is 1e-6 to 2e-6), 60 steps (of the published 45-75).
        "GRPO_ROLLOUT_BATCH_SIZE": "64", "GRPO_N_SAMPLES": "16", "GRPO_GLOBAL_BATCH_SIZE": "1024",
        "GRPO_NUM_ROLLOUT": "60", "GRPO_LR": "1e-6", "TAU2_MAX_TURNS": "40", "GRPO_SAVE_INTERVAL": "10",
    }, differs=[
        "rejection sampling is this cookbook's RFT stage (SFT continued from the SFT checkpoint on the seed data plus "
        "the SFT model's successful episodes, scripts/generate_rft.sh), not necessarily the published sampler",
        "the user simulator is the local Qwen3-4B-Instruct-2507 (TAU2_USER_MODEL), whatever the published run used",
        "the reward shaping, KL loss, clipping and entropy bonus are this cookbook's GRPO defaults (GRPO_KL_LOSS_COEF, "
        "GRPO_EPS_CLIP, GRPO_ENTROPY_COEF, ...): the published values beyond lr, batch, turns and steps are not "
        "reproduced",
        "lr and steps are single points of the published ranges (GRPO_LR, GRPO_NUM_ROLLOUT)",
    ]),
)}


def layout_for(preset: Preset, world: int) -> ParallelLayout | None:
    """The preset's layout for `world` training GPUs: its own entry, else the one of the largest smaller world it
    lists (the extra GPUs add data parallelism); None when it lists none that small."""
    fits = [w for w in preset.layouts if w <= world]
    return preset.layouts[max(fits)] if fits else None


def defaults(model: str, recipe: str, world: int) -> dict[str, str]:
    """Stage-script defaults for MODEL=`model` (and RECIPE=`recipe`, '' for none) on `world` training GPUs, by
    the scripts' variable names. A ValueError names what is wrong in one line."""
    if recipe:
        if recipe not in RECIPES:
            raise ValueError(f"RECIPE={recipe} is not one of: {', '.join(RECIPES)}")
        if model and model != RECIPES[recipe].model:
            raise ValueError(f"RECIPE={recipe} trains MODEL={RECIPES[recipe].model}, not MODEL={model}")
        model = RECIPES[recipe].model
    model = model or DEFAULT_MODEL
    if model not in PRESETS:
        raise ValueError(f"MODEL={model} is not one of: {', '.join(PRESETS)}")
    p = PRESETS[model]
    lay = layout_for(p, world)
    if lay is None:
        raise ValueError(f"MODEL={model} has no layout for {world} training GPU(s): it needs at least "
                         f"{min(p.layouts)} (more nodes, or a layout with more policy GPUs)")
    dp = max(world // (lay.tp * lay.pp * lay.cp), 1)
    out = {
        "MODEL": model, "HF_MODEL_ID": p.hf_id, "MODEL_FILE": p.model_file, "MODEL_DIR_NAME": p.hf_id.split("/")[-1],
        "MODEL_SHORT": p.short, "TRAIN_TP": str(lay.tp), "TRAIN_PP": str(lay.pp), "TRAIN_CP": str(lay.cp),
        "TRAIN_EP": str(lay.ep), "CPU_ADAM": "1" if lay.cpu_adam else "0",
        "SFT_MAX_TOKENS_PER_GPU": str(lay.max_tokens_per_gpu), "GRPO_MAX_TOKENS_PER_GPU": str(lay.max_tokens_per_gpu),
        "GRPO_SGLANG_MEM_FRACTION": str(lay.mem_fraction), "ROLLOUT_GPUS_PER_ENGINE": str(lay.engine_gpus),
        "SFT_LR": p.sft_lr, "SFT_MIN_LR": p.sft_min_lr, "GRPO_LR": p.grpo_lr,
        # A batch the data-parallel ranks share evenly: 16 rows (the cookbook's), or one per rank past 16 ranks.
        "SFT_BATCH_SIZE": str(16 if 16 % dp == 0 else dp),
    }
    if recipe:
        out.update(RECIPES[recipe].settings)
    return out


def recipe_notes(recipe: str) -> list[str]:
    """What a dry run says of RECIPE=`recipe`: where it departs from the protocol it reproduces."""
    return [f"RECIPE={recipe} differs from the published protocol: {d}" for d in RECIPES[recipe].differs] if recipe else []

