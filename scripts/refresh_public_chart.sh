#!/usr/bin/env bash
# Regenerate the Pass@k chart in public/ from the latest reference run (a summary JSON of eval/eval_passk.py).
#
#   bash scripts/refresh_public_chart.sh [SUMMARY_JSON]   # default: ${REFERENCE_SUMMARY}
#   bash scripts/refresh_public_chart.sh --demo           # first run the offline mock demo, then chart it
#   DRY_RUN=1 bash scripts/refresh_public_chart.sh --demo
#
# Writes ${PUBLIC_DIR}/passk_reference.png and ${PUBLIC_DIR}/passk_reference.json (a copy of the summary).
# --demo: a tiny randomly initialized Qwen3 with a small mock-domain tokenizer (built in ${DEMO_DIR}), the
# offline scripted user, the mock domain. It checks the plumbing end to end; its numbers are not a tau2 score,
# and the chart title says so.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REFERENCE_SUMMARY="${REFERENCE_SUMMARY:-${TAU2_OUT_DIR}/eval/reference.json}"
PUBLIC_DIR="${PUBLIC_DIR:-${TAU2_ROOT}/public}"
DEMO_DIR="${DEMO_DIR:-outputs/eval/demo}"  # relative to the repository: the summary copied to public/ names it
DEMO_SAMPLES="${DEMO_SAMPLES:-4}"
CHART_TITLE="${CHART_TITLE:-tau2 Pass@k (reference run)}"
DEMO_TITLE="mock domain, tiny random model, scripted user: plumbing check, not a tau2 score"
require_uint DEMO_SAMPLES "${DEMO_SAMPLES}"

(($# <= 1)) || die "usage: $(basename "$0") [SUMMARY_JSON | --demo]"
if [[ "${1:-}" != "--demo" ]]; then
  summary="${1:-${REFERENCE_SUMMARY}}"
  [[ "${summary}" == /* ]] || summary="${PWD}/${summary}"
  [[ -f "${summary}" ]] || die "reference summary not found: ${summary} (run eval/eval_passk.py first, pass its --output, or use --demo)"
fi
enter_dir "${TAU2_ROOT}"  # python -m eval.* resolves from the repository root
if [[ "${1:-}" == "--demo" ]]; then
  summary="${DEMO_DIR}/mock_demo.json"
  title="${DEMO_TITLE}"
  # shellcheck disable=SC2016  # $1 belongs to the Python snippet's sys.argv, not to the shell
  run "${PYTHON}" -c 'import sys; from tau2_rl_pipeline.tiny_model import build_tiny_qwen3, domain_corpus, train_small_tokenizer; build_tiny_qwen3(sys.argv[1] + "/tiny-model", train_small_tokenizer(domain_corpus(["mock"]), sys.argv[1] + "/tokenizer"))' "${DEMO_DIR}"
  run "${PYTHON}" -m eval.eval_passk --backend local --model "${DEMO_DIR}/tiny-model" --user scripted \
    --domains mock --task-split base --num-samples "${DEMO_SAMPLES}" \
    --temperature 1.0 --top-p 1.0 --top-k -1 --max-new-tokens 16 --max-turns 3 \
    --output "${summary}"
else
  title="${CHART_TITLE}"
fi
run mkdir -p "${PUBLIC_DIR}"
run "${PYTHON}" -m eval.report --summary "${summary}" --chart "${PUBLIC_DIR}/passk_reference.png" \
  --title "${title}" --copy-summary "${PUBLIC_DIR}/passk_reference.json"
