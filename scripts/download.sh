#!/usr/bin/env bash
# Stage: download the base model and build the SFT seed data.
#
#   bash scripts/download.sh                  # model -> ${BASE_HF_DIR} (and the user simulator's), seed rows -> ${SEED_DATA}
#   SEED_SOURCE=oracle bash scripts/download.sh   # seed rows from tau2's gold actions instead (no dataset download)
#   DRY_RUN=1 bash scripts/download.sh
#
# A gated or private repository needs HF_TOKEN in the environment; it is never put on a command line.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage env  # the settings (paths, layout, preset) from tau2_rl_pipeline/launch

HF_CLI="${HF_CLI:-hf}"
SEED_SOURCE="${SEED_SOURCE:-hub}"
SEED_DATASET="${SEED_DATASET:-Jarrodbarnes/tau2-sft-seed-v3}"
require_choice SEED_SOURCE "${SEED_SOURCE}" hub oracle
[[ "${HF_HUB_OFFLINE:-0}" == 1 ]] && problem "HF_HUB_OFFLINE=1 switches downloads off"
require_tool "${HF_CLI}" "the Hugging Face CLI from huggingface_hub; set HF_CLI to another"

run "${HF_CLI}" download "${HF_MODEL_ID}" --local-dir "${BASE_HF_DIR}"
# The user simulator's (and judge's) model, when MODEL trains another one.
if [[ "${USER_SIM_HF_DIR}" != "${BASE_HF_DIR}" ]]; then
  run "${HF_CLI}" download "${USER_SIM_HF_ID}" --local-dir "${USER_SIM_HF_DIR}"
fi
enter_dir "${TAU2_ROOT}"
if [[ "${SEED_SOURCE}" == hub ]]; then
  run "${PYTHON}" -m tau2_rl_pipeline.learning.sft_data seed --dataset "${SEED_DATASET}" --out "${SEED_DATA}"
else
  run "${PYTHON}" -m tau2_rl_pipeline.learning.sft_data oracle --domains "${DOMAINS}" --split train --out "${SEED_DATA}"
fi
