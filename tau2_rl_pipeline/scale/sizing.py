"""The sizing sheet: what a model preset and a GPU layout need, computed before anything starts.

A slime run that does not fit in GPU memory fails minutes in, after Ray, Megatron and SGLang have started on every
node, with an out-of-memory trace on one rank. The sheet says it first, in one line, from the model's dimensions
(the Megatron flags of scripts/models/) and the layout's parallel sizes: parameters, memory per training rank
(weights, gradients, optimizer states, the activation budget that --max-tokens-per-gpu allows), memory per SGLang
GPU (weights, the KV cache left at the memory fraction) and the work of one rollout step. Pure arithmetic, no I/O:
the stage planner (tau2_rl_pipeline/launch) prints it, the cost table (scale/cost.py) builds on it.

The memory model, per training rank (bf16 weights, fp32 gradient buffers as --accumulate-allreduce-grads-in-fp32
keeps them, Adam's fp32 master weights and two moments sharded over the data-parallel ranks: slime always turns on
Megatron's distributed optimizer; none of them on the GPU with CPU Adam, --optimizer-cpu-offload):
  dense parameters per rank  = (layers/PP x per-layer dense + embedding stage) / TP
  expert parameters per rank = layers/PP x experts/EP x per-expert            (expert tensor parallel 1)
  weights 2 B, gradients 4 B per parameter on the rank; optimizer 12 B per parameter / its data-parallel shards
  (dense: world/(TP x PP), experts: world/(EP x PP));
  activations for T = --max-tokens-per-gpu tokens, full recompute of every layer (the scripts' --recompute-*):
  each layer's bf16 input kept (T x hidden x 2 B x layers/PP) and one layer's working set while it is recomputed
  (T x 2 B x (8 x hidden + 3 x active FFN width + top-k x hidden for MoE dispatch)), divided by TP (sequence
  parallel); and the logits, [T, vocab/TP] on each rank, at the bytes per entry slime's loss keeps alive at its
  peak (LOGIT_BYTES: Megatron's Float16Module upcasts the bf16 logits to fp32, GRPO divides them by the rollout
  temperature into a second fp32 copy, and slime's vocab-parallel log-softmax (slime/utils/ppo_utils.py,
  _VocabParallelLogProbEntropy) writes the softmax into a third; for the backward it keeps the softmax and, for
  the entropy's gradient, the logits, and writes the entropy gradient into a third buffer: 12 B per entry in GRPO;
  SFT, no temperature and no entropy, 8 B).
  The rank's total must fit under the H100 less ENGINE_RESERVE (CUDA context, NCCL buffers) with ALLOCATOR_MARGIN
  more for the caching allocator's fragmentation (variable-length packed micro-batches, MoE dispatch buffers).
SGLang, per GPU of an engine of G GPUs: bf16 weights / G; KV cache = memory fraction x GPU memory - weights, each
token 2 (K, V) x layers x max(1, KV heads / G) x head dim x 2 B. Colocated (slime's --colocate), training and
rollout take turns on the same GPUs (slime offloads one while the other runs): each is checked on its own.
Host memory, per node: each training actor holds slime's pinned bf16 weight backups (slime/utils/tensor_backper.py:
the actor, and the KL reference in GRPO), with CPU Adam its optimizer shard on the host (Megatron's
HybridDeviceOptimizer: fp32 master weights, fp32 pinned gradients, two fp32 moments, 16 B per parameter, and 4 B
more for the step's temporaries), and a process base; each SGLang GPU a process of its own. The bases are fitted to
the one public measurement at hand (THUDM/slime#1851): Qwen3-30B-A3B with CPU Adam on 8 H100s, 8 training actors
at ~102 GiB each and the node at 999.9 of 1007.5 GiB when Ray's memory monitor killed one.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field, replace

from tau2_rl_pipeline.scale.placement import node_loads
from tau2_rl_pipeline.scale.turns import mean_turns

GIB = 1024**3
# An H100 80GB as nvidia-smi reports it (81559 MiB) and what its CUDA context and NCCL buffers take.
GPU_BYTES = 81559 * 1024**2
ENGINE_RESERVE = 6 * GIB
# Fragmentation: PyTorch's caching allocator reserves more than the tensors it holds, the more so with packed
# micro-batches of varying length and MoE token dispatch. 10% of the rank's tensors: an assumption, the smallest round
# margin at which the sheet agrees with slime's own page (Qwen3-30B-A3B on one node's 8 GPUs needs CPU Adam), where
# the tensors alone come to 71.1 of 73.6 GiB.
ALLOCATOR_MARGIN = 0.10
# Bytes per entry of the [tokens, vocab/TP] logits at the loss's peak (the module docstring): GRPO, SFT.
LOGIT_BYTES = {"grpo": 12, "sft": 8}
# The KV cache must hold at least one episode at the context limit the rollout allows (Qwen3's 32k window).
MIN_KV_TOKENS = 32768

# Host memory (the module docstring). Counted: 16 B per CPU Adam parameter held, 4 B of step temporaries (torch's
# foreach Adam writes the moments' square roots into a parameter-sized list), a 2 B pinned weight backup per tag.
# Fitted to THUDM/slime#1851 (102 GiB per actor, 999.9 GiB on the node, 8 actors and 8 SGLang GPUs): the rest.
CPU_ADAM_HOST_BYTES = 16 + 4
ACTOR_BASE = 16 * GIB
ENGINE_HOST = 23 * GIB
# Ray's memory monitor kills a worker past this share of the node's memory (RAY_memory_usage_threshold's default).
RAY_MEMORY_THRESHOLD = 0.95

# Episode length, for tokens per rollout step. Measured: the system turn (tau2's policy and tool schemas) is 5-7k
# tokens (bench/README.md, P2 item 4); the turns per episode follow scale/turns.py (P6's gold-implied turns and the
# assumed 5% tail). Assumed: 300 tokens per turn (the policy's reply and the observation after it).
PROMPT_TOKENS = 6000
TOKENS_PER_TURN = 300


@dataclass(frozen=True)
class Model:
    """A Qwen3 model's dimensions, as its Megatron flags give them."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    experts: int = 0
    moe_ffn: int = 0
    topk: int = 0

    @classmethod
    def from_megatron_args(cls, argv: list[str]) -> Model:
        """Reads the flags of a scripts/models/ file (MODEL_ARGS); a missing dimension is a ValueError."""
        values: dict[str, str | None] = {}
        for i, tok in enumerate(argv):
            if tok.startswith("--"):
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                values[tok] = None if nxt is None or nxt.startswith("--") else nxt

        def num(flag: str, default: int | None = None) -> int:
            if values.get(flag) is None:
                if default is None:
                    raise ValueError(f"model flags lack {flag}")
                return default
            return int(values[flag])

        return cls(layers=num("--num-layers"), hidden=num("--hidden-size"), ffn=num("--ffn-hidden-size"),
                   heads=num("--num-attention-heads"), kv_heads=num("--num-query-groups", num("--num-attention-heads")),
                   head_dim=num("--kv-channels"), vocab=num("--vocab-size"),
                   tied="--untie-embeddings-and-output-weights" not in values, experts=num("--num-experts", 0),
                   moe_ffn=num("--moe-ffn-hidden-size", 0), topk=num("--moe-router-topk", 0))

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def attention(self) -> int:
        """Per layer: Q and O projections, K and V (grouped), the Q/K norms and the two RMSNorms."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv + 2 * self.head_dim + 2 * self.hidden

    @property
    def expert(self) -> int:
        """One expert's gated MLP (or, dense, the layer's MLP)."""
        return 3 * self.hidden * (self.moe_ffn if self.moe else self.ffn)

    @property
    def layer_dense(self) -> int:
        """Per layer, what tensor parallelism splits: attention, and the MLP (dense) or the router (MoE)."""
        return self.attention + (self.hidden * self.experts if self.moe else self.expert)

    @property
    def layer_experts(self) -> int:
        return self.experts * self.expert if self.moe else 0

    @property
    def embeddings(self) -> int:
        """Input embedding, the output layer unless tied, and the final norm."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * (self.layer_dense + self.layer_experts) + self.embeddings

    @property
    def active_params(self) -> int:
        """Parameters one token goes through (MoE: top-k experts of each layer)."""
        routed = self.topk * self.expert if self.moe else 0
        return self.layers * (self.layer_dense + routed) + self.embeddings

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


