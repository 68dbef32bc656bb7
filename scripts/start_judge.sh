#!/usr/bin/env bash
# Serve tau2 1.0.1's NL-assertion judge: an SGLang server (OpenAI-compatible /v1) that the judge client
# (tau2_rl_pipeline/benchmark/judge.py) reaches as TAU2_JUDGE_MODEL=openai/<served name> at TAU2_JUDGE_API_BASE. Only tau2 1.0.1
# needs one (retail's NL assertions); tau2's own default is gpt-4.1-2025-04-14 over the OpenAI API. Foreground; Ctrl-C.
#
#   TAU2_JUDGE_MODEL=openai/judge TAU2_JUDGE_API_BASE=http://127.0.0.1:30002/v1 JUDGE_MODEL_PATH=/models/Qwen3-32B \
#       bash scripts/start_judge.sh
#   DRY_RUN=1 bash scripts/start_judge.sh
#
# It shares the user simulator's GPUs (JUDGE_GPUS, default USER_SIM_GPUS) with a smaller memory fraction; or point
# TAU2_JUDGE_MODEL / TAU2_JUDGE_API_BASE at the user-simulator server itself and serve nothing more.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage env  # the settings (paths, layout, preset) from tau2_rl_pipeline/launch

JUDGE_MODEL_PATH="${JUDGE_MODEL_PATH:-${USER_SIM_HF_DIR}}"
JUDGE_HOST="${JUDGE_HOST:-127.0.0.1}"
JUDGE_GPUS="${JUDGE_GPUS:-${USER_SIM_GPUS}}"
JUDGE_TP="${JUDGE_TP:-1}"
JUDGE_MEM_FRACTION="${JUDGE_MEM_FRACTION:-0.4}"

served_endpoint TAU2_JUDGE_API_BASE TAU2_JUDGE_MODEL http://127.0.0.1:30002/v1 judge
JUDGE_PORT="${SERVED_PORT}"
require_number JUDGE_MEM_FRACTION "${JUDGE_MEM_FRACTION}"
require_uint JUDGE_TP "${JUDGE_TP}"
JUDGE_DP=$(($(gpu_count "${JUDGE_GPUS}") / JUDGE_TP))
((JUDGE_DP >= 1)) || die "JUDGE_TP=${JUDGE_TP} is more than the judge GPUs (${JUDGE_GPUS})"
require_file "${JUDGE_MODEL_PATH}/config.json" "judge model"
require_port_free "${JUDGE_PORT}" "judge"
require_gpus "${JUDGE_GPUS}" "judge"
note "judge server: ${JUDGE_MODEL_PATH} served as ${SERVED_NAME} on GPUs ${JUDGE_GPUS} (TP${JUDGE_TP} x DP${JUDGE_DP}), port ${JUDGE_PORT}"

launch_sglang "${JUDGE_GPUS}" "${JUDGE_MODEL_PATH}" "${JUDGE_HOST}" "${JUDGE_PORT}" "${JUDGE_TP}" "${JUDGE_DP}" \
  "${JUDGE_MEM_FRACTION}" --served-model-name "${SERVED_NAME}"
