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
plan_stage judge  # tau2_rl_pipeline/launch: every setting above read, checked and run there
