#!/usr/bin/env bash
# Stage: supervised fine-tuning on tau2 conversations with tools (slime's train_async.py, training only).
#
#   bash scripts/train_sft.sh                 # seed data -> ${SFT_CKPT_DIR}
#   DRY_RUN=1 bash scripts/train_sft.sh       # print the commands instead
#
# Rows are {"messages": [...], "tools": [...]}; slime's SFT rollout builds tokens and the loss mask from them with
# the chat template itself (no --apply-chat-template: on slime main it turns the prompt into a string and drops the
# tools). The rollout function is slime's own, through tau2_rl_pipeline.slime_plugins.sft: it leaves the newline after each
# <|im_end|> untrained, as the local trainer does (the policy never samples it; see that module's docstring).
# Starts from SFT_INIT_DIR's weights at step 0; resumes if SFT_SAVE_DIR already holds a checkpoint.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
restart_on_node_faults "$@"  # MAX_RESTARTS: rerun from the checkpoint after a node fault (cluster_watch.sh)
source_model_args

SFT_DATA="${SFT_DATA:-${SEED_DATA}}"
SFT_INIT_DIR="${SFT_INIT_DIR:-${BASE_TORCH_DIST_DIR}}"
SFT_SAVE_DIR="${SFT_SAVE_DIR:-${SFT_CKPT_DIR}}"
SFT_WANDB_GROUP="${SFT_WANDB_GROUP:-sft-${MODEL_SHORT}}"
# The original cookbook's settings: 2 epochs, lr cosine after 5% warmup. SFT_BATCH_SIZE, SFT_LR, SFT_MIN_LR and
# SFT_MAX_TOKENS_PER_GPU follow the model preset (common.sh; for the 4B the original's 16, 1e-5, 1e-6, 12288).
SFT_EPOCHS="${SFT_EPOCHS:-2}"
SFT_WARMUP_FRACTION="${SFT_WARMUP_FRACTION:-0.05}"
SFT_WEIGHT_DECAY="${SFT_WEIGHT_DECAY:-0.01}"
SFT_SAVE_INTERVAL="${SFT_SAVE_INTERVAL:-50}"

for name in SFT_EPOCHS SFT_BATCH_SIZE SFT_SAVE_INTERVAL SFT_MAX_TOKENS_PER_GPU; do require_uint "${name}" "${!name}"; done
for name in SFT_LR SFT_MIN_LR SFT_WARMUP_FRACTION SFT_WEIGHT_DECAY; do require_number "${name}" "${!name}"; done
cluster_placement train
DP=$((ACTOR_NUM_NODES * ACTOR_GPUS_PER_NODE / (TRAIN_TP * TRAIN_PP * TRAIN_CP)))
((SFT_BATCH_SIZE % DP == 0)) || die "SFT_BATCH_SIZE=${SFT_BATCH_SIZE} is not a multiple of the data-parallel size ${DP}"
require_file "${SFT_DATA}" "SFT data (scripts/download.sh, or generate_rft.sh for RFT)"
require_dir "${SFT_INIT_DIR}" "initial torch_dist checkpoint (scripts/convert_hf_to_megatron.sh)"
require_file "${BASE_HF_DIR}/config.json" "base model (scripts/download.sh)"
require_dir "${SLIME_DIR}" "slime (SLIME_DIR)"
size_stage sft --nodes "${ACTOR_NUM_NODES}" --gpus-per-node "${ACTOR_GPUS_PER_NODE}" \
  --max-tokens-per-gpu "${SFT_MAX_TOKENS_PER_GPU}"
note "layout ${TAU2_GPU_LAYOUT}: training on GPUs ${POLICY_GPUS} of ${NUM_NODES} node(s) (TP${TRAIN_TP} x DP${DP})"

mapfile -t CKPT_ARGS < <(checkpoint_flags "${SFT_INIT_DIR}" "${SFT_SAVE_DIR}")
CKPT_ARGS=(
  --hf-checkpoint "${BASE_HF_DIR}"
  "${CKPT_ARGS[@]}"
  --save-interval "${SFT_SAVE_INTERVAL}"
)

SFT_ARGS=(
  --rollout-function-path tau2_rl_pipeline.slime_plugins.sft.generate_rollout
  --prompt-data "${SFT_DATA}"
  --input-key messages
  --tool-key tools
  --loss-mask-type "${LOSS_MASK_TYPE}"
  --rollout-shuffle
  --num-epoch "${SFT_EPOCHS}"
  --rollout-batch-size "${SFT_BATCH_SIZE}"
  --global-batch-size "${SFT_BATCH_SIZE}"
  --loss-type sft_loss
  --calculate-per-token-loss
  --disable-compute-advantages-and-returns
  --debug-train-only
)

OPTIMIZER_ARGS=(
  --optimizer adam
  --lr "${SFT_LR}"
  --lr-decay-style cosine
  --min-lr "${SFT_MIN_LR}"
  --lr-warmup-fraction "${SFT_WARMUP_FRACTION}"
  --weight-decay "${SFT_WEIGHT_DECAY}"
  --adam-beta1 0.9
  --adam-beta2 0.98
)

mapfile -t PERF_ARGS < <(perf_flags "${SFT_MAX_TOKENS_PER_GPU}")
mapfile -t MISC_ARGS < <(misc_flags)
mapfile -t WANDB_ARGS < <(wandb_flags "${SFT_WANDB_GROUP}")
mapfile -t EXTRA_ARGS < <(extra_flags)
mapfile -t PLACEMENT_ARGS < <(placement_flags)

# Every node must see the checkpoint it writes and what it reads, as the head has it (shared storage; checked on a
# multi-node cluster: the data identical, the checkpoint --load names (SFT_SAVE_DIR on a resume, else SFT_INIT_DIR)
# and the HF model complete).
ray_cluster_up "${SFT_SAVE_DIR}" -- --data "${SFT_DATA}" \
  --checkpoint "$(loaded_checkpoint "${SFT_INIT_DIR}" "${SFT_SAVE_DIR}")" --hf-model "${BASE_HF_DIR}"
ray_submit train_async.py \
  "${PLACEMENT_ARGS[@]}" \
  "${MODEL_ARGS[@]}" \
  "${CKPT_ARGS[@]}" \
  "${SFT_ARGS[@]}" \
  "${OPTIMIZER_ARGS[@]}" \
  "${PERF_ARGS[@]}" \
  "${MISC_ARGS[@]}" \
  "${WANDB_ARGS[@]}" \
  "${EXTRA_ARGS[@]}"