def model_args_from_file(text: str) -> list[str]:
    """The MODEL_ARGS=( ... ) array of a scripts/models/ file, read as bash would (comments dropped, quotes undone)."""
    start = text.index("MODEL_ARGS=(") + len("MODEL_ARGS=(")
    return shlex.split(text[start:text.index("\n)", start)], comments=True)


@dataclass(frozen=True)
class Layout:
    """Where a stage runs: training ranks (nodes x GPUs per node), parallel sizes, and the SGLang engines."""

    nodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    cpu_adam: bool = False
    max_tokens_per_gpu: int = 12288
    rollout_gpus: int = 0  # GPUs serving SGLang engines (colocated: the training GPUs); 0: no rollout (SFT)
    engine_gpus: int = 1
    mem_fraction: float = 0.7
    colocated: bool = False
    train: bool = True  # False: an SGLang server alone (the RFT policy server)
    loss: str = "grpo"  # "grpo" or "sft": the logits' bytes and the weight backups (a KL reference in GRPO)
    host_mem: int = 0  # bytes of host memory a node has (HOST_MEM_GB); 0: unknown, not checked
    node_gpus: int = 0  # GPUs each node gives Ray (GPUS_PER_NODE); 0: gpus_per_node

    def node_loads(self) -> list[tuple[int, int]]:  # (training actors, SGLang GPUs) per node, in slime's order
        return node_loads(self.world if self.train else 0, self.rollout_gpus, self.node_gpus or self.gpus_per_node,
                          self.colocated)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Work:
    """A rollout step at the stage's settings (0 episodes: SFT, no rollout)."""

    rollout_batch: int = 0
    samples: int = 0
    max_turns: int = 30


