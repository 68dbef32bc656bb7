#!/usr/bin/env bash
# Set up (once) and run the test suite: creates .venv if missing, installs the package with its
# local and test extras (CPU torch pinned so pip never pulls a multi-GB CUDA build), runs pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
PYTHON="${PYTHON:-python3}"
VENV="${TAU2_VENV:-${ROOT}/.venv}"
if [[ ! -x "${VENV}/bin/python" ]]; then
  "${PYTHON}" -m venv "${VENV}"
fi
# shellcheck disable=SC1091
source "${VENV}/bin/activate"
python -m pip install -q --upgrade pip >/dev/null
python -m pip install -q -r requirements.lock
python -m pip install -q --no-deps -e ".[local,test]"
export LITELLM_LOCAL_MODEL_COST_MAP=True
export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
exec python -m pytest "$@"
