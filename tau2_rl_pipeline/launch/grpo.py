"""The GRPO stage's plan, in each of its modes.

Synchronous (slime's train.py, rollout engines colocated with training), asynchronous
(GRPO_ASYNC=1: train_async.py, the policy GPUs split between SGLang and training), PPO's loss or AWSFT's.

What each variable means is scripts/train_grpo.sh's header; the rules are here once: the off-policy refusal is
rollout/offpolicy.py's (the in-run guard applies the same function to slime's args), the staleness bound's
concurrency, the user-simulator qualification gate, the batch that the data-parallel ranks share evenly.
"""

from __future__ import annotations

import os
import re

from tau2_rl_pipeline.launch.cluster import place
from tau2_rl_pipeline.launch.common import Common, start_hint
from tau2_rl_pipeline.launch.plan import StagePlan
from tau2_rl_pipeline.launch.recipe import POLICY_LOSS, SLIME_GRPO, spelled
from tau2_rl_pipeline.launch.settings import Refused
from tau2_rl_pipeline.launch.stages import (
    AWSFT_LOSS,
    FULLY_ASYNC,
    MISC_FLAGS,
    PLUGINS,
    adam_betas,
    checkpoint_flags,
    cluster_steps,
    extra_flags,
    loaded,
    need_dir,
    need_file,
    need_user_sim,
    perf_flags,
    sizing,
    train_layout,
    wandb_flags,
)
from tau2_rl_pipeline.rollout.offpolicy import SLIME_ROLLOUT, unguarded_refusal
from tau2_rl_pipeline.scale.sizing import Work


