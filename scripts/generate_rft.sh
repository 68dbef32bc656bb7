#!/usr/bin/env bash
# Stage: rejection sampling. Plays each train task RFT_NUM_SAMPLES times with the SFT policy (served by
# scripts/start_policy_server.sh) against the user simulator, keeps the successful trajectories (else a task's best
# partial one) and writes them, merged with the seed data, as the next SFT's data.
#
#   bash scripts/generate_rft.sh              # -> ${RFT_DATA}
#   DRY_RUN=1 bash scripts/generate_rft.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

RFT_POLICY_URL="${RFT_POLICY_URL:-http://127.0.0.1:${POLICY_PORT}}"
RFT_NUM_SAMPLES="${RFT_NUM_SAMPLES:-8}"
RFT_TEMPERATURE="${RFT_TEMPERATURE:-0.8}"
# the checkpoint the policy server serves (its tokenizer turns the episodes into tokens)
RFT_HF_CHECKPOINT="${RFT_HF_CHECKPOINT:-${POLICY_MODEL_PATH:-${SFT_HF_DIR}}}"

require_uint RFT_NUM_SAMPLES "${RFT_NUM_SAMPLES}"
require_number RFT_TEMPERATURE "${RFT_TEMPERATURE}"
require_file "${SEED_DATA}" "seed SFT data (scripts/download.sh)"
require_file "${RFT_HF_CHECKPOINT}/config.json" "the served policy checkpoint (RFT_HF_CHECKPOINT)"
require_servers "${RFT_POLICY_URL}" /health "policy server (scripts/start_policy_server.sh)"
require_user_sim

enter_dir "${TAU2_ROOT}"
run "${PYTHON}" -m tau2_rl_pipeline.selection.rft \
  --sglang-url "${RFT_POLICY_URL}" \
  --hf-checkpoint "${RFT_HF_CHECKPOINT}" \
  --domains "${DOMAINS}" \
  --num-samples "${RFT_NUM_SAMPLES}" \
  --temperature "${RFT_TEMPERATURE}" \
  --out "${RFT_DATA}" \
  --merge-with "${SEED_DATA}"
