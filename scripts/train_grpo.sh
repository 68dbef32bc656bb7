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
#   GRPO_PARTIAL_ROLLOUT=1       --partial-rollout --mask-offpolicy-in-partial-rollout: episodes cut by slime's
#                                abort at a weight update go back to slime's buffer instead of being lost, and no
#                                token sampled by older weights is trained (slime masks a returned sample's old
#                                response; our generate goes on with the episode where it was cut, its earlier
#                                turns kept and masked: TAU2_PARTIAL_RESUME)
#   GRPO_MASK_OFFPOLICY=1        with partial rollout, --mask-offpolicy-in-partial-rollout; 0 trains a resumed
#                                episode's earlier turns too (slime masks every returned sample's old response,
#                                which in P6 was 827 of 1346 trained turns), left to TIS to correct
#   GRPO_USE_TIS=1               --use-tis: truncated importance sampling with the rollout log-probs our generate
#                                keeps, correcting for samples drawn by a policy one step behind
# Starts from GRPO_INIT_DIR's weights at rollout 0 without its optimizer state, with the same checkpoint as the KL
# reference; resumes if GRPO_CKPT_DIR already holds a checkpoint. Every default below is overridable.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
source_model_args

GRPO_INIT_DIR="${GRPO_INIT_DIR:-${RFT_CKPT_DIR}}"
GRPO_PROMPT_DATA="${GRPO_PROMPT_DATA:-${TASKS_DIR}/tau2_train_all_tasks.jsonl}"
GRPO_WANDB_GROUP="${GRPO_WANDB_GROUP:-grpo-qwen3-4b}"
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
GRPO_LR="${GRPO_LR:-1e-6}"
GRPO_TEMPERATURE="${GRPO_TEMPERATURE:-0.7}"
GRPO_MAX_RESPONSE_LEN="${GRPO_MAX_RESPONSE_LEN:-4096}"   # SGLang max_new_tokens per policy turn
GRPO_SAVE_INTERVAL="${GRPO_SAVE_INTERVAL:-20}"
GRPO_MAX_TOKENS_PER_GPU="${GRPO_MAX_TOKENS_PER_GPU:-12288}"
GRPO_SGLANG_MEM_FRACTION="${GRPO_SGLANG_MEM_FRACTION:-0.7}"
# grpo: slime's PPO-clip policy loss; awsft: advantage-weighted SFT (tau2_rl_pipeline/slime_plugins/awsft.py, a slime
# custom loss) on the same episodes, advantages and KL reference.
GRPO_ALGORITHM="${GRPO_ALGORITHM:-grpo}"
# true: drop groups whose samples all got the same reward (no GRPO signal) and sample more (a Tau2Config field).
FILTER_ZERO_STD="$(bool_setting TAU2_FILTER_ZERO_STD "${TAU2_FILTER_ZERO_STD:-0}")"
GRPO_ASYNC="$(bool_setting GRPO_ASYNC "${GRPO_ASYNC:-0}")"
GRPO_ASYNC_ROLLOUT_FUNCTION="${GRPO_ASYNC_ROLLOUT_FUNCTION:-tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async}"
GRPO_ASYNC_ROLLOUT_GPUS="${GRPO_ASYNC_ROLLOUT_GPUS:-$((NUM_POLICY_GPUS / 2))}"
GRPO_PARTIAL_ROLLOUT="$(bool_setting GRPO_PARTIAL_ROLLOUT "${GRPO_PARTIAL_ROLLOUT:-1}")"
GRPO_USE_TIS="$(bool_setting GRPO_USE_TIS "${GRPO_USE_TIS:-1}")"
GRPO_MASK_OFFPOLICY="$(bool_setting GRPO_MASK_OFFPOLICY "${GRPO_MASK_OFFPOLICY:-1}")"

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
SAMPLES=$((GRPO_ROLLOUT_BATCH_SIZE * GRPO_N_SAMPLES))
((SAMPLES % GRPO_GLOBAL_BATCH_SIZE == 0)) ||
  die "GRPO_GLOBAL_BATCH_SIZE=${GRPO_GLOBAL_BATCH_SIZE} must divide the ${SAMPLES} samples of a rollout"
ACTOR_GPUS="${NUM_POLICY_GPUS}"
if [[ "${GRPO_ASYNC}" == 1 ]]; then
  ((NUM_POLICY_GPUS >= 2)) || die "GRPO_ASYNC=1 trains and rolls out on separate GPUs: it needs at least 2 policy GPUs, POLICY_GPUS=${POLICY_GPUS} has ${NUM_POLICY_GPUS}"
  if ! [[ "${GRPO_ASYNC_ROLLOUT_GPUS}" =~ ^[1-9][0-9]*$ ]] || ((GRPO_ASYNC_ROLLOUT_GPUS >= NUM_POLICY_GPUS)); then
    die "GRPO_ASYNC_ROLLOUT_GPUS=${GRPO_ASYNC_ROLLOUT_GPUS} must be between 1 and $((NUM_POLICY_GPUS - 1)) (the ${NUM_POLICY_GPUS} policy GPUs less at least one for training)"
  fi
  if [[ "${FILTER_ZERO_STD}" == 1 && "${GRPO_ASYNC_ROLLOUT_FUNCTION}" == *generate_rollout_fully_async ]]; then
    die "TAU2_FILTER_ZERO_STD=1 has no effect with GRPO_ASYNC=1: slime's fully async rollout applies no dynamic-sampling filter"
  fi
  ACTOR_GPUS=$((NUM_POLICY_GPUS - GRPO_ASYNC_ROLLOUT_GPUS))
  ((TRAIN_TP <= ACTOR_GPUS)) || TRAIN_TP="${ACTOR_GPUS}"
  ((ACTOR_GPUS % TRAIN_TP == 0)) || die "TRAIN_TP=${TRAIN_TP} does not divide the ${ACTOR_GPUS} training GPUs of GRPO_ASYNC=1"