def grpo(c: Common, plan: StagePlan) -> None:  # noqa: C901 (one stage's settings, read in the scripts' order)
    r, paths, d, loss = c.r, c.paths, SLIME_GRPO, POLICY_LOSS
    args = c.model_args
    init = r.get("GRPO_INIT_DIR", c.start_of("grpo"))  # AWSFT's start is GRPO's (the recipe's stage graph)
    data = r.get("GRPO_PROMPT_DATA", f"{paths.tasks}/tau2_train_all_tasks.jsonl")
    group = r.get("GRPO_WANDB_GROUP", f"grpo-{c.value('MODEL_SHORT')}")
    algorithm = r.get("GRPO_ALGORITHM", "grpo")
    token_mean = r.get("TAU2_LOSS_REDUCTION", loss.loss_reduction) == "token_mean"
    filter_zero_std, is_async = r.flag("TAU2_FILTER_ZERO_STD"), r.flag("GRPO_ASYNC")
    rollout_fn = r.get("GRPO_ASYNC_ROLLOUT_FUNCTION", FULLY_ASYNC)
    k = c.cluster
    half = (k.nodes // 2) * k.gpus_per_node if k.nodes > 1 else k.gpus_per_node // 2
    async_rollout = r.get("GRPO_ASYNC_ROLLOUT_GPUS", str(half))
    partial, tis, mask = (r.flag(n, "1") for n in ("GRPO_PARTIAL_ROLLOUT", "GRPO_USE_TIS", "GRPO_MASK_OFFPOLICY"))
    staleness = r.get("GRPO_MAX_STALENESS", str(d.max_staleness))
    num_rollout, batch, n = (r.uint(v, c.default(v, x)) for v, x in (("GRPO_NUM_ROLLOUT", d.num_rollout),
                                                        ("GRPO_ROLLOUT_BATCH_SIZE", d.rollout_batch_size),
                                                        ("GRPO_N_SAMPLES", d.n_samples)))
    global_batch = r.uint("GRPO_GLOBAL_BATCH_SIZE", c.default("GRPO_GLOBAL_BATCH_SIZE", batch * n))
    max_len, save_interval = r.uint("GRPO_MAX_RESPONSE_LEN", d.max_response_len), r.uint(
        "GRPO_SAVE_INTERVAL", c.default("GRPO_SAVE_INTERVAL", d.save_interval))
    max_tokens = r.uint("GRPO_MAX_TOKENS_PER_GPU", c.value("GRPO_MAX_TOKENS_PER_GPU"))
    eps, eps_high, kl_coef, entropy = (r.number(v, spelled(x)) for v, x in (
        ("GRPO_EPS_CLIP", loss.eps_clip), ("GRPO_EPS_CLIP_HIGH", loss.eps_clip_high),
        ("GRPO_KL_LOSS_COEF", loss.kl_coef), ("GRPO_ENTROPY_COEF", loss.entropy_coef)))
    lr = r.number("GRPO_LR", c.value("GRPO_LR"))
    temperature = r.number("GRPO_TEMPERATURE", spelled(d.temperature))
    mem_fraction = r.number("GRPO_SGLANG_MEM_FRACTION", c.value("GRPO_SGLANG_MEM_FRACTION"))
    kl_type = r.choice("GRPO_KL_LOSS_TYPE", loss.kl_loss_type, ("k1", "k2", "k3", "low_var_kl"))
    r.choice("GRPO_ALGORITHM", "grpo", ("grpo", "awsft"))
    if why := unguarded_refusal(partial_rollout=partial, rollout_function=rollout_fn if is_async else SLIME_ROLLOUT,
                                masked=mask, awsft=algorithm == "awsft", tis=tis and algorithm == "grpo"):
        raise Refused(why)
    if not re.fullmatch(r"-1|0|[1-9][0-9]*", staleness):
        raise Refused(f"GRPO_MAX_STALENESS={staleness} must be a whole number of weight versions (0 or more), or -1 "
                      "for unbounded")
    c.exports["TAU2_MAX_STALENESS"] = staleness  # read by the rollout inside slime (Tau2Config.max_staleness)
    samples = batch * n
    if samples % global_batch:
        raise Refused(f"GRPO_GLOBAL_BATCH_SIZE={global_batch} must divide the {samples} samples of a rollout")
    cluster_gpus = k.nodes * k.gpus_per_node
    if is_async:
        if cluster_gpus < 2:
            raise Refused(f"GRPO_ASYNC=1 trains and rolls out on separate GPUs: it needs at least 2 policy GPUs, "
                          f"POLICY_GPUS={c.gpus.policy} has {c.gpus.num_policy}")
        if not re.fullmatch(r"[1-9][0-9]*", async_rollout) or int(async_rollout) >= cluster_gpus:
            raise Refused(f"GRPO_ASYNC_ROLLOUT_GPUS={async_rollout} must be between 1 and {cluster_gpus - 1} (the "
                          f"{cluster_gpus} policy GPUs less at least one for training)")
        if filter_zero_std and rollout_fn.endswith("generate_rollout_fully_async"):
            raise Refused("TAU2_FILTER_ZERO_STD=1 has no effect with GRPO_ASYNC=1: slime's fully async rollout applies "
                          "no dynamic-sampling filter")
        if staleness == "0":
            raise Refused("GRPO_MAX_STALENESS=0 cannot hold with GRPO_ASYNC=1: train_async.py collects each rollout "
                          "before the previous step's weight update, so every token is at least 1 version behind; "
                          "eta = 0 is the synchronous path's guarantee (GRPO_ASYNC=0), or set 1 or more")
        p = place(k, "split", int(async_rollout))
        c.renew_preset(p.actor_gpus)  # the layout of the training GPUs alone
        max_tokens = r.uint("GRPO_MAX_TOKENS_PER_GPU", c.value("GRPO_MAX_TOKENS_PER_GPU"))
        mem_fraction = r.get("GRPO_SGLANG_MEM_FRACTION", c.value("GRPO_SGLANG_MEM_FRACTION"))
        lr = r.get("GRPO_LR", c.value("GRPO_LR"))
    else:
        p = place(k, "colocate")
    tp = min(int(c.value("TRAIN_TP")), p.actor_gpus)
    if p.actor_gpus % tp:
        raise Refused(f"TRAIN_TP={tp} does not divide the {p.actor_gpus} training GPUs")
    dp = p.actor_gpus // (tp * int(c.value("TRAIN_PP")) * int(c.value("TRAIN_CP")))
    if global_batch % dp:
        raise Refused(f"GRPO_GLOBAL_BATCH_SIZE={global_batch} is not a multiple of the data-parallel size {dp}")
    user_gate(c, data)
    if data == paths.grpo_tasks:  # what scripts/pipeline.sh passes
        need_file(c, data, "GRPO task index (the difficulty stage's train tasks filtered by RFT-sampling pass rate: "
                           "python -m tau2_rl_pipeline.selection.difficulty)")
    else:
        need_file(c, data, "GRPO task index (python -m tau2_rl_pipeline.benchmark.tasks)")
    if c.machine.is_file(data) and not c.machine.has_text(data):
        r.problem(f"GRPO task index {data} holds no task: slime's rollout would wait for one with no end (did the "
                  "difficulty stage keep none?)")
    if algorithm == "awsft" and not c.machine.has_text(data, '"reference_pass_rate"'):
        r.note(f"GRPO_ALGORITHM=awsft: no task in {data} has a reference_pass_rate (the difficulty stage writes it): "
               "each weight follows the batch z-score of the rewards")
    need_dir(c, init, start_hint("grpo"))
    need_file(c, f"{c.base_hf}/config.json", "base model (scripts/download.sh)")
    need_dir(c, paths.slime, "slime (SLIME_DIR)")
    need_user_sim(c, in_ray=True)
    lay = train_layout(c, p, max_tokens, rollout_gpus=p.rollout_gpus, colocated=not is_async,
                       mem_fraction=float(mem_fraction))
    sizing(c, plan, "grpo", lay.__class__(**{**lay.__dict__, "tp": tp}), Work(batch, n, c.max_turns))
    if is_async:
        r.note(f"layout {c.gpus.name}, asynchronous: policy on GPUs {c.gpus.policy} of {k.nodes} node(s): "
               f"{p.actor_gpus} training (TP{tp} x DP{dp}), {async_rollout} rollout; user simulator on {c.gpus.user_sim}")
    else:
        r.note(f"layout {c.gpus.name}: policy on GPUs {c.gpus.policy} of {k.nodes} node(s) (TP{tp} x DP{dp}), user "
               f"simulator on {c.gpus.user_sim}")
    save = paths.grpo_ckpt
    # --hf-checkpoint gives SGLang its tokenizer and first weights; slime pushes the Megatron weights before the
    # first rollout, so the base model's directory serves every GRPO start point.
    ckpt = ["--hf-checkpoint", c.base_hf, "--ref-load", init, *checkpoint_flags(c, init, save),
            "--save-interval", str(save_interval)]
    # Rows {"input": label, "metadata": {...}}: the rollout builds the real prompt from the metadata.
    rollout = ["--prompt-data", data, "--input-key", "input", "--metadata-key", "metadata", "--rollout-shuffle",
               "--num-rollout", str(num_rollout), "--rollout-batch-size", str(batch), "--n-samples-per-prompt", str(n),
               "--rollout-max-response-len", str(max_len), "--rollout-temperature", temperature,
               "--global-batch-size", str(global_batch), "--loss-mask-type", r.get("LOSS_MASK_TYPE", "qwen3")]
    grpo_args = ["--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", kl_coef, "--kl-loss-type",
                 kl_type, "--entropy-coef", entropy, "--eps-clip", eps, "--eps-clip-high", eps_high,
                 *(["--calculate-per-token-loss"] if token_mean else [])]
    optimizer = ["--optimizer", "adam", "--lr", lr, "--lr-decay-style", "constant", "--weight-decay",
                 spelled(loss.weight_decay), *adam_betas()]
    engine_gpus = int(c.value("ROLLOUT_GPUS_PER_ENGINE"))
    sglang = ["--rollout-num-gpus-per-engine", str(engine_gpus), "--sglang-mem-fraction-static", mem_fraction]
    if is_async and staleness != "-1":
        # slime's worker keeps this many groups in flight per engine: room for the (eta + 1) rollouts' samples the
        # staleness bound lets start, no more
        engines = max(p.rollout_gpus // engine_gpus, 1)
        in_flight = (int(staleness) + 1) * samples
        sglang += ["--sglang-server-concurrency", str(-(-in_flight // engines))]
    custom = ["--custom-generate-function-path", f"{PLUGINS}.adapter.generate",
              "--custom-reward-post-process-path", f"{PLUGINS}.adapter.reward_post_process",
              "--custom-rollout-log-function-path", f"{PLUGINS}.rollout_log.log_rollout_data"]
    if algorithm == "awsft":
        custom += ["--loss-type", "custom_loss", "--custom-loss-function-path", AWSFT_LOSS]
    custom += [*(["--partial-rollout"] if partial else []), *(["--mask-offpolicy-in-partial-rollout"] if mask else []),
               *(["--use-tis"] if tis and algorithm == "grpo" else [])]
    placement = p.flags() + (["--rollout-function-path", rollout_fn] if is_async else
                             ["--dynamic-sampling-filter-path", f"{PLUGINS}.batch.filter_groups"])
    perf = perf_flags(c, tp, str(max_tokens))
    wandb = wandb_flags(c, group)
    plan.entry, plan.placement = ("train_async.py" if is_async else "train.py"), p
    plan.argv = [*placement, *args, *ckpt, *rollout, *grpo_args, *optimizer, *sglang, *perf, *MISC_FLAGS, *custom,
                 *wandb, *extra_flags(c)]
    checked = ["--checkpoint", loaded(c, init, save)] + ([] if loaded(c, init, save) == init else ["--checkpoint", init])
    cluster_steps(c, plan, p, save, ["--data", data, *checked, "--hf-model", c.base_hf])


def package_python(c: Common) -> str:
    """This package's interpreter (the gate's): PYTHON when set, else the venv scripts/setup.sh makes, else python3."""
    venv = c.r.get("TAU2_VENV", f"{c.paths.root}/.venv")
    if c.r.get("PYTHON"):
        return c.r.get("PYTHON")
    return f"{venv}/bin/python" if os.access(f"{venv}/bin/python", os.X_OK) else "python3"


def user_gate(c: Common, data: str) -> None:
    """With GRPO_MAX_USER_FAILURE_RATE set, training starts only when GRPO_USER_QUALIFICATION qualified this very
    user simulator on these domains at most that often failing the oracle agent (docs/evaluation.md); a dry run
    prints the line a real run would stop on and goes on."""
    rate = c.r.get("GRPO_MAX_USER_FAILURE_RATE")
    if not rate:
        return
    c.r.number("GRPO_MAX_USER_FAILURE_RATE")
    summary = c.r.path("GRPO_USER_QUALIFICATION", f"{c.paths.out}/qualify/user.json")
    python = package_python(c)
    ok, out = c.machine.run_quietly(
        [python, "-m", "tau2_rl_pipeline.eval.qualify", "--check", summary, "--max-failure-rate", rate,
         "--run-tasks", data, "--domains", c.r.get("DOMAINS", "airline,retail,telecom"), "--task-split", "train"],
        {**c.r.environ, **c.exports, "PYTHONPATH": os.pathsep.join(filter(None, [c.paths.root, c.r.get("PYTHONPATH")]))})
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if ok:
        c.r.note(last)  # its verdict line (a library's warning may come first)
        return
    if "No module named" in last:
        last = f"{python} cannot run this package ({last}): set PYTHON or TAU2_VENV to its environment (scripts/setup.sh)"
    last = last.removeprefix("error: ")
    if not c.r.dry:
        raise Refused(last)
    c.r.note(f"dry run: a real run would stop here: {last}")
