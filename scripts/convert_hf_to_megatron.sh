#!/usr/bin/env bash
# Stage: convert the base model from Hugging Face format to Megatron torch_dist, which slime trains from, with
# slime's tools/convert_hf_to_torch_dist.py and the model's Megatron architecture flags (MODEL_ARGS). One GPU.
#
#   bash scripts/convert_hf_to_megatron.sh    # ${BASE_HF_DIR} -> ${BASE_TORCH_DIST_DIR}
#   DRY_RUN=1 bash scripts/convert_hf_to_megatron.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage env  # the settings (paths, layout, preset) from tau2_rl_pipeline/launch
source_model_args

CONVERT_HF_DIR="$(abs_path "${CONVERT_HF_DIR:-${BASE_HF_DIR}}")" # the converter runs in SLIME_DIR
CONVERT_OUT_DIR="$(abs_path "${CONVERT_OUT_DIR:-${BASE_TORCH_DIST_DIR}}")"
CONVERT_GPU="${CONVERT_GPU:-${POLICY_GPUS%%,*}}"

require_file "${CONVERT_HF_DIR}/config.json" "Hugging Face model (scripts/download.sh)"
require_file "${SLIME_DIR}/tools/convert_hf_to_torch_dist.py" "slime's converter (SLIME_DIR)"
require_dir "${MEGATRON_DIR}" "Megatron-LM (MEGATRON_DIR)"
[[ -e "${CONVERT_OUT_DIR}/latest_checkpointed_iteration.txt" ]] &&
  die "${CONVERT_OUT_DIR} already holds a checkpoint; remove it to convert again"
require_gpus "${CONVERT_GPU}" "conversion"

enter_dir "${SLIME_DIR}"
run env CUDA_VISIBLE_DEVICES="${CONVERT_GPU}" PYTHONPATH="${MEGATRON_DIR}:${SLIME_DIR}" \
  "${PYTHON}" "${SLIME_DIR}/tools/convert_hf_to_torch_dist.py" \
  "${MODEL_ARGS[@]}" \
  --hf-checkpoint "${CONVERT_HF_DIR}" \
  --save "${CONVERT_OUT_DIR}"
