"""One prepared GPU check (P7 and the demo on CUDA), sized to fit one short run on a lent H100.

    bash bench/gpu_check.sh          # on the GPU machine, from the repository root; results under $OUT
    bash bench/gpu_check.sh --cpu    # the same parts at tiny sizes on the CPU (tests run it, so it cannot rot)

Parts, each on its own (one failing is recorded and the next runs), results in $OUT/gpu_check.json:
- parity: GRPO loss and gradients of the tiny model in float32, CPU against CUDA (TF32 off), within PARITY_RTOL;
- p7: the local trainer's SFT and GRPO optimizer steps (bf16 autocast over float32 weights, as the demo trains)
  on randomly initialised Qwen3 models of 0.6B and 1.7B shape at the demo's and airline's sequence lengths:
  tokens per second, MFU against the H100 SXM's 989 TFLOP/s dense bf16, peak memory;
- engine: the in-process engine's (TransformersEngine) generation throughput, tokens per second;
- demo: `tau2-rl-demo --device cuda` on mock, end to end, its report.json beside the results. It needs tau2,
  litellm and pydantic, which the GPU image lacks: bench/gpu_wheelhouse.sh builds them into .wheelhouse, which
  gpu_check.sh installs; without it this part is skipped with a line, and the others run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tau2_rl_pipeline.scale.sizing import Model, model_args_from_file  # noqa: E402

H100_BF16_DENSE_FLOPS = 989e12  # H100 SXM, dense bf16 tensor-core peak (NVIDIA's datasheet)
PARITY_RTOL = 1e-4  # float32 on both sides, TF32 off: only summation order differs (measured ~1e-6 on CPU runs)

# Qwen3-0.6B as slime's scripts/models/qwen3-0.6B.sh gives it (tests/test_gpu_check.py holds it against that file;
# the project has no preset for it, so no model file of its own). The 1.7B is read from scripts/models/.
QWEN3_0_6B = Model(layers=28, hidden=1024, ffn=3072, heads=16, kv_heads=8, head_dim=128, vocab=151936, tied=True)
# Sequence lengths: the demo's longest training sequence on mock (its small tokenizer) is under 1k tokens; airline's
# system turn alone is 5-7k tokens with Qwen3's tokenizer (bench/README.md P3), and its episodes run to 8-16k.
GPU_SIZES = {"models": ["qwen3-0.6b", "qwen3-1.7b"], "seq_lens": {"demo": 1024, "airline": 8192},
             "timed_steps": 3, "engine_model": "qwen3-0.6b", "engine_prompt": 512, "engine_new_tokens": 256}
CPU_SIZES = {"models": ["tiny"], "seq_lens": {"demo": 64, "airline": 128}, "timed_steps": 1,
             "engine_model": "tiny", "engine_prompt": 16, "engine_new_tokens": 16}
TINY = Model(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, vocab=512, tied=True)


def shape(name: str) -> Model:
    """A model's dimensions (the sizing sheet's Model): from its model file (1.7B), slime's numbers (0.6B), or the
    tiny test shape."""
    if name == "tiny":
        return TINY
    if name == "qwen3-0.6b":
        return QWEN3_0_6B
    return Model.from_megatron_args(model_args_from_file((ROOT / "scripts" / "models" / "qwen3-1.7B.sh").read_text()))


def build_model(dims: Model, device: str, seed: int = 0) -> Any:
    """A randomly initialised Qwen3ForCausalLM of these dimensions, float32, made on `device` directly."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=dims.vocab, hidden_size=dims.hidden, intermediate_size=dims.ffn,
                         num_hidden_layers=dims.layers, num_attention_heads=dims.heads,
                         num_key_value_heads=dims.kv_heads, head_dim=dims.head_dim, tie_word_embeddings=dims.tied,
                         max_position_embeddings=32768, rope_theta=1_000_000)
    torch.manual_seed(seed)
    with torch.device(device):
        return Qwen3ForCausalLM(config).float()


def train_flops_per_token(dims: Model, seq_len: int) -> float:
    """Model FLOPs per trained token (forward + backward), PaLM's accounting: 6 N (N with the output layer, since
    tied embeddings still multiply there) + 12 L H Q T for attention over T tokens (causal masking not halved)."""
    return 6.0 * dims.params + 12.0 * dims.layers * dims.heads * dims.head_dim * seq_len


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def random_examples(kind: str, seq_len: int, vocab: int, count: int, seed: int) -> list[Any]:
    """`count` sequences of `seq_len` random ids: SFT (every token after the first half a target) or GRPO (the
    second half a response with rollout log-probs and an advantage of alternating sign)."""
    from tau2_rl_pipeline.local.examples import TrainExample, examples_from_trajectory

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        ids = torch.randint(0, vocab, (seq_len,), generator=g).tolist()
        half = seq_len // 2
        if kind == "sft":
            out.append(TrainExample(input_ids=ids, loss_mask=[0] * half + [1] * (seq_len - half)))
        else:
            out.append(examples_from_trajectory(ids[:half], ids[half:], [1] * (seq_len - half),
                                                [-2.0] * (seq_len - half), advantage=1.0 if i % 2 == 0 else -1.0))
    return out


