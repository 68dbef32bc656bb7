#!/usr/bin/env bash
# Stage: convert the base model from Hugging Face format to Megatron torch_dist, which slime trains from, with
# slime's tools/convert_hf_to_torch_dist.py and the model's Megatron architecture flags (MODEL_ARGS). One GPU.
#
#   bash scripts/convert_hf_to_megatron.sh    # ${BASE_HF_DIR} -> ${BASE_TORCH_DIST_DIR}
#   DRY_RUN=1 bash scripts/convert_hf_to_megatron.sh
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage convert_hf  # tau2_rl_pipeline/launch: every setting above read, checked and run there
