"""The policy losses inside slime: slime 624b824's own `loss_function` (slime/backends/megatron_utils/loss.py) runs
its own PPO-clip loss (`--loss-type policy_loss`) and our AWSFT loss (`--loss-type custom_loss`, loaded by its
dotted path) with its batch, packed logits and reducers, on CPU (Megatron's parallel state over a one-process gloo
group), with and without `--calculate-per-token-loss`; the local trainer's functions give the same values on the
same tensors for each TAU2_LOSS_REDUCTION. It runs in a child process: the process group is global state no other
test should inherit. Then AWSFT's baseline end to end: the difficulty stage's task rows, slime's data source, our
generate and slime's train-data conversion (the reward post-process) give each sample the recipe's weight."""

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

from tau2_rl_pipeline.learning import awsft
from tau2_rl_pipeline.learning.losses import gather_logprobs, grpo_loss, local_awsft_loss

ROOT = Path(__file__).resolve().parents[2]
AWSFT_PATH = "tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function"

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
    logits = torch.randn(1, sum(total), spec["vocab"])
    tokens = [torch.randint(0, spec["vocab"], (n,)) for n in total]
    out = {"logits": logits.tolist(), "tokens": [t.tolist() for t in tokens], "runs": []}
    for loss_type in ("custom_loss", "policy_loss"):
        for per_token in (False, True):
            args = Namespace(
                loss_type=loss_type, custom_loss_function_path=spec["path"], calculate_per_token_loss=per_token,
                recompute_loss_function=False, allgather_cp=False, rollout_temperature=spec["temperature"],
                log_probs_chunk_size=-1, entropy_coef=spec["entropy_coef"], use_kl_loss=True,
                kl_loss_coef=spec["kl_coef"], kl_loss_type="low_var_kl", advantage_estimator="grpo",
                use_rollout_logprobs=False, use_opsm=False, eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=None,
                get_mismatch_metrics=False, use_tis=False, custom_pg_loss_reducer_function_path=None,
                use_unbiased_kl=False, rollout_top_p=1.0)
            x = logits.clone().requires_grad_(True)
            batch = {"unconcat_tokens": tokens, "total_lengths": total, "response_lengths": responses,
                     "loss_masks": [torch.tensor(m, dtype=torch.float32) for m in spec["loss_masks"]],
                     "rollout_mask_sums": None,
                     "advantages": [a * torch.ones(n) for a, n in zip(spec["per_sample"], responses)],
                     "log_probs": [torch.tensor(o) for o in spec["old_log_probs"]],
                     "ref_log_probs": [torch.tensor(r) for r in spec["ref_log_probs"]]}
            loss, normalizer, log = loss_function(args, batch, 1, len(total), x)
            loss.backward()
            # what Megatron applies: the per-token loss is divided by the step's summed normalizer
            value = float(loss) / float(normalizer) if per_token else float(loss)
            out["runs"].append({"loss_type": loss_type, "per_token": per_token, "value": value,
                                "keys": log["keys"], "grad_norm": float(x.grad.norm())})
    print(json.dumps(out))
