#!/usr/bin/env bash
# Stage: GRPO on tau2 train tasks with this package's multi-turn rollout (slime's train.py, training and rollout
# colocated on the policy GPUs). Needs the user simulator (scripts/start_user_sim.sh) on the other GPUs.
#
#   bash scripts/train_grpo.sh                # ${RFT_CKPT_DIR} -> ${GRPO_CKPT_DIR}
#   GRPO_ASYNC=1 bash scripts/train_grpo.sh   # asynchronous GRPO (below)
#   DRY_RUN=1 bash scripts/train_grpo.sh      # print the commands instead
#
# GRPO_ASYNC=1 runs slime's train_async.py instead: rollout for step n+1 runs while step n trains, on separate GPUs
# (train_async.py refuses --colocate), so the policy GPUs are split: GRPO_ASYNC_ROLLOUT_GPUS (default half of them)
# serve SGLang engines, the rest train (TRAIN_TP capped at their number). Needs at least 2 policy GPUs (layouts 8, 4).
#   GRPO_ASYNC_ROLLOUT_FUNCTION  tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async: slime's fully async
#                                rollout (a pool of episodes in flight across rollout boundaries; it calls our
#                                custom generate through slime's generate_and_rm_group), stopped by an abort storm
#                                (slime's worker alone would drop failing groups and wait for ever)
#   GRPO_MAX_STALENESS=2         eta: no trained token comes from weights more than eta versions behind the weights
#                                training it (tau2_rl_pipeline/slime_plugins/staleness.py, exported to it as
#                                TAU2_MAX_STALENESS): new groups start only while that can hold (AReaL's
#                                max_head_offpolicyness rule), turns that still lag past it are masked and counted,
#                                rollout/staleness/* logged; --sglang-server-concurrency is bounded to match
#                                ((eta + 1) x the rollout's samples over the engines; slime's default, 512 per engine,
#                                kept ~1024 groups in flight for a 16-group step). -1 = unbounded. 0 is refused here:
#                                train_async.py collects each rollout before the previous step's update, so every
#                                token is at least 1 behind (eta = 0 is the synchronous path, GRPO_ASYNC=0).
#                                bench/README.md P12: the measurement behind the default
# In both modes (tests/contract/test_partial_rollout.py and test_slime_rollout.py run slime's own rollout code):
#   GRPO_PARTIAL_ROLLOUT=1       --partial-rollout: an episode cut by the rollout (slime's end-of-rollout abort in
#                                train.py; in train_async.py a weight update, whose /pause_generation aborts the
#                                requests in flight) goes back to slime's buffer and, handed back, goes on where it
#                                was cut (TAU2_PARTIAL_RESUME=1; 0 starts it again)
#   GRPO_MASK_OFFPOLICY=1        --mask-offpolicy-in-partial-rollout: no token sampled by weights older than its
#                                episode's last turn is trained (our generate masks each turn by the weight version
#                                SGLang reported for it: a resumed episode's earlier turns, and in the async mode an
#                                episode that met a weight update between two turns). 0 trains them, and is refused
#                                unless TIS corrects them: slime's PPO ratio uses the log-probs the actor recomputes,
#                                so without TIS they are trained as if on-policy
#   GRPO_USE_TIS=1               --use-tis: truncated importance sampling with the rollout log-probs our generate
#                                keeps. GRPO_ALGORITHM=awsft never uses TIS (slime's custom loss has no importance
#                                ratio), so there GRPO_MASK_OFFPOLICY must stay 1
#   always                       slime_plugins/batch.py: a group whose samples all aborted never takes a batch slot
#                                (dynamic filter, reason all_aborted; the async worker requeues such groups itself),
#                                and aborted samples are left out of the logged raw_reward, counted apart
# Starts from GRPO_INIT_DIR's weights at rollout 0 without its optimizer state, with the same checkpoint as the KL
# reference; resumes if GRPO_CKPT_DIR already holds a checkpoint. Every default below is overridable.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
restart_on_node_faults "$@"  # MAX_RESTARTS: rerun from the checkpoint after a node fault (cluster_watch.sh)
source_model_args