@dataclass(frozen=True)
class Refusal:
    """Why a layout cannot run, in one line with what to change; `by` says who else would refuse it (WHY)."""

    by: str
    line: str

    @property
    def why(self) -> str:
        return WHY[self.by]


# Who else refuses what the sheet refuses: the contract tier runs slime's and Megatron's real parsers over forced
# dry runs and holds each kind to its word.
WHY = {
    "parsers": "slime's and Megatron's argument validation refuse it too",
    "memory": "the parsers accept it: they do not model memory, this estimate does",
    "sheet": "the parsers accept it: a placement rule of this cookbook",
    "sglang": "the parsers accept it: SGLang refuses it when an engine loads the model",
}


@dataclass(frozen=True)
class Sheet:
    """What size() found: parameters, bytes per training GPU and per SGLang GPU, the step's work, the refusals."""

    params: int
    active_params: int
    train_weights: int = 0
    train_grads: int = 0
    train_optimizer: int = 0
    train_activations: int = 0
    cpu_adam_host_per_node: int = 0  # CPU Adam's share of host_per_node
    host_per_actor: int = 0
    host_per_node: int = 0
    sglang_weights: int = 0
    kv_cache: int = 0
    kv_tokens: int = 0
    episodes_per_step: int = 0
    tokens_per_step: int = 0
    refusals: list[Refusal] = field(default_factory=list)

    @property
    def train_total(self) -> int:
        return self.train_weights + self.train_grads + self.train_optimizer + self.train_activations

    @property
    def refusal(self) -> Refusal | None:
        return self.refusals[0] if self.refusals else None