def p7(sizes: dict, device: str, dtype: str, log: Any) -> list[dict[str, Any]]:
    """Tokens per second, MFU and peak memory of the local trainer's SFT and GRPO steps, per model and length."""
    from tau2_rl_pipeline.local.trainer import LocalTrainer, TrainConfig

    rows = []
    for name in sizes["models"]:
        dims = shape(name)
        for label, seq_len in sizes["seq_lens"].items():
            for kind in ("sft", "grpo"):
                row: dict[str, Any] = {"model": name, "params": dims.params, "seq": label, "seq_len": seq_len,
                                       "step": kind, "dtype": dtype}
                trainer = None
                try:
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                        torch.cuda.reset_peak_memory_stats()
                    with tempfile.TemporaryDirectory() as tmp:
                        trainer = LocalTrainer(build_model(dims, device), TrainConfig(
                            log_jsonl=Path(tmp) / "m.jsonl", device=device, dtype=dtype, micro_batch_size=1,
                            lr=1e-6))
                        step = trainer.sft if kind == "sft" else trainer.grpo_step
                        batch = random_examples(kind, seq_len, dims.vocab, 2, seed=1)
                        step(batch[:1])  # warm-up: kernels chosen, allocator grown
                        synchronize(device)
                        t0 = time.perf_counter()
                        for _ in range(sizes["timed_steps"]):
                            step(batch)
                        synchronize(device)
                        wall = time.perf_counter() - t0
                    tokens = sizes["timed_steps"] * len(batch) * seq_len
                    row.update(tokens_per_s=tokens / wall, wall_s=wall,
                               mfu=tokens * train_flops_per_token(dims, seq_len) / wall / H100_BF16_DENSE_FLOPS)
                    if device.startswith("cuda"):
                        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
                except Exception as exc:  # noqa: BLE001  (an OOM at one size must not stop the others)
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                finally:
                    del trainer
                rows.append(row)
                log(f"p7 {json.dumps(row)}")
    return rows


def parity(device: str, log: Any) -> dict[str, Any]:
    """GRPO loss and gradients of the tiny model in float32 on CPU and on `device`: their largest relative gap."""
    from tau2_rl_pipeline.learning.losses import grpo_loss
    from tau2_rl_pipeline.local.examples import collate
    from tau2_rl_pipeline.local.trainer import token_logprobs

    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    examples = random_examples("grpo", 48, TINY.vocab, 4, seed=2)
    results = {}
    for where in ("cpu", device):
        model = build_model(TINY, where, seed=3)
        batch = collate(examples, 0, torch.device(where))
        logprobs, _ = token_logprobs(model, batch.input_ids, batch.attention_mask)
        old = torch.where(batch.has_old, batch.old_logprobs, logprobs.detach())
        loss, _ = grpo_loss(logprobs, old, batch.advantages, batch.loss_mask, eps_clip=0.2, eps_clip_high=0.28,
                            reduction="sample_mean", num_tokens=int(batch.loss_mask.sum()),
                            num_samples=len(examples))
        loss.backward()
        results[where] = (float(loss), {n: p.grad.detach().cpu() for n, p in model.named_parameters()})
    (loss_a, grads_a), (loss_b, grads_b) = results["cpu"], results[device]
    worst = max(float((grads_a[n] - grads_b[n]).abs().max() / grads_a[n].abs().max().clamp_min(1e-12))
                for n in grads_a)
    out = {"device": device, "loss_cpu": loss_a, "loss_device": loss_b,
           "loss_rel_diff": abs(loss_a - loss_b) / max(abs(loss_a), 1e-12), "grad_max_rel_diff": worst,
           "rtol": PARITY_RTOL}
    out["ok"] = out["loss_rel_diff"] <= PARITY_RTOL and worst <= PARITY_RTOL
    log(f"parity {json.dumps(out)}")
    return out