GRPO_INIT_DIR="${GRPO_INIT_DIR:-${RFT_CKPT_DIR}}"
GRPO_PROMPT_DATA="${GRPO_PROMPT_DATA:-${TASKS_DIR}/tau2_train_all_tasks.jsonl}"
GRPO_WANDB_GROUP="${GRPO_WANDB_GROUP:-grpo-${MODEL_SHORT}}"
# GRPO defaults (the original cookbook's): 200 rollouts of 16 tasks x 4 samples, one optimizer step per rollout.
GRPO_NUM_ROLLOUT="${GRPO_NUM_ROLLOUT:-200}"
GRPO_ROLLOUT_BATCH_SIZE="${GRPO_ROLLOUT_BATCH_SIZE:-16}"
GRPO_N_SAMPLES="${GRPO_N_SAMPLES:-4}"
GRPO_GLOBAL_BATCH_SIZE="${GRPO_GLOBAL_BATCH_SIZE:-$((GRPO_ROLLOUT_BATCH_SIZE * GRPO_N_SAMPLES))}"
GRPO_EPS_CLIP="${GRPO_EPS_CLIP:-0.2}"
GRPO_EPS_CLIP_HIGH="${GRPO_EPS_CLIP_HIGH:-0.28}"
GRPO_KL_LOSS_TYPE="${GRPO_KL_LOSS_TYPE:-low_var_kl}"
GRPO_KL_LOSS_COEF="${GRPO_KL_LOSS_COEF:-0.01}"
GRPO_ENTROPY_COEF="${GRPO_ENTROPY_COEF:-0.001}"
GRPO_TEMPERATURE="${GRPO_TEMPERATURE:-0.7}"
GRPO_MAX_RESPONSE_LEN="${GRPO_MAX_RESPONSE_LEN:-4096}"   # SGLang max_new_tokens per policy turn
GRPO_SAVE_INTERVAL="${GRPO_SAVE_INTERVAL:-20}"
# GRPO_LR, GRPO_MAX_TOKENS_PER_GPU, GRPO_SGLANG_MEM_FRACTION and ROLLOUT_GPUS_PER_ENGINE follow the model preset
# (common.sh; for the 4B: 1e-6, 12288, 0.7, 1); RECIPE=qwen3-8b-tau2 sets the batch, turns and steps above too.
# grpo: slime's PPO-clip policy loss; awsft: advantage-weighted SFT (tau2_rl_pipeline/slime_plugins/awsft.py, a slime
# custom loss) on the same episodes and KL reference, each episode weighted by the recipe's w (learning/awsft.py: its
# reward over the task's reference pass rate, which the difficulty stage writes into GRPO_PROMPT_DATA's rows,
# normalised over the rollout batch; the reward post-process computes it when slime's args name this loss).
GRPO_ALGORITHM="${GRPO_ALGORITHM:-grpo}"
# How both losses average over a step (a Tau2Config field, the same on the local path): sample_mean = slime's default,
# each episode's token mean averaged over the step's episodes (AWSFT's per-example mean); token_mean = slime's
# --calculate-per-token-loss, every trained token weighs the same.
TAU2_LOSS_REDUCTION="${TAU2_LOSS_REDUCTION:-sample_mean}"
# true: drop groups whose samples all got the same reward (no GRPO signal) and sample more (a Tau2Config field).
FILTER_ZERO_STD="$(bool_setting TAU2_FILTER_ZERO_STD "${TAU2_FILTER_ZERO_STD:-0}")"
GRPO_ASYNC="$(bool_setting GRPO_ASYNC "${GRPO_ASYNC:-0}")"
GRPO_ASYNC_ROLLOUT_FUNCTION="${GRPO_ASYNC_ROLLOUT_FUNCTION:-tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async}"
# Asynchronous GRPO's rollout GPUs: half of one node's; on several nodes, half the nodes (the actor gets the others).
if ((NUM_NODES > 1)); then
  HALF_THE_NODES=$((NUM_NODES / 2))
  GRPO_ASYNC_ROLLOUT_GPUS="${GRPO_ASYNC_ROLLOUT_GPUS:-$((HALF_THE_NODES * GPUS_PER_NODE))}"
else
  GRPO_ASYNC_ROLLOUT_GPUS="${GRPO_ASYNC_ROLLOUT_GPUS:-$((GPUS_PER_NODE / 2))}"
fi
GRPO_PARTIAL_ROLLOUT="$(bool_setting GRPO_PARTIAL_ROLLOUT "${GRPO_PARTIAL_ROLLOUT:-1}")"
GRPO_USE_TIS="$(bool_setting GRPO_USE_TIS "${GRPO_USE_TIS:-1}")"
GRPO_MASK_OFFPOLICY="$(bool_setting GRPO_MASK_OFFPOLICY "${GRPO_MASK_OFFPOLICY:-1}")"
GRPO_MAX_STALENESS="${GRPO_MAX_STALENESS:-2}"

