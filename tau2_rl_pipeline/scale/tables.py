"""The preset, sizing and cost tables of docs/models-and-sizing.md and the README, generated, never hand-typed.

`python -m tau2_rl_pipeline.scale.tables` prints each block between the markers the pages carry; tests/test_scale_docs.py
holds the pages to this output, so a preset or an input that changes changes the pages with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tau2_rl_pipeline.scale import cost
from tau2_rl_pipeline.scale.presets import PRESETS, RECIPES, layout_for
from tau2_rl_pipeline.scale.sizing import GIB, Layout, Work, size

MODELS_DIR = Path(__file__).resolve().parents[2] / "scripts" / "models"
PER_NODE = 4  # TAU2_GPU_LAYOUT=8: 4 policy GPUs a node, 4 for the user simulator
NODES = (1, 2, 4)


def parallel(world: int, name: str) -> str:
    par = layout_for(PRESETS[name], world)
    if par is None:
        return "-"
    parts = [f"TP{par.tp}"] + [f"{k}{v}" for k, v in (("PP", par.pp), ("CP", par.cp), ("EP", par.ep)) if v > 1]
    return " ".join(parts) + (" + CPU Adam" if par.cpu_adam else "")


def presets_table() -> list[str]:
    """MODEL, the model, and its training layout on 1, 2 and 4 nodes (README and docs)."""
    lines = ["| `MODEL=` | model | 1 node | 2 nodes | 4 nodes |", "|---|---|---|---|---|"]
    for name, p in PRESETS.items():
        cells = [parallel(n * PER_NODE, name) for n in NODES]
        lines.append(f"| `{name}` | {p.hf_id} | " + " | ".join(cells) + " |")
    return lines


def sizing_rows() -> list[tuple[str, int, int]]:
    """(preset, nodes, training GPUs a node): each preset on 1, 2, 4 nodes; the small ones on 1 and 2 GPUs too."""
    rows = [(name, 1, g) for name in ("qwen3-1.7b", "qwen3-4b-instruct-2507") for g in (1, 2)]
    return rows + [(name, n, PER_NODE) for name in PRESETS for n in NODES]


def sizing_table() -> list[str]:
    """The sizing sheet of each preset and layout: sync GRPO (colocated) at the cookbook's defaults."""
    lines = ["| `MODEL=` | parameters (active) | nodes x training GPUs | layout | training GiB/GPU: weights + grads + "
             "optimizer + activations | SGLang engines x GPUs: weights GiB + KV cache tokens | episodes, tokens per "
             "rollout step |", "|---|---|---|---|---|---|---|"]
    work = Work(16, 4, 30)
    for name, nodes, per_node in sizing_rows():
        world = nodes * per_node
        par = layout_for(PRESETS[name], world)
        assert par is not None, (name, world)
        lay = Layout(nodes=nodes, gpus_per_node=per_node, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep,
                     cpu_adam=par.cpu_adam, max_tokens_per_gpu=par.max_tokens_per_gpu, rollout_gpus=world,
                     engine_gpus=par.engine_gpus, mem_fraction=par.mem_fraction, colocated=True)
        s = size(cost.load_model(PRESETS[name], MODELS_DIR), lay, work)
        assert s.refusal is None, (name, world, s.refusal)

        def g(n: int) -> str:
            return f"{n / GIB:.1f}"

        lines.append(
            f"| `{name}` | {s.params / 1e9:.2f}e9 ({s.active_params / 1e9:.2f}e9) | {nodes} x {per_node} | "
            f"{parallel(world, name)}, {par.max_tokens_per_gpu} tokens | {g(s.train_total)}: {g(s.train_weights)} + "
            f"{g(s.train_grads)} + {g(s.train_optimizer)} + {g(s.train_activations)} | {world // par.engine_gpus} x "
            f"{par.engine_gpus}: {g(s.sglang_weights)} + {s.kv_tokens:,} | {s.episodes_per_step}, "
            f"{s.tokens_per_step / 1e6:.2f}M |")
    return lines


def cost_block() -> list[str]:
    recipe = RECIPES["qwen3-8b-tau2"].settings
    return ["At the defaults (GRPO: 200 steps of 16 prompts x 4 samples, 30 turns; 8 GPUs a node, 4 policy and 4 user "
            "simulator):", "", *cost.table(MODELS_DIR), "",
            f"`RECIPE=qwen3-8b-tau2` ({recipe['GRPO_NUM_ROLLOUT']} steps of {recipe['GRPO_ROLLOUT_BATCH_SIZE']} "
            f"prompts x {recipe['GRPO_N_SAMPLES']} samples, {recipe['TAU2_MAX_TURNS']} turns):", "",
            *cost.table(MODELS_DIR, ("qwen3-8b",), recipe="qwen3-8b-tau2"), "", "Inputs:", "", *cost.inputs_table()]


def cost_summary() -> list[str]:
    """The README's cut of the cost table: GPU-hours per stage at the defaults, and the GRPO step, per node count."""
    lines = ["| model | nodes | SFT + RFT sampling + RFT GPU-h | GRPO GPU-h (200 steps) | GRPO step: rollout + train s |",
             "|---|---|---|---|---|"]
    for name in ("qwen3-4b-instruct-2507", "qwen3-8b", "qwen3-30b-a3b"):
        for n in NODES:
            r = cost.cost_row(name, n, MODELS_DIR)
            lines.append(f"| {name} | {n} | {r.sft_gpu_h:.2f} + {r.rft_data_gpu_h:.1f} + {r.rft_gpu_h:.2f} | "
                         f"{r.grpo_gpu_h:.0f} | {r.grpo_step_rollout_s:.0f} + {r.grpo_step_train_s:.0f} |")
    return lines


def recipe_block() -> list[str]:
    """RECIPE=qwen3-8b-tau2: the settings it sets, and where it departs from the protocol (what its dry run says)."""
    r = RECIPES["qwen3-8b-tau2"]
    return [f"`RECIPE={r.name}` sets `MODEL={r.model}` and " + ", ".join(f"`{k}={v}`" for k, v in r.settings.items())
            + ". Where it differs:", "", *(f"- {d}" for d in r.differs)]


BLOCKS = {"presets": presets_table, "sizing": sizing_table, "cost": cost_block, "cost_summary": cost_summary,
          "recipe": recipe_block}


def block(name: str) -> str:
    """A generated block with its markers, as the pages carry it."""
    return "\n".join([f"<!-- generated: python -m tau2_rl_pipeline.scale.tables {name} -->", *BLOCKS[name](),
                      "<!-- end generated -->"])


def main(argv: list[str]) -> int:
    names = argv or list(BLOCKS)
    unknown = [n for n in names if n not in BLOCKS]
    if unknown:
        print(f"error: no table {unknown[0]}: one of {', '.join(BLOCKS)}", file=sys.stderr)
        return 1
    print("\n\n".join(block(n) for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