fi
DP=$((ACTOR_GPUS / TRAIN_TP))
((GRPO_GLOBAL_BATCH_SIZE % DP == 0)) ||
  die "GRPO_GLOBAL_BATCH_SIZE=${GRPO_GLOBAL_BATCH_SIZE} is not a multiple of the data-parallel size ${DP}"
require_file "${GRPO_PROMPT_DATA}" "GRPO task index (python -m tau2_rl_pipeline.benchmark.tasks)"
require_dir "${GRPO_INIT_DIR}" "initial torch_dist checkpoint (scripts/train_rft.sh)"
require_file "${BASE_HF_DIR}/config.json" "base model (scripts/download.sh)"
require_dir "${SLIME_DIR}" "slime (SLIME_DIR)"
require_user_sim
# The user simulator is part of the reward: with GRPO_MAX_USER_FAILURE_RATE set, training starts only when
# GRPO_USER_QUALIFICATION (tau2-rl-qualify-user --user llm --output ... of this TAU2_USER_MODEL) shows the simulator
# failing the oracle agent at most that often (task faults apart; docs/evaluation.md).
GRPO_MAX_USER_FAILURE_RATE="${GRPO_MAX_USER_FAILURE_RATE:-}"
GRPO_USER_QUALIFICATION="${GRPO_USER_QUALIFICATION:-${TAU2_OUT_DIR}/qualify/user.json}"
if [[ -n "${GRPO_MAX_USER_FAILURE_RATE}" ]]; then
  require_number GRPO_MAX_USER_FAILURE_RATE "${GRPO_MAX_USER_FAILURE_RATE}"
  gate="$("${PYTHON}" -m eval.qualify --check "${GRPO_USER_QUALIFICATION}" \
    --max-failure-rate "${GRPO_MAX_USER_FAILURE_RATE}" 2>&1)" || die "${gate#error: }"
  note "${gate}"
fi
if [[ "${GRPO_ASYNC}" == 1 ]]; then
  note "layout ${TAU2_GPU_LAYOUT}, asynchronous: policy on GPUs ${POLICY_GPUS}: ${ACTOR_GPUS} training (TP${TRAIN_TP} x DP${DP}), ${GRPO_ASYNC_ROLLOUT_GPUS} rollout; user simulator on ${USER_SIM_GPUS}"
else
  note "layout ${TAU2_GPU_LAYOUT}: policy on GPUs ${POLICY_GPUS} (TP${TRAIN_TP} x DP${DP}), user simulator on ${USER_SIM_GPUS}"
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
  --rollout-num-gpus-per-engine 1
  --sglang-mem-fraction-static "${GRPO_SGLANG_MEM_FRACTION}"
)

CUSTOM_ARGS=(
  --custom-generate-function-path tau2_rl_pipeline.slime_plugins.adapter.generate
  --custom-reward-post-process-path tau2_rl_pipeline.slime_plugins.adapter.reward_post_process
  --custom-rollout-log-function-path tau2_rl_pipeline.slime_plugins.rollout_log.log_rollout_data
)
if [[ "${GRPO_ALGORITHM}" == awsft ]]; then
  CUSTOM_ARGS+=(--loss-type custom_loss --custom-loss-function-path tau2_rl_pipeline.slime_plugins.awsft.awsft_loss_function)
fi
if [[ "${FILTER_ZERO_STD}" == 1 ]]; then
  CUSTOM_ARGS+=(--dynamic-sampling-filter-path tau2_rl_pipeline.slime_plugins.adapter.filter_zero_std_groups)
fi

# Synchronous: train.py, rollout engines colocated with training. Asynchronous: train_async.py on split GPUs.
if [[ "${GRPO_ASYNC}" == 1 ]]; then
  ENTRY=train_async.py
  PLACEMENT_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node "${ACTOR_GPUS}"
    --rollout-num-gpus "${GRPO_ASYNC_ROLLOUT_GPUS}" --rollout-function-path "${GRPO_ASYNC_ROLLOUT_FUNCTION}")
  if [[ "${GRPO_PARTIAL_ROLLOUT}" == 1 ]]; then
    PLACEMENT_ARGS+=(--partial-rollout)
    if [[ "${GRPO_MASK_OFFPOLICY}" == 1 ]]; then
      PLACEMENT_ARGS+=(--mask-offpolicy-in-partial-rollout)
    fi
  fi
  if [[ "${GRPO_USE_TIS}" == 1 ]]; then
    PLACEMENT_ARGS+=(--use-tis)
  fi
else
  ENTRY=train.py
  PLACEMENT_ARGS=(--actor-num-nodes 1 --actor-num-gpus-per-node "${NUM_POLICY_GPUS}" --colocate)
fi

mapfile -t PERF_ARGS < <(perf_flags "${GRPO_MAX_TOKENS_PER_GPU}")
mapfile -t MISC_ARGS < <(misc_flags)
mapfile -t WANDB_ARGS < <(wandb_flags "${GRPO_WANDB_GROUP}")
mapfile -t EXTRA_ARGS < <(extra_flags)

ray_start_head
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
