"""The local backend's trainer: masked-NLL SFT, GRPO (PPO-clip) and advantage-weighted SFT steps on a causal LM.

    trainer = LocalTrainer("out/sft", TrainConfig(log_jsonl="out/metrics.jsonl", lr=1e-5))
    trainer.sft([sft_example_from_chat(tokenizer, chat, tools) for chat, tools in demos])
    trainer.grpo_step([examples_from_trajectory(t.prompt_ids, t.response_ids, t.loss_mask, t.rollout_logprobs, a)
                       for t, a in zip(trajectories, advantages)])
    trainer.awsft_step(examples_with_weights)  # or: advantage-weighted SFT (learning/awsft.py's weights)
    trainer.save("out/step_1")  # a HF model directory: AutoModelForCausalLM / TransformersEngine.from_pretrained

The loss definitions are slime's (see losses.py for which slime function each one follows). An SFT step
normalizes by the mask-1 token count of all its micro-batches (slime's --calculate-per-token-loss, as slime's SFT
runs); a GRPO or AWSFT step as `loss_reduction` says (TAU2_LOSS_REDUCTION; default slime's per-sample mean over
the step's samples). Every micro-batch gets the step's totals, so splitting a step into more, smaller
micro-batches changes memory use, not the update. Weights stay float32 and `dtype`
only sets the autocast compute dtype, so bf16 on a GPU does not round the optimizer's updates away.
Every optimizer step writes one JSON line to `log_jsonl`, and to wandb when `wandb_project` is set.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from tau2_rl_pipeline.files import atomic_write_bytes, staging_dir
from tau2_rl_pipeline.launch.recipe import POLICY_LOSS
from tau2_rl_pipeline.learning.losses import (
    REDUCTIONS,
    gather_logprobs,
    grpo_loss,
    local_awsft_loss,
    merge_metrics,
    sft_loss,
    step_tokens,
)
from tau2_rl_pipeline.local.examples import Batch, TrainExample, collate
from tau2_rl_pipeline.local.train_log import MetricsSink, progress

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


SFT_SAVE_EVERY_S = 30.0  # LocalTrainer.sft with resume_dir: at most this much training lost to Ctrl-C


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of the local trainer (defaults: slime's GRPO optimizer settings, lr for SFT)."""

    log_jsonl: str | Path  # one JSON line per optimizer step, always
    lr: float = 1e-5
    weight_decay: float = POLICY_LOSS.weight_decay  # AdamW, on matrices only: not on norms or biases (Megatron's default groups)
    betas: tuple[float, float] = POLICY_LOSS.betas
    micro_batch_size: int = 1  # sequences per forward pass
    grad_accum_steps: int = 1  # SFT: micro-batches per optimizer step (GRPO: one step per grpo_step call)
    max_grad_norm: float = 1.0  # clip the global grad norm to this (the logged grad_norm is before clipping)
    epochs: int = 1  # SFT passes over the examples
    eps_clip: float = POLICY_LOSS.eps_clip  # PPO lower clip: ratio >= 1 - eps_clip
    eps_clip_high: float = POLICY_LOSS.eps_clip_high  # PPO upper clip: ratio <= 1 + eps_clip_high (slime's clip-higher)
    kl_coef: float = 0.0  # GRPO and AWSFT: > 0 keeps a frozen copy of the starting model, adds kl_coef * low_var_kl
    entropy_coef: float = 0.0  # loss -= entropy_coef * mean entropy
    rollout_temperature: float = 1.0  # GRPO: logits / T, to score tokens under the distribution they came from
    loss_reduction: str = POLICY_LOSS.loss_reduction  # GRPO and AWSFT: sample_mean (slime's default) or token_mean (losses.py)
    device: str = "cpu"
    dtype: str = "float32"  # autocast compute dtype: float32 or bfloat16
    seed: int = 0  # torch RNG and example shuffling
    wandb_project: str | None = None  # also log to wandb (offline when WANDB_API_KEY is unset)

    def __post_init__(self) -> None:
        checks = [
            (self.lr > 0, f"lr must be > 0, got {self.lr}"),
            (self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}"),
            (len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             f"betas must be two numbers in [0, 1), got {self.betas}"),
            (self.micro_batch_size >= 1, f"micro_batch_size must be >= 1, got {self.micro_batch_size}"),
            (self.grad_accum_steps >= 1, f"grad_accum_steps must be >= 1, got {self.grad_accum_steps}"),
            (self.max_grad_norm > 0, f"max_grad_norm must be > 0, got {self.max_grad_norm}"),
            (self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
            (0 <= self.eps_clip < 1, f"eps_clip must be in [0, 1), got {self.eps_clip}"),
            (self.eps_clip_high >= 0, f"eps_clip_high must be >= 0, got {self.eps_clip_high}"),
            (self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}"),
            (math.isfinite(self.entropy_coef), f"entropy_coef must be finite, got {self.entropy_coef}"),
            (self.rollout_temperature > 0, f"rollout_temperature must be > 0, got {self.rollout_temperature}"),
            (self.loss_reduction in REDUCTIONS,
             f"loss_reduction must be one of {', '.join(REDUCTIONS)}, got {self.loss_reduction!r}"),
            (self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"),
            (bool(str(self.log_jsonl)), "log_jsonl must be a file path"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                   with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each token given the ones before it ([batch, seq], 0 at position 0), and the entropy of the
    distribution it was predicted from (None unless asked)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    logprobs, entropy = gather_logprobs(logits[:, :-1], input_ids[:, 1:], temperature=temperature,
                                        with_entropy=with_entropy)
    pad = logprobs.new_zeros(logprobs.shape[0], 1)
    return torch.cat([pad, logprobs], 1), None if entropy is None else torch.cat([pad, entropy], 1)


def _chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class LocalTrainer:
    """Trains one causal LM in this process. Build it from a HF model directory (weights and tokenizer) or from
    a model object plus its tokenizer; `close()` finishes the wandb run, if any."""

    def __init__(self, model_dir_or_model: str | Path | Any, cfg: TrainConfig, tokenizer: Any = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {cfg.device!r} requested but torch.cuda.is_available() is False")
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        torch.manual_seed(cfg.seed)  # dropout, if a model has any; example order has its own RNG
        self._shuffle = random.Random(cfg.seed)
        if isinstance(model_dir_or_model, (str, Path)):
            model = AutoModelForCausalLM.from_pretrained(str(model_dir_or_model), dtype=torch.float32)
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(str(model_dir_or_model))
        else:
            model = model_dir_or_model
        self.model = model.to(device=self.device, dtype=torch.float32).train()
        self.tokenizer = tokenizer
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad if pad is not None else (getattr(model.config, "pad_token_id", None) or 0))
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
             {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
            lr=cfg.lr, betas=cfg.betas)
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.step = 0
        self.sink = MetricsSink(cfg.log_jsonl, cfg.wandb_project, {**asdict(cfg), "log_jsonl": str(cfg.log_jsonl)})

    # -- forward passes ---------------------------------------------------------------------------------
    def _logprobs(self, model: Any, batch: Batch, *, temperature: float = 1.0,
                  with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        dtype = DTYPES[self.cfg.dtype]
        with torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32):
            return token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=temperature,
                                  with_entropy=with_entropy)

    def evaluate(self, examples: Sequence[TrainExample]) -> float:
        """Masked token-mean NLL of `examples` under the current weights (no update)."""
        total = sum(e.num_targets for e in examples)
        if total == 0:
            raise ValueError("no example has a mask-1 token to evaluate")
        nll = 0.0
        self.model.eval()
        # named for what it is: a loss pass over the training examples, not the Pass@K evaluation
        with torch.no_grad(), progress(f"loss over {len(examples)} examples (no update)",
                                        math.ceil(len(examples) / self.cfg.micro_batch_size)) as advance:
            for chunk in _chunks(examples, self.cfg.micro_batch_size):
                batch = collate(chunk, self.pad_id, self.device)
                nll += float(sft_loss(self._logprobs(self.model, batch)[0], batch.loss_mask, num_tokens=total)[0])
                advance()
        self.model.train()
        return nll

    def loss_before(self, examples: Sequence[TrainExample], resume_dir: str | Path) -> float:
        """`evaluate(examples)` under the starting weights (call it before `sft`), kept in `resume_dir` beside
        SFT's state: a resumed run reads it back instead of repeating the pass (airline's 30 examples: 33 s on 2
        quiet cores, minutes under load)."""
        path, fingerprint = Path(resume_dir) / "loss_before.json", self._fingerprint(examples)
        try:
            kept = json.loads(path.read_text())
            if kept["fingerprint"] == fingerprint:
                print(f"loss over {len(examples)} examples before training: {kept['loss']:.4f} (kept from the "
                      "stopped run, not computed again)", file=sys.stderr, flush=True)
                return float(kept["loss"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none kept, or for other examples or settings
        loss = self.evaluate(examples)
        atomic_write_bytes(path, json.dumps({"fingerprint": fingerprint, "loss": loss}).encode())
        return loss

    def _fingerprint(self, examples: Sequence[TrainExample]) -> dict:
        """What SFT's resume state and the kept starting loss belong to: the examples and the settings."""
        rows = json.dumps([[list(e.input_ids), list(e.loss_mask)] for e in examples]).encode()
        return json.loads(json.dumps({
            "examples": hashlib.sha256(rows).hexdigest(),
            "config": {k: v for k, v in asdict(self.cfg).items() if k not in ("log_jsonl", "wandb_project")}},
            default=str))

    # -- optimizer steps ----------------------------------------------------------------------------------
    def _optimizer_step(self, examples: Sequence[TrainExample], micro_loss: Callable[[Batch, int], tuple],
                        advance: Callable[..., None] | None = None) -> dict[str, Any]:
        """Accumulate gradients over micro-batches, each loss divided by the step's total target count (an example
        with none counting as one, as slime counts a wholly masked sample: losses.step_tokens), then clip and step.
        A non-finite gradient stops training rather than writing NaN weights."""
        targets = sum(e.num_targets for e in examples)
        if targets == 0:
            raise ValueError(f"step {self.step + 1}: no example has a mask-1 token to train on")
        num_tokens = step_tokens(e.num_targets for e in examples)
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        for chunk in _chunks(examples, self.cfg.micro_batch_size):
            loss, part = micro_loss(collate(chunk, self.pad_id, self.device), num_tokens)
            loss.backward()
            metrics = merge_metrics(metrics, part)
            if advance is not None:
                advance()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm))
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"step {self.step + 1}: gradient norm is {grad_norm}; lower lr or use float32")
        self.optimizer.step()
        self.step += 1
        return {"step": self.step, **metrics, "grad_norm": grad_norm, "lr": self.optimizer.param_groups[0]["lr"],
                "tokens": targets, "sequences": len(examples)}

    def _sft_micro_loss(self, batch: Batch, num_tokens: int) -> tuple[torch.Tensor, dict[str, float]]:
        return sft_loss(self._logprobs(self.model, batch)[0], batch.loss_mask, num_tokens=num_tokens)

    def sft(self, examples: Sequence[TrainExample], *, eval_examples: Sequence[TrainExample] | None = None,
            resume_dir: str | Path | None = None, save_every_s: float = SFT_SAVE_EVERY_S) -> list[dict[str, Any]]:
        """`epochs` shuffled passes, micro_batch_size * grad_accum_steps sequences per optimizer step; with
        `eval_examples`, the last step of each epoch also records their masked loss as eval_loss.

        With `resume_dir`, the training state (weights, optimizer, random generators, position) is saved there at
        each epoch's end and after any step `save_every_s` seconds after the last save; a later call on a trainer
        built the same way, with the same examples, continues from it (Ctrl-C loses at most that much), ending
        with the weights an uninterrupted run ends with. A state saved for other examples or settings is ignored."""
        if not examples:
            raise ValueError("sft needs at least one example")
        per_step = self.cfg.micro_batch_size * self.cfg.grad_accum_steps
        steps_per_epoch = math.ceil(len(examples) / per_step)
        fingerprint = self._fingerprint(examples)
        state_path = Path(resume_dir) / "sft_state.pt" if resume_dir is not None else None
        start_epoch, start_index = 0, 0
        if state_path is not None and state_path.is_file():
            state = torch.load(state_path, map_location=self.device, weights_only=False)
            if state["fingerprint"] == fingerprint:
                self.model.load_state_dict(state["model"])
                self.optimizer.load_state_dict(state["optimizer"])
                torch.set_rng_state(state["torch_rng"])
                self._shuffle.setstate(state["shuffle_at_epoch_start"])
                self.step, start_epoch, start_index = state["step"], state["epoch"], state["index"]
                print(f"sft: resuming at step {start_epoch * steps_per_epoch + start_index} of "
                      f"{self.cfg.epochs * steps_per_epoch} from {state_path}", file=sys.stderr, flush=True)
        records = []
        last_save = time.monotonic()
        done = start_epoch * steps_per_epoch + start_index
        with progress("sft", self.cfg.epochs * steps_per_epoch, done) as advance:
            for epoch in range(start_epoch, self.cfg.epochs):
                shuffle_at_epoch_start = self._shuffle.getstate()
                order = list(examples)
                self._shuffle.shuffle(order)
                for i, chunk in enumerate(_chunks(order, per_step)):
                    if epoch == start_epoch and i < start_index:
                        continue  # trained before the resume
                    record = {"stage": "sft", "epoch": epoch, **self._optimizer_step(chunk, self._sft_micro_loss)}
                    if eval_examples and i == steps_per_epoch - 1:
                        record["eval_loss"] = self.evaluate(eval_examples)
                    self.sink.write(record)
                    records.append(record)
                    advance(status=f"loss {record['loss']:.4f}")
                    last = i == steps_per_epoch - 1
                    if state_path is not None and (last or time.monotonic() - last_save >= save_every_s):
                        self._save_sft_state(state_path, fingerprint, shuffle_at_epoch_start if not last else
                                             self._shuffle.getstate(), epoch + last, 0 if last else i + 1)
                        last_save = time.monotonic()
        return records

    def _save_sft_state(self, path: Path, fingerprint: dict, shuffle_state: Any, epoch: int, index: int) -> None:
        """The state to continue SFT from (epoch, index: the next step's place), written whole or not at all."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"fingerprint": fingerprint, "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                    "shuffle_at_epoch_start": shuffle_state, "step": self.step, "epoch": epoch, "index": index}, tmp)
        os.replace(tmp, path)

    def _grpo_micro_loss(self, batch: Batch, num_tokens: int, *, num_samples: int
                         ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        logprobs, entropy = self._logprobs(self.model, batch, temperature=cfg.rollout_temperature,
                                           with_entropy=True)
        old = torch.where(batch.has_old, batch.old_logprobs, logprobs.detach())
        ref = self._reference_logprobs(batch, cfg.rollout_temperature)
        return grpo_loss(logprobs, old, batch.advantages, batch.loss_mask, eps_clip=cfg.eps_clip,
                         eps_clip_high=cfg.eps_clip_high, reduction=cfg.loss_reduction, num_tokens=num_tokens,
                         num_samples=num_samples,
                         entropy=entropy if cfg.entropy_coef else entropy.detach(), entropy_coef=cfg.entropy_coef,
                         ref_logprobs=ref, kl_coef=cfg.kl_coef)

    def _reference_logprobs(self, batch: Batch, temperature: float) -> torch.Tensor | None:
        if self.reference is None:
            return None
        with torch.no_grad():
            return self._logprobs(self.reference, batch, temperature=temperature)[0]

    def _awsft_micro_loss(self, batch: Batch, num_tokens: int, *, num_samples: int
                          ) -> tuple[torch.Tensor, dict[str, float]]:
        # Scored at the rollout temperature, as slime scores every loss (and its reference log-probs).
        temperature = self.cfg.rollout_temperature
        logprobs = self._logprobs(self.model, batch, temperature=temperature)[0]
        return local_awsft_loss(logprobs, batch.weights, batch.loss_mask, reduction=self.cfg.loss_reduction,
                                num_tokens=num_tokens, num_samples=num_samples,
                                ref_logprobs=self._reference_logprobs(batch, temperature), kl_coef=self.cfg.kl_coef)

    def grpo_step(self, examples: Sequence[TrainExample]) -> dict[str, Any]:
        """One optimizer step on a rollout batch (all its micro-batches accumulated). Examples without
        old_logprobs are scored against the current weights (ratio 1, as slime without rollout log-probs)."""
        return self._policy_step("grpo", examples, self._grpo_micro_loss)

    def awsft_step(self, examples: Sequence[TrainExample]) -> dict[str, Any]:
        """One advantage-weighted SFT step on a rollout batch: each example's NLL weighted by its `weight` (the
        recipe's, learning/awsft.py), plus kl_coef * low_var_kl to the starting model. old_logprobs are not used
        (no importance ratio: the stability of SFT)."""
        return self._policy_step("awsft", examples, self._awsft_micro_loss)

    def _policy_step(self, stage: str, examples: Sequence[TrainExample], micro_loss: Callable) -> dict[str, Any]:
        """One step reduced as TrainConfig.loss_reduction says, over the step's tokens or its samples (every
        micro-batch gets the step's totals, so splitting changes memory use, not the update)."""
        if not examples:
            raise ValueError(f"{stage}_step needs at least one example")
        micro_loss = functools.partial(micro_loss, num_samples=len(examples))
        with progress(f"{stage} step {self.step + 1}", math.ceil(len(examples) / self.cfg.micro_batch_size)) as advance:
            record = {"stage": stage, **self._optimizer_step(examples, micro_loss, advance),
                      "advantage_mean": sum(e.advantage for e in examples) / len(examples)}
        self.sink.write(record)
        return record

    # -- checkpoints ----------------------------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> Path:
        """Write weights and tokenizer as a HF model directory. It appears complete or not at all (staged
        beside it, then renamed); an existing non-empty directory is refused, never overwritten."""
        out = Path(out_dir)
        if self.tokenizer is None:
            raise ValueError("no tokenizer: pass tokenizer= to LocalTrainer to save a loadable model directory")
        if out.exists() and any(out.iterdir()):
            raise FileExistsError(f"{out} exists and is not empty; save each checkpoint to a new directory")
        staging = staging_dir(out)
        try:
            self.model.save_pretrained(str(staging))
            self.tokenizer.save_pretrained(str(staging))
            if out.exists():
                out.rmdir()
            staging.rename(out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return out

    def close(self) -> None:
        self.sink.close()
