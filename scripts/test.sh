#!/usr/bin/env bash
# Set up (once) and run the test suite on 2 cores; extra arguments go to pytest.
set -euo pipefail
# shellcheck source=scripts/setup.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec python -m pytest -n "${TAU2_TEST_WORKERS:-2}" "$@"
