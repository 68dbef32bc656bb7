#!/usr/bin/env bash
# Stage: export a trained torch_dist checkpoint to Hugging Face format (for SGLang servers and evaluation) with
# slime's tools/convert_torch_dist_to_hf.py. Config and tokenizer files come from the base model's directory.
#
#   CKPT_IN=outputs/checkpoints/sft HF_OUT=outputs/models/sft_hf bash scripts/convert_megatron_to_hf.sh
#   DRY_RUN=1 ... bash scripts/convert_megatron_to_hf.sh
#
# CKPT_IN is a --save directory; ITER picks an iteration (default: the one latest_checkpointed_iteration.txt names).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage env  # the settings (paths, layout, preset) from tau2_rl_pipeline/launch

CKPT_IN="$(abs_path "${CKPT_IN:-${SFT_CKPT_DIR}}")" # relative paths from here: the converter runs in SLIME_DIR
HF_OUT="$(abs_path "${HF_OUT:-${SFT_HF_DIR}}")"
ORIGIN_HF_DIR="$(abs_path "${ORIGIN_HF_DIR:-${BASE_HF_DIR}}")"
ITER="${ITER:-}"

TRACKER="${CKPT_IN}/latest_checkpointed_iteration.txt"
if [[ -z "${ITER}" && -f "${TRACKER}" ]]; then
  ITER="$(tr -d '[:space:]' <"${TRACKER}")"
fi
if [[ -z "${ITER}" ]]; then
  is_dry || die "no checkpoint in ${CKPT_IN} (${TRACKER} missing); set CKPT_IN or ITER"
  note "warning: ${TRACKER} not there yet; the dry run shows iter_LATEST"
  ITER_DIR="${CKPT_IN}/iter_LATEST"
else
  if [[ "${ITER}" == release ]]; then # what slime's convert_hf_to_torch_dist.py writes
    ITER_DIR="${CKPT_IN}/release"
  else
    [[ "${ITER}" =~ ^[0-9]+$ ]] || die "ITER=${ITER} must be an iteration number or release"
    ITER_DIR="$(printf '%s/iter_%07d' "${CKPT_IN}" "$((10#${ITER}))")" # Megatron's directory naming
  fi
  require_dir "${ITER_DIR}" "checkpoint iteration"
fi
require_file "${ORIGIN_HF_DIR}/config.json" "base model (scripts/download.sh)"
require_file "${SLIME_DIR}/tools/convert_torch_dist_to_hf.py" "slime's converter (SLIME_DIR)"
[[ -e "${HF_OUT}/config.json" ]] && die "${HF_OUT} already holds a model; remove it to export again"

enter_dir "${SLIME_DIR}"
run env PYTHONPATH="${MEGATRON_DIR}:${SLIME_DIR}" \
  "${PYTHON}" "${SLIME_DIR}/tools/convert_torch_dist_to_hf.py" \
  --input-dir "${ITER_DIR}" \
  --output-dir "${HF_OUT}" \
  --origin-hf-dir "${ORIGIN_HF_DIR}"