def tokens_per_episode(max_turns: int) -> float:
    """Estimated trained tokens of one episode: the system turn and the mean turns at this turn cap."""
    return PROMPT_TOKENS + mean_turns(max_turns) * TOKENS_PER_TURN


def structure_refusals(m: Model, lay: Layout) -> list[Refusal]:
    """The layout's shape: what Megatron's validation refuses, then what only the sheet and SGLang look at."""
    out: list[Refusal] = []
    model_par = lay.tp * lay.pp * lay.cp
    if lay.train and lay.world % model_par:
        out.append(Refusal("parsers", f"TP{lay.tp} x PP{lay.pp} x CP{lay.cp} = {model_par} does not divide the "
                                       f"{lay.world} training GPUs: change TRAIN_TP, TRAIN_PP or TRAIN_CP"))
    if lay.train and (m.heads % lay.tp or m.kv_heads % lay.tp):
        out.append(Refusal("parsers", f"TRAIN_TP={lay.tp} does not divide the model's {m.heads} attention heads and "
                                       f"{m.kv_heads} KV heads: use a TP that divides {math.gcd(m.heads, m.kv_heads)}"))
    if lay.train and m.layers % lay.pp:
        out.append(Refusal("parsers", f"TRAIN_PP={lay.pp} does not divide the model's {m.layers} layers"))
    if lay.train and lay.ep > 1 and not m.moe:
        out.append(Refusal("parsers", f"TRAIN_EP={lay.ep} needs a mixture-of-experts model: set TRAIN_EP=1"))
    if lay.train and m.moe and (m.experts % lay.ep or lay.world % (lay.ep * lay.pp)):
        out.append(Refusal("parsers", f"TRAIN_EP={lay.ep} must divide the {m.experts} experts and, with PP{lay.pp}, "
                                       f"the {lay.world} training GPUs"))
    if lay.train and lay.tp > lay.gpus_per_node:
        out.append(Refusal("sheet", f"TRAIN_TP={lay.tp} spans nodes ({lay.gpus_per_node} training GPUs a node): "
                                    "tensor parallelism over the network is too slow; lower TRAIN_TP, add TRAIN_PP"))
    if lay.rollout_gpus and lay.rollout_gpus % lay.engine_gpus:
        out.append(Refusal("sheet", f"ROLLOUT_GPUS_PER_ENGINE={lay.engine_gpus} does not divide the "
                                    f"{lay.rollout_gpus} rollout GPUs"))
    if lay.rollout_gpus and m.heads % lay.engine_gpus:
        out.append(Refusal("sglang", f"ROLLOUT_GPUS_PER_ENGINE={lay.engine_gpus} does not divide the model's "
                                     f"{m.heads} attention heads (SGLang's tensor parallelism)"))
    return out


