#!/usr/bin/env bash
# Serve a policy checkpoint (Hugging Face format) with SGLang on the policy GPUs, for RFT sampling
# (scripts/generate_rft.sh) and evaluation. The rollout talks to its native /generate (token ids in, ids and
# log-probs out). Runs in the foreground (pipeline.sh starts it in the background); stop it with Ctrl-C.
#
#   bash scripts/start_policy_server.sh       # serves ${SFT_HF_DIR} on 127.0.0.1:${POLICY_PORT}
#   POLICY_MODEL_PATH=outputs/models/grpo_hf bash scripts/start_policy_server.sh
#   DRY_RUN=1 bash scripts/start_policy_server.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

POLICY_MODEL_PATH="${POLICY_MODEL_PATH:-${SFT_HF_DIR}}"
POLICY_HOST="${POLICY_HOST:-127.0.0.1}"
POLICY_TP="${POLICY_TP:-${ROLLOUT_GPUS_PER_ENGINE}}"  # the preset's SGLang engine size
POLICY_MEM_FRACTION="${POLICY_MEM_FRACTION:-0.7}"

require_uint POLICY_TP "${POLICY_TP}"
require_number POLICY_MEM_FRACTION "${POLICY_MEM_FRACTION}"
((NUM_POLICY_GPUS % POLICY_TP == 0)) || die "POLICY_TP=${POLICY_TP} does not divide the ${NUM_POLICY_GPUS} policy GPUs (${POLICY_GPUS})"
POLICY_DP=$((NUM_POLICY_GPUS / POLICY_TP))

require_file "${POLICY_MODEL_PATH}/config.json" "policy model (scripts/convert_megatron_to_hf.sh)"
require_port_free "${POLICY_PORT}" "policy server"
require_gpus "${POLICY_GPUS}" "policy server"
size_stage policy-server --nodes 1 --gpus-per-node "${NUM_POLICY_GPUS}" --rollout-gpus "${NUM_POLICY_GPUS}" \
  --engine-gpus "${POLICY_TP}" --mem-fraction "${POLICY_MEM_FRACTION}"
note "layout ${TAU2_GPU_LAYOUT}: policy server on GPUs ${POLICY_GPUS} (TP${POLICY_TP} x DP${POLICY_DP})"

launch_sglang "${POLICY_GPUS}" "${POLICY_MODEL_PATH}" "${POLICY_HOST}" "${POLICY_PORT}" "${POLICY_TP}" "${POLICY_DP}" \
  "${POLICY_MEM_FRACTION}"