for name in GRPO_NUM_ROLLOUT GRPO_ROLLOUT_BATCH_SIZE GRPO_N_SAMPLES GRPO_GLOBAL_BATCH_SIZE GRPO_MAX_RESPONSE_LEN \
  GRPO_SAVE_INTERVAL GRPO_MAX_TOKENS_PER_GPU; do
  require_uint "${name}" "${!name}"
done
for name in GRPO_EPS_CLIP GRPO_EPS_CLIP_HIGH GRPO_KL_LOSS_COEF GRPO_ENTROPY_COEF GRPO_LR GRPO_TEMPERATURE \
  GRPO_SGLANG_MEM_FRACTION; do
  require_number "${name}" "${!name}"
done
require_choice GRPO_KL_LOSS_TYPE "${GRPO_KL_LOSS_TYPE}" k1 k2 k3 low_var_kl
require_choice GRPO_ALGORITHM "${GRPO_ALGORITHM}" grpo awsft
if [[ "${GRPO_MASK_OFFPOLICY}" == 0 ]]; then
  [[ "${GRPO_ALGORITHM}" == grpo ]] ||
    die "GRPO_MASK_OFFPOLICY=0 would train turns sampled by older weights with nothing to correct them: GRPO_ALGORITHM=awsft never applies TIS; keep GRPO_MASK_OFFPOLICY=1"
  [[ "${GRPO_USE_TIS}" == 1 ]] ||
    die "GRPO_MASK_OFFPOLICY=0 with GRPO_USE_TIS=0 would train turns sampled by older weights as if on-policy (slime's PPO ratio ignores the rollout log-probs): set GRPO_USE_TIS=1 or GRPO_MASK_OFFPOLICY=1"
fi
[[ "${GRPO_MAX_STALENESS}" =~ ^(-1|0|[1-9][0-9]*)$ ]] ||
  die "GRPO_MAX_STALENESS=${GRPO_MAX_STALENESS} must be a whole number of weight versions (0 or more), or -1 for unbounded"
export TAU2_MAX_STALENESS="${GRPO_MAX_STALENESS}"  # read by the rollout inside slime (Tau2Config.max_staleness)
SAMPLES=$((GRPO_ROLLOUT_BATCH_SIZE * GRPO_N_SAMPLES))
((SAMPLES % GRPO_GLOBAL_BATCH_SIZE == 0)) ||
  die "GRPO_GLOBAL_BATCH_SIZE=${GRPO_GLOBAL_BATCH_SIZE} must divide the ${SAMPLES} samples of a rollout"
CLUSTER_GPUS=$((NUM_NODES * GPUS_PER_NODE))
if [[ "${GRPO_ASYNC}" == 1 ]]; then
  ((CLUSTER_GPUS >= 2)) || die "GRPO_ASYNC=1 trains and rolls out on separate GPUs: it needs at least 2 policy GPUs, POLICY_GPUS=${POLICY_GPUS} has ${NUM_POLICY_GPUS}"
  if ! [[ "${GRPO_ASYNC_ROLLOUT_GPUS}" =~ ^[1-9][0-9]*$ ]] || ((GRPO_ASYNC_ROLLOUT_GPUS >= CLUSTER_GPUS)); then
    die "GRPO_ASYNC_ROLLOUT_GPUS=${GRPO_ASYNC_ROLLOUT_GPUS} must be between 1 and $((CLUSTER_GPUS - 1)) (the ${CLUSTER_GPUS} policy GPUs less at least one for training)"
  fi
  if [[ "${FILTER_ZERO_STD}" == 1 && "${GRPO_ASYNC_ROLLOUT_FUNCTION}" == *generate_rollout_fully_async ]]; then
    die "TAU2_FILTER_ZERO_STD=1 has no effect with GRPO_ASYNC=1: slime's fully async rollout applies no dynamic-sampling filter"
  fi
  [[ "${GRPO_MAX_STALENESS}" != 0 ]] ||
    die "GRPO_MAX_STALENESS=0 cannot hold with GRPO_ASYNC=1: train_async.py collects each rollout before the previous step's weight update, so every token is at least 1 version behind; eta = 0 is the synchronous path's guarantee (GRPO_ASYNC=0), or set 1 or more"
  cluster_placement split "${GRPO_ASYNC_ROLLOUT_GPUS}"
  apply_preset "$((ACTOR_NUM_NODES * ACTOR_GPUS_PER_NODE))"  # the layout of the training GPUs alone
