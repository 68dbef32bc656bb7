#!/usr/bin/env bash
# Set up (once) and run the test suite on 2 cores; extra arguments go to pytest.
# The contract tier (tests/contract) runs slime's and Megatron-LM's own code from ../shared/third_party (or
# TAU2_THIRD_PARTY): its extra packages are installed when that folder is there, and it skips with one line if not.
set -euo pipefail
# shellcheck source=scripts/setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
THIRD_PARTY="${TAU2_THIRD_PARTY:-${ROOT}/../shared/third_party}"
if [[ -d "${THIRD_PARTY}/slime-624b824" ]]; then
  python -m pip install -q --require-hashes --no-deps -r requirements-contract.lock
fi
exec python -m pytest -n "${TAU2_TEST_WORKERS:-2}" "$@"
