"""GRPO_ALGORITHM=awsft never applies TIS: slime 624b824's own `loss_function` (slime/backends/megatron_utils/loss.py)
with `--loss-type custom_loss` and the project's AWSFT loss gives the same loss and gradient whatever `--use-tis`
says and whatever the rollout log-probs are, so turns sampled by older weights would be imitated as if the current
policy had sampled them. That is why scripts/train_grpo.sh refuses GRPO_MASK_OFFPOLICY=0 under awsft (and passes no
--use-tis there). Run in a child process: Megatron's parallel state is global (as test_slime_awsft.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from contract_tier import MEGATRON_DIR, SGLANG_DOUBLE, SLIME_DIR

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

    out = []
    for use_tis, shift in ((False, 0.0), (True, 0.0), (True, 1.5), (True, -1.5)):
        torch.manual_seed(0)
        total, responses = [6, 5], [3, 4]
        logits = torch.randn(1, sum(total), 11, requires_grad=True)
        tokens = [torch.randint(0, 11, (n,)) for n in total]
        args = Namespace(loss_type="custom_loss", custom_loss_function_path=sys.argv[1],
                         calculate_per_token_loss=False, recompute_loss_function=False, allgather_cp=False,
                         rollout_temperature=1.0, log_probs_chunk_size=-1, entropy_coef=0.0, use_kl_loss=False,
                         kl_loss_coef=0.0, kl_loss_type="low_var_kl", use_tis=use_tis, tis_clip=2.0,
                         tis_clip_low=0.0, custom_tis_function_path=None, get_mismatch_metrics=False,
                         use_rollout_logprobs=False)
        batch = {"unconcat_tokens": tokens, "total_lengths": total, "response_lengths": responses,
                 "loss_masks": [torch.ones(n) for n in responses], "rollout_mask_sums": None,
                 "advantages": [a * torch.ones(n) for a, n in zip([1.5, -0.5], responses)],
                 "rollout_log_probs": [torch.full((n,), -2.0 + shift) for n in responses],
                 "ref_log_probs": [torch.full((n,), -2.0) for n in responses]}
        loss, _, _ = loss_function(args, batch, 1, len(total), logits)
        loss.backward()
        out.append([float(loss), float(logits.grad.norm())])
    print(json.dumps(out))
""")


def test_tis_never_applies_under_awsft():
    paths = [str(MEGATRON_DIR), str(SLIME_DIR), str(SGLANG_DOUBLE), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run([sys.executable, "-c", PROBE, "tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    (loss, grad), *others = runs
    assert grad > 0
    for other_loss, other_grad in others:  # --use-tis on, rollout log-probs shifted by 0, +1.5, -1.5
        assert other_loss == pytest.approx(loss, abs=1e-7) and other_grad == pytest.approx(grad, abs=1e-7)
