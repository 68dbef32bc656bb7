#!/usr/bin/env bash
# One prepared GPU check (issue 33), one command from the repository root; done in under 8 minutes on one H100.
#   bash bench/gpu_check.sh          # parity, P7, the engine, the mock demo on CUDA; results in $OUT
#   bash bench/gpu_check.sh --cpu    # the same parts at tiny sizes on the CPU, under a minute (the tests run it)
# Writes gpu_check.json, gpu_check.log (and demo.log, demo_report.json) into $OUT (default outputs/gpu_check).
# The GPU image has torch and transformers but not tau2, litellm or pydantic: when .wheelhouse/ is here (built by
# bench/gpu_wheelhouse.sh on a machine with a package index, and carried along) they are installed from it into a
# folder of their own first; without it every part but the demo still runs.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-outputs/gpu_check}"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false LITELLM_LOCAL_MODEL_COST_MAP=True
mkdir -p "${OUT}"
# The interpreter: PYTHON when set, else the project's venv (scripts/setup.sh makes it: TAU2_VENV, default .venv)
# when it runs here, else python3 (the GPU image: torch and transformers installed, no venv).
VENV="${TAU2_VENV:-.venv}"
if [[ -n "${PYTHON:-}" ]]; then
  PY="${PYTHON}"
elif [[ -x "${VENV}/bin/python" ]] && "${VENV}/bin/python" -c '' 2>/dev/null; then
  PY="${VENV}/bin/python"
else
  PY=python3
fi
if [[ "${1:-}" != "--cpu" && -d .wheelhouse ]] && compgen -G ".wheelhouse/*.whl" >/dev/null; then
  site="$(mktemp -d)"
  echo "gpu_check: installing $(ls .wheelhouse/*.whl | wc -l) wheels from .wheelhouse into ${site}"
  "${PY}" -m pip install -q --no-index --no-deps --no-compile --target "${site}" .wheelhouse/*.whl ||
    echo "gpu_check: the wheelhouse did not install (above); the demo part will say so"
  export PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}"
fi
exec "${PY}" bench/gpu_check.py "$@"
