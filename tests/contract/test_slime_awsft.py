"""Advantage-weighted SFT inside slime: slime 624b824's own `loss_function` (slime/backends/megatron_utils/loss.py,
`--loss-type custom_loss`) loads tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function by its dotted path and calls it
with its batch, packed logits and per-sample-mean reducer, on CPU (Megatron's parallel state over a one-process
gloo group). It runs in a child process: the process group is global state no other test should inherit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from contract_tier import MEGATRON_DIR, SGLANG_DOUBLE, SLIME_DIR

from tau2_rl_pipeline.learning.losses import awsft_weights, low_var_kl

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import json, socket, sys
    from argparse import Namespace
    import torch, torch.distributed as dist
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    from megatron.core import parallel_state as mpu
    mpu.initialize_model_parallel(1, 1)
    from slime.backends.megatron_utils.loss import loss_function

    spec = json.loads(sys.argv[1])
    torch.manual_seed(0)
    total, responses = spec["total_lengths"], spec["response_lengths"]
    logits = torch.randn(1, sum(total), spec["vocab"], requires_grad=True)
    tokens = [torch.randint(0, spec["vocab"], (n,)) for n in total]
    args = Namespace(loss_type="custom_loss", custom_loss_function_path=spec["path"], calculate_per_token_loss=False,
                     recompute_loss_function=False, allgather_cp=False, rollout_temperature=spec["temperature"],
                     log_probs_chunk_size=-1, entropy_coef=0.0, use_kl_loss=True, kl_loss_coef=spec["kl_coef"],
                     kl_loss_type="low_var_kl")
    batch = {"unconcat_tokens": tokens, "total_lengths": total, "response_lengths": responses,
             "loss_masks": [torch.tensor(m, dtype=torch.float32) for m in spec["loss_masks"]],
             "rollout_mask_sums": None,
             "advantages": [a * torch.ones(n) for a, n in zip(spec["advantages"], responses)],
             "ref_log_probs": [torch.tensor(r) for r in spec["ref_log_probs"]]}
    loss, normalizer, log = loss_function(args, batch, 1, len(total), logits)
    loss.backward()
    print(json.dumps({"loss": float(loss), "keys": log["keys"], "values": log["values"].tolist(),
                      "logits": logits.detach().tolist(), "tokens": [t.tolist() for t in tokens],
                      "grad_norm": float(logits.grad.norm())}))
""")


def test_slimes_loss_function_runs_the_custom_loss_with_what_it_expects():
    """The result is the formula on the same numbers, rescaled as slime rescales its own losses (per-sample mean,
    times num_microbatches / global batch = 1/2 here), with slime's rollout temperature applied to the logits."""
    spec = {"path": "tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function", "vocab": 11, "kl_coef": 0.05,
            "temperature": 0.7, "total_lengths": [6, 5], "response_lengths": [3, 4],
            "loss_masks": [[1, 1, 0], [1, 0, 1, 1]], "advantages": [1.5, -0.5],
            "ref_log_probs": [[-2.0, -2.5, -1.0], [-3.0, -2.0, -2.2, -2.4]]}
    paths = [str(MEGATRON_DIR), str(SLIME_DIR), str(SGLANG_DOUBLE), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(spec)], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    # The same loss computed here from the same logits, laid out as slime packs them (position t predicts t+1).
    logp_all = torch.log_softmax(torch.tensor(out["logits"])[0] / spec["temperature"], dim=-1)
    expected, offset = 0.0, 0
    for toks, total, resp, mask, adv, ref in zip(out["tokens"], spec["total_lengths"], spec["response_lengths"],
                                                 spec["loss_masks"], spec["advantages"], spec["ref_log_probs"]):
        lp = torch.stack([logp_all[p, toks[p - offset + 1]] for p in range(offset + total - resp - 1,
                                                                           offset + total - 1)])
        m = torch.tensor(mask, dtype=torch.float32)
        weight = float(awsft_weights(torch.tensor(adv)))
        expected += float(((-weight * lp + spec["kl_coef"] * low_var_kl(lp, torch.tensor(ref))) * m).sum() / m.sum())
        offset += total
    assert out["loss"] == pytest.approx(expected / 2, rel=1e-5)
    assert {"loss", "awsft_nll", "awsft_weight", "kl"} <= set(out["keys"])
    assert out["grad_norm"] > 0
