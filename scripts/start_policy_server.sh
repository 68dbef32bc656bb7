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
plan_stage policy_server  # tau2_rl_pipeline/launch: every setting above read, checked and run there