def train_memory(m: Model, lay: Layout) -> dict[str, int]:
    """Bytes per training rank (the module docstring's model); CPU Adam's host bytes per node."""
    layers = m.layers / lay.pp
    embed_stage = m.embeddings if lay.pp == 1 else m.vocab * m.hidden
    dense = (layers * m.layer_dense + embed_stage) / lay.tp
    experts = layers * m.layer_experts / lay.ep
    optimizer = 12 * (dense / max(lay.world // (lay.tp * lay.pp), 1) + experts / max(lay.world // (lay.ep * lay.pp), 1))
    t = lay.max_tokens_per_gpu
    ffn_active = m.topk * m.moe_ffn if m.moe else m.ffn
    dispatch = m.topk * m.hidden if m.moe else 0
    activations = (t * m.hidden * 2 * layers + t * 2 * (8 * m.hidden + 3 * ffn_active + dispatch)
                   + t * m.vocab * LOGIT_BYTES[lay.loss]) / lay.tp
    cpu_adam = int(optimizer / 12 * CPU_ADAM_HOST_BYTES) if lay.cpu_adam else 0
    backups = (2 if lay.loss == "grpo" else 1) * int(2 * (dense + experts))
    return {"train_weights": int(2 * (dense + experts)), "train_grads": int(4 * (dense + experts)),
            "train_optimizer": 0 if lay.cpu_adam else int(optimizer), "train_activations": int(activations),
            "cpu_adam_host_per_node": cpu_adam * lay.gpus_per_node,
            "host_per_actor": cpu_adam + backups + ACTOR_BASE}


def host_per_node(lay: Layout, per_actor: int) -> int:
    """The heaviest node's host bytes: its training actors and its SGLang GPUs."""
    return max(actors * per_actor + engines * ENGINE_HOST for actors, engines in lay.node_loads())


def sglang_memory(m: Model, lay: Layout) -> dict[str, int]:
    """Bytes per SGLang GPU: weights, and the KV cache (and its tokens) left at the memory fraction."""
    weights = 2 * m.params // lay.engine_gpus
    kv = max(int(lay.mem_fraction * GPU_BYTES) - weights, 0)
    per_token = 2 * m.layers * max(1, m.kv_heads // lay.engine_gpus) * m.head_dim * 2
    return {"sglang_weights": weights, "kv_cache": kv, "kv_tokens": kv // per_token}


def size(m: Model, lay: Layout, work: Work = Work()) -> Sheet:
    """The sheet of model `m` on layout `lay` doing `work`, with every reason it cannot run (first one first)."""
    refusals = structure_refusals(m, lay)
    parts: dict[str, int] = {}
    if lay.train:
        parts.update(train_memory(m, lay))
    if lay.rollout_gpus:
        parts.update(sglang_memory(m, lay))
    if work.rollout_batch:
        parts["episodes_per_step"] = work.rollout_batch * work.samples
        parts["tokens_per_step"] = int(parts["episodes_per_step"] * tokens_per_episode(work.max_turns))
    parts["host_per_node"] = host_per_node(lay, parts.get("host_per_actor", 0))
    sheet = Sheet(params=m.params, active_params=m.active_params, **parts)
    budget = GPU_BYTES - ENGINE_RESERVE
    if lay.train and sheet.train_total * (1 + ALLOCATOR_MARGIN) > budget:
        fix = ("lower the max tokens per GPU or add GPUs" if lay.cpu_adam else
               "set CPU_ADAM=1, add GPUs, raise TRAIN_TP/TRAIN_EP or lower the max tokens per GPU")
        refusals.append(Refusal("memory", f"training needs {gib(sheet.train_total)} GiB per GPU, "
                                          f"{gib(sheet.train_total * (1 + ALLOCATOR_MARGIN))} with the allocator's "
                                          f"{ALLOCATOR_MARGIN:.0%} margin, over the {gib(budget)} GiB an H100 80GB "
                                          f"leaves: {fix}"))
    if lay.host_mem and sheet.host_per_node > RAY_MEMORY_THRESHOLD * lay.host_mem:
        fix = ("add nodes (CPU Adam's state shards over every training GPU; across nodes slime runs without it)"
               if lay.cpu_adam else "add nodes or put fewer training GPUs on a node")
        refusals.append(Refusal("memory", f"host memory: a node needs {gib(sheet.host_per_node)} GiB, over "
                                          f"{RAY_MEMORY_THRESHOLD:.0%} of HOST_MEM_GB={lay.host_mem / GIB:g} (Ray "
                                          f"kills an actor past it): {fix}"))
    if lay.rollout_gpus and sheet.kv_tokens < MIN_KV_TOKENS:
        refusals.append(Refusal("memory", f"SGLang's KV cache holds {sheet.kv_tokens} tokens per engine at memory "
                                          f"fraction {lay.mem_fraction} ({gib(sheet.sglang_weights)} GiB of weights a "
                                          f"GPU), under {MIN_KV_TOKENS}: raise the memory fraction or the GPUs per "
                                          "engine"))
    return replace(sheet, refusals=refusals)


def gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def render(name: str, lay: Layout, work: Work, sheet: Sheet) -> list[str]:
    """The sheet as the dry runs print it (a few lines, one screen with the plan)."""
    lines = [f"sizing {name}: {sheet.params / 1e9:.2f}e9 parameters ({sheet.active_params / 1e9:.2f}e9 active)"]
    if lay.train:
        dp = lay.world // max(lay.tp * lay.pp * lay.cp, 1)
        lines += [f"  training: {lay.nodes} node(s) x {lay.gpus_per_node} GPU(s), TP{lay.tp} PP{lay.pp} CP{lay.cp} "
                  f"EP{lay.ep} DP{dp}{', CPU Adam' if lay.cpu_adam else ''}, {lay.max_tokens_per_gpu} tokens per GPU",
                  f"  training, per GPU: {gib(sheet.train_total)} GiB = weights {gib(sheet.train_weights)} + gradients "
                  f"{gib(sheet.train_grads)} + optimizer {gib(sheet.train_optimizer)} + activations "
                  f"{gib(sheet.train_activations)}; {gib(sheet.train_total * (1 + ALLOCATOR_MARGIN))} with the "
                  f"allocator's {ALLOCATOR_MARGIN:.0%} margin (of {gib(GPU_BYTES - ENGINE_RESERVE)} GiB)"]
    lines.append(host_line(lay, sheet))
    if lay.rollout_gpus:
        engines = lay.rollout_gpus // max(lay.engine_gpus, 1)
        lines.append(f"  SGLang{', colocated' if lay.colocated else ''}: {engines} engine(s) x {lay.engine_gpus} "
                     f"GPU(s), per GPU weights {gib(sheet.sglang_weights)} GiB + KV cache {gib(sheet.kv_cache)} GiB "
                     f"({sheet.kv_tokens} tokens) at memory fraction {lay.mem_fraction}")
    if sheet.episodes_per_step:
        lines.append(f"  rollout step: {work.rollout_batch} prompts x {work.samples} samples = "
                     f"{sheet.episodes_per_step} episodes, ~{sheet.tokens_per_step / 1e6:.2f}M tokens "
                     f"(up to {work.max_turns} turns)")
    return lines


def host_line(lay: Layout, sheet: Sheet) -> str:
    """Host memory per node, in parts (the heaviest node's, when nodes differ), against HOST_MEM_GB when known."""
    loads = lay.node_loads()
    actors, engines = max(loads, key=lambda load: load[0] * sheet.host_per_actor + load[1] * ENGINE_HOST)
    parts = []
    if actors:
        adam = f"CPU Adam {gib(sheet.cpu_adam_host_per_node / lay.gpus_per_node)} + " if lay.cpu_adam else ""
        parts.append(f"{actors} training actor(s) x {gib(sheet.host_per_actor)} ({adam}weight backups "
                     f"{gib(sheet.host_per_actor - sheet.cpu_adam_host_per_node / lay.gpus_per_node - ACTOR_BASE)} "
                     f"+ process {gib(ACTOR_BASE)})")
    if engines:
        parts.append(f"{engines} SGLang GPU(s) x {gib(ENGINE_HOST)}")
    limit = (f" (of HOST_MEM_GB={lay.host_mem / GIB:g}, {RAY_MEMORY_THRESHOLD:.0%} usable)" if lay.host_mem
             else " (HOST_MEM_GB unset: not checked)")
    which = "per node" if len(set(loads)) == 1 else f"the heaviest of {len(loads)} nodes"
    return f"  host memory, {which}: {gib(sheet.host_per_node)} GiB = " + " + ".join(parts) + limit