else
  cluster_placement colocate
fi
ACTOR_GPUS=$((ACTOR_NUM_NODES * ACTOR_GPUS_PER_NODE))
((TRAIN_TP <= ACTOR_GPUS)) || TRAIN_TP="${ACTOR_GPUS}"
((ACTOR_GPUS % TRAIN_TP == 0)) || die "TRAIN_TP=${TRAIN_TP} does not divide the ${ACTOR_GPUS} training GPUs"
DP=$((ACTOR_GPUS / (TRAIN_TP * TRAIN_PP * TRAIN_CP)))
((GRPO_GLOBAL_BATCH_SIZE % DP == 0)) ||
  die "GRPO_GLOBAL_BATCH_SIZE=${GRPO_GLOBAL_BATCH_SIZE} is not a multiple of the data-parallel size ${DP}"
# The user simulator is part of the reward: with GRPO_MAX_USER_FAILURE_RATE set, training starts only when
# GRPO_USER_QUALIFICATION (tau2-rl-qualify-user --user llm --task-split train --output ...) qualified this very user
# (TAU2_USER_MODEL, _API_BASE, _TEMPERATURE, _STRATEGY), with this tau2, on the domains and splits of
# GRPO_PROMPT_DATA (DOMAINS x train until it exists), failing the oracle agent at most that often (task faults apart;
# docs/evaluation.md). A dry run prints the line a real run would stop on and goes on. It runs on the package's own
# interpreter (PACKAGE_PYTHON, common.sh) with this checkout first on the path.
GRPO_MAX_USER_FAILURE_RATE="${GRPO_MAX_USER_FAILURE_RATE:-}"
GRPO_USER_QUALIFICATION="$(abs_path "${GRPO_USER_QUALIFICATION:-${TAU2_OUT_DIR}/qualify/user.json}")"
if [[ -n "${GRPO_MAX_USER_FAILURE_RATE}" ]]; then
  require_number GRPO_MAX_USER_FAILURE_RATE "${GRPO_MAX_USER_FAILURE_RATE}"
  if gate="$(PYTHONPATH="${TAU2_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" "${PACKAGE_PYTHON}" -m tau2_rl_pipeline.eval.qualify \
    --check "${GRPO_USER_QUALIFICATION}" --max-failure-rate "${GRPO_MAX_USER_FAILURE_RATE}" \
    --run-tasks "${GRPO_PROMPT_DATA}" --domains "${DOMAINS}" --task-split train 2>&1)"; then
    note "$(tail -n 1 <<<"${gate}")"  # its verdict line (a library's warning may come first)
  else
    gate="$(tail -n 1 <<<"${gate}")"
    [[ "${gate}" != *"No module named"* ]] ||
      gate="${PACKAGE_PYTHON} cannot run this package (${gate}): set PYTHON or TAU2_VENV to its environment (scripts/setup.sh)"
    if is_dry; then note "dry run: a real run would stop here: ${gate#error: }"; else die "${gate#error: }"; fi
  fi
fi
if [[ "${GRPO_PROMPT_DATA}" == "${GRPO_TASKS}" ]]; then  # what scripts/pipeline.sh passes
  require_file "${GRPO_PROMPT_DATA}" "GRPO task index (the difficulty stage's train tasks filtered by RFT-sampling pass rate: python -m tau2_rl_pipeline.selection.difficulty)"
else
  require_file "${GRPO_PROMPT_DATA}" "GRPO task index (python -m tau2_rl_pipeline.benchmark.tasks)"
fi
# slime's data source hands out no sample from a file without a row, and its rollout asks again with no end.
if [[ -f "${GRPO_PROMPT_DATA}" ]] && ! grep -q '[^[:space:]]' "${GRPO_PROMPT_DATA}"; then
  problem "GRPO task index ${GRPO_PROMPT_DATA} holds no task: slime's rollout would wait for one with no end (did the difficulty stage keep none?)"
fi
if [[ "${GRPO_ALGORITHM}" == awsft ]] && ! grep -q '"reference_pass_rate"' "${GRPO_PROMPT_DATA}"; then
  note "GRPO_ALGORITHM=awsft: no task in ${GRPO_PROMPT_DATA} has a reference_pass_rate (the difficulty stage writes it): each weight follows the batch z-score of the rewards"
fi
require_dir "${GRPO_INIT_DIR}" "initial torch_dist checkpoint (scripts/train_rft.sh)"
require_file "${BASE_HF_DIR}/config.json" "base model (scripts/download.sh)"
require_dir "${SLIME_DIR}" "slime (SLIME_DIR)"
require_user_sim ray
size_stage grpo --nodes "${ACTOR_NUM_NODES}" --gpus-per-node "${ACTOR_GPUS_PER_NODE}" \
  --rollout-gpus "${ROLLOUT_NUM_GPUS}" --colocated "$((1 - GRPO_ASYNC))" --max-tokens-per-gpu "${GRPO_MAX_TOKENS_PER_GPU}" \
  --mem-fraction "${GRPO_SGLANG_MEM_FRACTION}" --rollout-batch "${GRPO_ROLLOUT_BATCH_SIZE}" --samples "${GRPO_N_SAMPLES}"
if [[ "${GRPO_ASYNC}" == 1 ]]; then
  note "layout ${TAU2_GPU_LAYOUT}, asynchronous: policy on GPUs ${POLICY_GPUS} of ${NUM_NODES} node(s): ${ACTOR_GPUS} training (TP${TRAIN_TP} x DP${DP}), ${GRPO_ASYNC_ROLLOUT_GPUS} rollout; user simulator on ${USER_SIM_GPUS}"
else
  note "layout ${TAU2_GPU_LAYOUT}: policy on GPUs ${POLICY_GPUS} of ${NUM_NODES} node(s) (TP${TRAIN_TP} x DP${DP}), user simulator on ${USER_SIM_GPUS}"
fi

# --hf-checkpoint gives SGLang its tokenizer and first weights; slime pushes the Megatron weights to the engines
# before the first rollout, so the base model's directory serves every GRPO start point.
mapfile -t CKPT_ARGS < <(checkpoint_flags "${GRPO_INIT_DIR}" "${GRPO_CKPT_DIR}")
CKPT_ARGS=(
  --hf-checkpoint "${BASE_HF_DIR}"
  --ref-load "${GRPO_INIT_DIR}"
  "${CKPT_ARGS[@]}"
  --save-interval "${GRPO_SAVE_INTERVAL}"
)

# Rows {"input": label, "metadata": {domain, split, task_id, task_index, benchmark}}: the rollout builds the real
# prompt (the episode's system prompt, tools, conversation) from the metadata, so no --apply-chat-template here; it
# refuses rows written with another tau2 (benchmark).
ROLLOUT_ARGS=(
  --prompt-data "${GRPO_PROMPT_DATA}"
  --input-key input
  --metadata-key metadata
  --rollout-shuffle
  --num-rollout "${GRPO_NUM_ROLLOUT}"
  --rollout-batch-size "${GRPO_ROLLOUT_BATCH_SIZE}"
  --n-samples-per-prompt "${GRPO_N_SAMPLES}"
  --rollout-max-response-len "${GRPO_MAX_RESPONSE_LEN}"
  --rollout-temperature "${GRPO_TEMPERATURE}"
  --global-batch-size "${GRPO_GLOBAL_BATCH_SIZE}"
  --loss-mask-type "${LOSS_MASK_TYPE}"
)

GRPO_ARGS=(
  --advantage-estimator grpo
  --use-kl-loss
  --kl-loss-coef "${GRPO_KL_LOSS_COEF}"
  --kl-loss-type "${GRPO_KL_LOSS_TYPE}"
  --entropy-coef "${GRPO_ENTROPY_COEF}"
  --eps-clip "${GRPO_EPS_CLIP}"
  --eps-clip-high "${GRPO_EPS_CLIP_HIGH}"
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr "${GRPO_LR}"
  --lr-decay-style constant
  --weight-decay 0.1
  --adam-beta1 0.9
  --adam-beta2 0.98
)

SGLANG_ARGS=(
  --rollout-num-gpus-per-engine "${ROLLOUT_GPUS_PER_ENGINE}"
  --sglang-mem-fraction-static "${GRPO_SGLANG_MEM_FRACTION}"
)
if [[ "${GRPO_ASYNC}" == 1 && "${GRPO_MAX_STALENESS}" != -1 ]]; then
  # slime's worker keeps this many groups in flight per engine, and its semaphore this many samples: room for the
  # (eta + 1) rollouts' samples the staleness bound lets start, no more
  ENGINES=$((ROLLOUT_NUM_GPUS / ROLLOUT_GPUS_PER_ENGINE))
  ((ENGINES >= 1)) || ENGINES=1
  IN_FLIGHT=$(((GRPO_MAX_STALENESS + 1) * SAMPLES))
  SGLANG_ARGS+=(--sglang-server-concurrency "$(((IN_FLIGHT + ENGINES - 1) / ENGINES))")
fi

CUSTOM_ARGS=(
  --custom-generate-function-path tau2_rl_pipeline.slime_plugins.adapter.generate
  --custom-reward-post-process-path tau2_rl_pipeline.slime_plugins.adapter.reward_post_process
  --custom-rollout-log-function-path tau2_rl_pipeline.slime_plugins.rollout_log.log_rollout_data
)
if [[ "${TAU2_LOSS_REDUCTION}" == token_mean ]]; then
  GRPO_ARGS+=(--calculate-per-token-loss)
fi
if [[ "${GRPO_ALGORITHM}" == awsft ]]; then
  CUSTOM_ARGS+=(--loss-type custom_loss --custom-loss-function-path tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function)
fi
if [[ "${GRPO_PARTIAL_ROLLOUT}" == 1 ]]; then
  CUSTOM_ARGS+=(--partial-rollout)
fi
if [[ "${GRPO_MASK_OFFPOLICY}" == 1 ]]; then
  CUSTOM_ARGS+=(--mask-offpolicy-in-partial-rollout)
fi
if [[ "${GRPO_USE_TIS}" == 1 && "${GRPO_ALGORITHM}" == grpo ]]; then
  CUSTOM_ARGS+=(--use-tis)
fi

# Synchronous: train.py, rollout engines colocated with training. Asynchronous: train_async.py on split GPUs.
mapfile -t PLACEMENT_ARGS < <(placement_flags)
if [[ "${GRPO_ASYNC}" == 1 ]]; then
  ENTRY=train_async.py
  PLACEMENT_ARGS+=(--rollout-function-path "${GRPO_ASYNC_ROLLOUT_FUNCTION}")
else
  ENTRY=train.py
  PLACEMENT_ARGS+=(--dynamic-sampling-filter-path tau2_rl_pipeline.slime_plugins.batch.filter_groups)
fi

mapfile -t PERF_ARGS < <(perf_flags "${GRPO_MAX_TOKENS_PER_GPU}")
mapfile -t MISC_ARGS < <(misc_flags)
mapfile -t WANDB_ARGS < <(wandb_flags "${GRPO_WANDB_GROUP}")
mapfile -t EXTRA_ARGS < <(extra_flags)

# Every node must see the checkpoint it writes and what it reads, as the head has it (shared storage; checked on a
# multi-node cluster: the data identical, the HF model and the checkpoints slime loads complete: the actor's --load,
# GRPO_CKPT_DIR on a resume, else GRPO_INIT_DIR; and --ref-load's GRPO_INIT_DIR, read on every start (--use-kl-loss)).
CHECKED_CKPTS=(--checkpoint "$(loaded_checkpoint "${GRPO_INIT_DIR}" "${GRPO_CKPT_DIR}")")
[[ "${CHECKED_CKPTS[1]}" == "${GRPO_INIT_DIR}" ]] || CHECKED_CKPTS+=(--checkpoint "${GRPO_INIT_DIR}")
ray_cluster_up "${GRPO_CKPT_DIR}" -- --data "${GRPO_PROMPT_DATA}" "${CHECKED_CKPTS[@]}" --hf-model "${BASE_HF_DIR}"
ray_submit "${ENTRY}" \
  "${PLACEMENT_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${CKPT_ARGS[@]}" \
  "${ROLLOUT_ARGS[@]}" \
  "${GRPO_ARGS[@]}" \
  "${OPTIMIZER_ARGS[@]}" \
  "${SGLANG_ARGS[@]}" \
  "${PERF_ARGS[@]}" \
  "${MISC_ARGS[@]}" \
  "${CUSTOM_ARGS[@]}" \
  "${WANDB_ARGS[@]}" \
  "${EXTRA_ARGS[@]}"
