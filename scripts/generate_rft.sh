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
plan_stage rft_gen  # tau2_rl_pipeline/launch: every setting above read, checked and run there
