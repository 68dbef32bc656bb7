#!/usr/bin/env bash
# The main job on the embedded default: the staged recipe (SFT -> RFT -> GRPO, each stage evaluated) on this
# machine with a tiny model, an offline scripted user and tau2's mock domain. Extra arguments go to
# python -m tau2_rl_pipeline.local.pipeline (e.g. --domain airline, --device cuda, --model DIR).
set -euo pipefail
# shellcheck source=scripts/setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec python -m tau2_rl_pipeline.local.pipeline "$@"