""")

SPEC = {"path": AWSFT_PATH, "vocab": 11, "kl_coef": 0.05, "entropy_coef": 0.01, "temperature": 0.7,
        "total_lengths": [6, 9], "response_lengths": [3, 7], "loss_masks": [[1, 1, 0], [1, 0, 1, 1, 1, 1, 1]],
        "per_sample": [1.5, -0.5],  # GRPO's advantages; AWSFT reads the same channel as its weights
        "old_log_probs": [[-2.2, -2.4, -1.0], [-3.0, -2.0, -2.1, -2.6, -2.3, -2.5, -1.9]],
        "ref_log_probs": [[-2.0, -2.5, -1.0], [-3.0, -2.0, -2.2, -2.4, -2.3, -2.6, -2.0]]}


# the same batch plus a wholly masked sample (removed, or every turn masked as off-policy): slime keeps it in its
# batch at mask 0, one sample of its per-sample mean and one token of its per-token count
MASKED_SPEC = {**SPEC, "total_lengths": [*SPEC["total_lengths"], 5], "response_lengths": [*SPEC["response_lengths"], 2],
               "loss_masks": [*SPEC["loss_masks"], [0, 0]], "per_sample": [*SPEC["per_sample"], 0.7],
               "old_log_probs": [*SPEC["old_log_probs"], [-1.0, -2.0]],
               "ref_log_probs": [*SPEC["ref_log_probs"], [-1.2, -2.1]]}


def _probe(spec: dict) -> dict:
    paths = [str(MEGATRON_DIR), str(SLIME_DIR), str(SGLANG_DOUBLE), str(ROOT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(spec)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def slime_runs() -> dict:
    return _probe(SPEC)


@pytest.fixture(scope="module")
def masked_runs() -> dict:
    return _probe(MASKED_SPEC)


def local_tensors(out: dict, spec: dict = SPEC) -> dict[str, torch.Tensor]:
    """The same logits laid out as the local trainer holds them: one padded row per sample, position 0 of each row
    the first response token (position t of slime's packed logits predicts token t + 1)."""
    logits = torch.tensor(out["logits"])[0]
    width = max(spec["response_lengths"])
    rows: dict[str, list[torch.Tensor]] = {"logp": [], "entropy": [], "mask": [], "old": [], "ref": []}
    offset = 0
    for toks, total, resp, mask, old, ref in zip(out["tokens"], spec["total_lengths"], spec["response_lengths"],
                                                 spec["loss_masks"], spec["old_log_probs"], spec["ref_log_probs"]):
        positions = list(range(offset + total - resp - 1, offset + total - 1))
        targets = torch.tensor([toks[p - offset + 1] for p in positions])
        logp, entropy = gather_logprobs(logits[positions], targets, temperature=spec["temperature"],
                                        with_entropy=True)
        pad = width - resp
        rows["logp"].append(torch.cat([logp, torch.zeros(pad)]))
        rows["entropy"].append(torch.cat([entropy, torch.zeros(pad)]))
        for key, values in (("mask", mask), ("old", old), ("ref", ref)):
            rows[key].append(torch.tensor([*values, *[0.0] * pad]))
        offset += total
    return {key: torch.stack(value) for key, value in rows.items()}


@pytest.mark.parametrize("reduction", ["sample_mean", "token_mean"])
def test_grpo_locally_equals_slimes_policy_loss_for_each_reduction(slime_runs, reduction):
    run = next(r for r in slime_runs["runs"] if r["loss_type"] == "policy_loss"
               and r["per_token"] == (reduction == "token_mean"))
    t = local_tensors(slime_runs)
    local, _ = grpo_loss(t["logp"], t["old"], torch.tensor(SPEC["per_sample"])[:, None], t["mask"], eps_clip=0.2,
                         eps_clip_high=0.28, reduction=reduction, entropy=t["entropy"],
                         entropy_coef=SPEC["entropy_coef"], ref_logprobs=t["ref"], kl_coef=SPEC["kl_coef"])
    assert float(local) == pytest.approx(run["value"], rel=1e-5)
    other = next(r for r in slime_runs["runs"] if r["loss_type"] == "policy_loss" and r is not run)
    assert abs(run["value"] - other["value"]) > 1e-3  # the two reductions differ on these tensors
    assert run["grad_norm"] > 0


@pytest.mark.parametrize("reduction", ["sample_mean", "token_mean"])
def test_awsft_locally_equals_slimes_custom_loss_for_each_reduction(slime_runs, reduction):
    run = next(r for r in slime_runs["runs"] if r["loss_type"] == "custom_loss"
               and r["per_token"] == (reduction == "token_mean"))
    t = local_tensors(slime_runs)
    local, _ = local_awsft_loss(t["logp"], torch.tensor(SPEC["per_sample"])[:, None], t["mask"], reduction=reduction,
                                ref_logprobs=t["ref"], kl_coef=SPEC["kl_coef"])
    assert float(local) == pytest.approx(run["value"], rel=1e-5)
    assert {"loss", "awsft_nll", "awsft_weight", "kl"} <= set(run["keys"])
    assert run["grad_norm"] > 0


def _local_losses(t: dict[str, torch.Tensor], spec: dict, reduction: str, **totals) -> dict[str, float]:
    advantages = torch.tensor(spec["per_sample"])[:, None]
    grpo, _ = grpo_loss(t["logp"], t["old"], advantages, t["mask"], eps_clip=0.2, eps_clip_high=0.28,
                        reduction=reduction, entropy=t["entropy"], entropy_coef=spec["entropy_coef"],
                        ref_logprobs=t["ref"], kl_coef=spec["kl_coef"], **totals)
    awsft_, _ = local_awsft_loss(t["logp"], advantages, t["mask"], reduction=reduction, ref_logprobs=t["ref"],
                                 kl_coef=spec["kl_coef"], **totals)
    return {"policy_loss": float(grpo), "custom_loss": float(awsft_)}


@pytest.mark.parametrize("reduction", ["sample_mean", "token_mean"])
def test_a_wholly_masked_sample_gives_one_loss_locally_and_on_slime(masked_runs, reduction):
    """Issue 32: the local trainer dropped a wholly masked sample and slime kept it (sample_mean 0.2906 vs 0.2180,
    token_mean 0.3556 vs 0.3302 on the issue's batch). Now the local trainer keeps it at mask 0, as slime does,
    with slime's denominators (the per-token count holds it as one token: losses.step_tokens)."""
    t = local_tensors(masked_runs, MASKED_SPEC)
    assert not t["mask"][2].any()  # the third sample trains no token
    local = _local_losses(t, MASKED_SPEC, reduction)
    per_token = reduction == "token_mean"
    for loss_type, value in local.items():
        run = next(r for r in masked_runs["runs"] if r["loss_type"] == loss_type and r["per_token"] == per_token)
        assert value == pytest.approx(run["value"], rel=1e-5), loss_type
        # the earlier local reduction (the sample left out) gives another number on this batch
        kept = [0, 1]
        dropped = _local_losses({k: v[kept] for k, v in t.items()}, {**MASKED_SPEC, "per_sample": SPEC["per_sample"]},
                                reduction)[loss_type]
        assert abs(dropped - run["value"]) > 1e-3, loss_type


# -- V*: from the difficulty stage's task rows to the weight slime trains with -------------------------------------

def test_the_reference_pass_rate_reaches_slimes_samples_and_sets_their_weights(slime_env, loopback, tiny_small_dir,
                                                                             small_tokenizer, tmp_path):
    from slime_harness import flat, rollout, slime_args, train_data
    from test_slime_rollout import Script

    from tau2_rl_pipeline.benchmark.tasks import task_rows, write_jsonl
    from tau2_rl_pipeline.config import Tau2Config
    from tau2_rl_pipeline.selection.difficulty import filter_task_rows

    loopback.responder = Script(small_tokenizer)  # solves create_task_1; its tool call fails the other task
    tasks = ["create_task_1", "update_task_1"]
    rows = [r for r in task_rows("mock", "base") if r["metadata"]["task_id"] in tasks]
    rft_episodes = [{"status": "completed", "domain": "mock", "task_id": tid, "reward": reward}
                    for tid, rewards in (("create_task_1", (1.0, 1.0, 1.0, 0.0)), ("update_task_1", (1.0, 0.0)))
                    for reward in rewards]
    kept, _ = filter_task_rows(rows, rft_episodes, Tau2Config.from_env({}))
    write_jsonl(tmp_path / "grpo_tasks.jsonl", kept)  # what python -m ...selection.difficulty writes
    args = slime_args(tiny_small_dir, tmp_path / "grpo_tasks.jsonl", loopback.base_url.removeprefix("http://"),
                      batch=2, n=2, extra=("--loss-type", "custom_loss", "--custom-loss-function-path", AWSFT_PATH))
    samples = flat(rollout(args)[0].samples)
    v_star = {"create_task_1": 0.75, "update_task_1": 0.5}
    assert {s.metadata["task_id"]: s.metadata[awsft.BASELINE_KEY] for s in samples} == v_star
    rewards = [s.metadata["raw_reward"] for s in samples]  # the binary task reward (TAU2_AWSFT_REWARD=task)
    assert sorted(set(rewards)) == [0.0, 1.0]  # one task solved, the other failed
    data = train_data(args, samples)  # slime's conversion calls our reward post-process
    expected = awsft.batch_weights(rewards, [v_star[s.metadata["task_id"]] for s in samples], [True] * 4)
    assert data["rewards"] == pytest.approx(expected)
    assert max(expected) > 1.5 and min(expected) < 0.5  # GRPO's advantages would be 0 here (equal groups)
