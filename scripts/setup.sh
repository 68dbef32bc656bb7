#!/usr/bin/env bash
# Sourced by test.sh and demo.sh: creates the virtual environment if missing and installs the pinned
# dependencies (requirements.lock: exact versions, CPU torch on a CPU machine) and this package.
# TAU2_VENV picks the environment's directory (default .venv in the repository).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}" || exit 1
PYTHON="${PYTHON:-python3}"
VENV="${TAU2_VENV:-${ROOT}/.venv}"
if [[ ! -x "${VENV}/bin/python" ]]; then
  "${PYTHON}" -m venv "${VENV}"
fi
# shellcheck disable=SC1091
source "${VENV}/bin/activate"
python -m pip install -q "pip==26.3" >/dev/null  # the pip that checks the hashes below, pinned too
# Every file hash-checked against the lock (scripts/lock.sh); torch pinned apart (no PyPI hash covers its CPU
# build); the package built with the locked setuptools rather than a fresh unpinned one (no build isolation).
python -m pip install -q --require-hashes -r requirements.lock
python -m pip install -q --no-deps -r requirements-torch.txt
python -m pip install -q --no-deps --no-build-isolation -e ".[local,test]"
export LITELLM_LOCAL_MODEL_COST_MAP=True
export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
