#!/usr/bin/env bash
# Serve the user simulator: an SGLang server (OpenAI-compatible /v1) on USER_SIM_GPUS that the user-simulator client
# (the async one, or litellm) reaches as TAU2_USER_MODEL=openai/<served name> at TAU2_USER_API_BASE. Runs in the
# foreground (pipeline.sh starts it in the background); stop it with Ctrl-C.
#
#   bash scripts/start_user_sim.sh            # serves ${USER_SIM_HF_DIR} on 127.0.0.1:30001 by default
#   DRY_RUN=1 bash scripts/start_user_sim.sh
#
# The served name and port come from TAU2_USER_MODEL and TAU2_USER_API_BASE, so the server is always where the
# rollout looks for it. --tool-call-parser: in telecom the simulated user calls its own tools.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage env  # the settings (paths, layout, preset) from tau2_rl_pipeline/launch

USER_SIM_MODEL_PATH="${USER_SIM_MODEL_PATH:-${USER_SIM_HF_DIR}}"
USER_SIM_HOST="${USER_SIM_HOST:-127.0.0.1}"
USER_SIM_MEM_FRACTION="${USER_SIM_MEM_FRACTION:-0.85}"
USER_SIM_TOOL_PARSER="${USER_SIM_TOOL_PARSER:-qwen25}"

served_endpoint TAU2_USER_API_BASE TAU2_USER_MODEL http://127.0.0.1:30001/v1 "user simulator"
USER_SIM_PORT="${SERVED_PORT}"
require_number USER_SIM_MEM_FRACTION "${USER_SIM_MEM_FRACTION}"
# shellcheck disable=SC2153  # USER_SIM_TP: exported by the plan (plan_stage env)
USER_SIM_DP=$((NUM_USER_SIM_GPUS / USER_SIM_TP))

require_file "${USER_SIM_MODEL_PATH}/config.json" "user simulator model (scripts/download.sh)"
require_port_free "${USER_SIM_PORT}" "user simulator"
require_gpus "${USER_SIM_GPUS}" "user simulator"
note "layout ${TAU2_GPU_LAYOUT}: user simulator on GPUs ${USER_SIM_GPUS} (TP${USER_SIM_TP} x DP${USER_SIM_DP})"

launch_sglang "${USER_SIM_GPUS}" "${USER_SIM_MODEL_PATH}" "${USER_SIM_HOST}" "${USER_SIM_PORT}" "${USER_SIM_TP}" \
  "${USER_SIM_DP}" "${USER_SIM_MEM_FRACTION}" --served-model-name "${SERVED_NAME}" \
  --tool-call-parser "${USER_SIM_TOOL_PARSER}"
