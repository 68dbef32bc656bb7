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
plan_stage download  # tau2_rl_pipeline/launch: every setting above read, checked and run there
