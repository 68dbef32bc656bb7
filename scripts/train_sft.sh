#!/usr/bin/env bash
# Stage: supervised fine-tuning on tau2 conversations with tools (slime's train_async.py, training only).
#
#   bash scripts/train_sft.sh                 # seed data -> ${SFT_CKPT_DIR}
#   DRY_RUN=1 bash scripts/train_sft.sh       # print the commands instead
#
# Rows are {"messages": [...], "tools": [...]}; slime's SFT rollout builds tokens and the loss mask from them with
# the chat template itself (no --apply-chat-template: on slime main it turns the prompt into a string and drops the
# tools). The rollout function is slime's own, through tau2_rl_pipeline.slime_plugins.sft: it leaves the newline after each
# <|im_end|> untrained, as the local trainer does (the policy never samples it; see that module's docstring).
# Starts from SFT_INIT_DIR's weights at step 0; resumes if SFT_SAVE_DIR already holds a checkpoint.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage sft  # tau2_rl_pipeline/launch: every setting above read, checked and run there
