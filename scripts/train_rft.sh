#!/usr/bin/env bash
# Stage: rejection-sampling fine-tuning, i.e. SFT continued from the SFT checkpoint on the seed data plus the successful
# trajectories scripts/generate_rft.sh sampled from the SFT model (the recipe's stage graph, launch/recipe.py, as the
# local pipeline does; RFT_INIT_DIR=<the base torch_dist dir> gives the original cookbook's "SFT1", from the base model
# again). It is train_sft.sh with RFT's data, starting point and checkpoint directory; every SFT_* setting applies.
#
#   bash scripts/train_rft.sh                 # ${RFT_DATA} -> ${RFT_CKPT_DIR}
#   DRY_RUN=1 bash scripts/train_rft.sh       # print the commands instead
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage rft  # tau2_rl_pipeline/launch: every setting above read, checked and run there