def engine(sizes: dict, device: str, dtype: str, log: Any) -> dict[str, Any]:
    """Tokens per second of TransformersEngine sampling `engine_new_tokens` after a random prompt (EOS off)."""
    from tau2_rl_pipeline.rollout.engines import SamplingParams, TransformersEngine

    dims = shape(sizes["engine_model"])
    eng = TransformersEngine(build_model(dims, device), device=device, dtype=dtype, seed=0, eos_token_ids=())
    prompt = torch.randint(0, dims.vocab, (sizes["engine_prompt"],),
                           generator=torch.Generator().manual_seed(4)).tolist()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=sizes["engine_new_tokens"])
    asyncio.run(eng.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=4)))  # warm-up
    synchronize(device)
    t0 = time.perf_counter()
    result = asyncio.run(eng.generate(prompt, sampling))
    synchronize(device)
    wall = time.perf_counter() - t0
    out = {"model": sizes["engine_model"], "dtype": dtype, "prompt": len(prompt),
           "new_tokens": len(result.output_ids), "tokens_per_s": len(result.output_ids) / wall, "wall_s": wall}
    log(f"engine {json.dumps(out)}")
    return out


def demo(out: Path, device: str, cpu: bool, log: Any, timeout_s: float) -> dict[str, Any]:
    """The mock demo end to end (on the CPU with a few steps of each stage), its report copied beside the results."""
    try:
        import tau2  # noqa: F401
    except ModuleNotFoundError:
        line = "skipped: tau2 is not installed here (bash bench/gpu_wheelhouse.sh, then carry .wheelhouse)"
        log(f"demo {line}")
        return {"skipped": line}
    cmd = [sys.executable, "-m", "tau2_rl_pipeline.local.pipeline", "--device", device, "--out", str(out / "demo")]
    if cpu:
        cmd += ["--sft-epochs", "1", "--rft-samples", "1", "--rft-epochs", "1", "--grpo-steps", "1",
                "--grpo-tasks-per-step", "1", "--grpo-n", "2", "--eval-samples", "1", "--max-new-tokens", "16",
                "--hidden-size", "32", "--vocab-size", "512"]
    t0 = time.perf_counter()
    with open(out / "demo.log", "w") as sink:
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                  str(ROOT), os.environ.get("PYTHONPATH")]))})
    result: dict[str, Any] = {"exit": proc.returncode, "wall_s": time.perf_counter() - t0, "log": "demo.log"}
    report = out / "demo" / "report.json"
    if report.is_file():
        stages = json.loads(report.read_text())["stages"]
        result["pass@1"] = {s: v["pass@1"]["value"] for s, v in stages.items()}
        (out / "demo_report.json").write_text(report.read_text())
    log(f"demo {json.dumps(result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what the tests run)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "outputs/gpu_check"))
    parser.add_argument("--parts", default="parity,p7,engine,demo")
    parser.add_argument("--demo-timeout-s", type=float, default=None,
                        help="stop the demo after this long (default 300 s on a GPU; 1500 s with --cpu, where a "
                             "loaded 2-core machine runs its five processes slowly)")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); --cpu runs the tiny sizes",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    device, dtype = ("cpu", "float32") if args.cpu else ("cuda", "bfloat16")
    sizes = CPU_SIZES if args.cpu else GPU_SIZES
    log_file = open(args.out / "gpu_check.log", "a")

    def log(line: str) -> None:
        stamped = f"[{time.strftime('%H:%M:%S')}] {line}"
        print(stamped, flush=True)
        log_file.write(stamped + "\n")
        log_file.flush()

    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "mode": "cpu" if args.cpu else "gpu", "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or "cpu",
        "command": "bash bench/gpu_check.sh" + (" --cpu" if args.cpu else "")}
    log(f"gpu_check: {results['device']}, torch {results['torch']}, parts {args.parts}")
    parts = {"parity": lambda: parity("cpu" if args.cpu else "cuda", log),
             "p7": lambda: p7(sizes, device, dtype, log),
             "engine": lambda: engine(sizes, device, dtype, log),
             "demo": lambda: demo(args.out, device, args.cpu, log, args.demo_timeout_s or (1500.0 if args.cpu else 300.0))}
    failed = []
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        try:
            results[name] = parts[name]()
        except Exception as exc:  # noqa: BLE001  (each part on its own: record it, run the next)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"{name} FAILED: {traceback.format_exc()}")
            failed.append(name)
        results.setdefault("part_wall_s", {})[name] = round(time.perf_counter() - t0, 1)
        (args.out / "gpu_check.json").write_text(json.dumps(results, indent=2) + "\n")
    bad = [r for r in results.get("p7", []) if "error" in r]
    ok = not failed and not bad and results.get("parity", {}).get("ok", True) and \
        results.get("demo", {}).get("exit", 0) == 0
    log(f"gpu_check: {'done' if ok else 'PROBLEMS'} -> {args.out / 'gpu_check.json'}"
        + (f" (failed: {', '.join(failed)})" if failed else "") + (f" ({len(bad)} p7 rows failed)" if bad else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
