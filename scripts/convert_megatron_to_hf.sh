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
plan_stage convert_megatron  # tau2_rl_pipeline/launch: every setting above read, checked and run there
