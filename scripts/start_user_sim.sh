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
plan_stage user_sim  # tau2_rl_pipeline/launch: every setting above read, checked and run there
