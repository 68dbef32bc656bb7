# shellcheck shell=bash
# Sourced by common.sh: the runner of a stage plan's cluster steps (tau2_rl_pipeline/launch/cluster.py decides which
# nodes, which commands, in which order: see there and docs/multi-node.md). Here only the running: the Ray head and
# the workers started (over ssh, or here with RAY_WORKER_LAUNCH=local), the EXIT trap that stops them, the cluster
# check's files and log, slime's job (cluster_watch.sh watches it). A later launcher (Slurm) joins with RAY_ADDRESS.

RAY_STARTED=0
WORKERS_STARTED=()
WORKER_PIDS=()
WORKER_LOGS=()
WORKER_SSH=()
WORKER_LAUNCH=ssh  # the plan's RAY_WORKER_LAUNCH

# The command that runs shell command line $2 on worker $1, into WORKER_CMD: over WORKER_SSH, or here.
worker_cmd() {
  if ((${#WORKER_SSH[@]} == 0)); then WORKER_CMD=(bash -c "$2"); else WORKER_CMD=("${WORKER_SSH[@]}" "$1" "$2"); fi
}

# The Ray head (the plan's command), from slime's root; the EXIT trap stops it and every worker tried.
step_head() {
  RAY_STARTED=1  # before the start: a head that fails half-way is stopped too
  trap ray_stop_cluster EXIT
  run "$@"
}

# step_worker IP SLIME_DIR LEASH CMD...: `ray start --address` on worker IP, from slime's root, in the background (all
# at once, as slime's script does); LEASH=1 appends the head leash (cluster_watch.sh). Recorded before its start, so
# the EXIT trap stops every worker tried.
step_worker() {
  local ip=$1 dir=$2 leash=$3 line
  shift 3
  line="$(printf 'cd %q && ' "${dir}")$(printf '%q ' "$@")"
  line="${line% }"
  [[ "${leash}" != 1 ]] || line+=" && $(head_leash_line)"
  worker_cmd "${ip}" "${line}"
  show_cmd "${WORKER_CMD[@]}"
  WORKERS_STARTED+=("${ip}")
  is_dry && return 0
  WORKER_LOGS+=("$(mktemp)")
  "${WORKER_CMD[@]}" >"${WORKER_LOGS[-1]}" 2>&1 &
  WORKER_PIDS+=($!)
}

# Every worker's start waited for before failing (a worker still starting when another fails would otherwise start
# after its `ray stop`); the first that failed is named with the last line it printed.
step_workers_wait() {
  local i failed=""
  for i in "${!WORKER_PIDS[@]}"; do
    wait "${WORKER_PIDS[i]}" || [[ -n "${failed}" ]] ||
      failed="worker ${WORKERS_STARTED[i]} could not join the Ray cluster at ${MASTER_ADDR}:${RAY_GCS_PORT}: $(tail -n 1 "${WORKER_LOGS[i]}")"
  done
  rm -f "${WORKER_LOGS[@]}"
  [[ -z "${failed}" ]] || die "${failed}"
}

# Stop what step_head and step_worker started or tried to: each worker over ssh (local: the head's `ray stop` stops
# every raylet here), then the head. Once; a worker whose stop fails is named and the others are still stopped.
ray_stop_cluster() {
  local ip
  [[ "${RAY_STARTED}" == 1 ]] || return 0
  RAY_STARTED=0
  if [[ "${WORKER_LAUNCH}" == ssh ]]; then
    for ip in "${WORKERS_STARTED[@]}"; do
      worker_cmd "${ip}" "ray stop"
      run "${WORKER_CMD[@]}" ||
        note "warning: ray stop on worker ${ip} failed: its leash stops its Ray once the head has been silent for RAY_HEAD_LOST_TIMEOUT=${RAY_HEAD_LOST_TIMEOUT} s; if it answers ssh again, run ray stop there"
    done
  fi
  WORKERS_STARTED=()
  run ray stop || note "warning: ray stop on the head failed"
}

# step_check LOG TOKEN DIR -- CMD...: the cluster check (tau2_rl_pipeline/cluster/check.py): DIR gets a check file
# with TOKEN that every node must read back; CMD (the plan's) checks that and what the stage reads; its log is LOG.
step_check() {
  local log=$1 token=$2 dir=$3 answer
  shift 4
  show_cmd "$@"
  is_dry && return 0
  if ! { mkdir -p "${dir}" && printf '%s' "${token}" >"${dir}/.tau2-shared-check"; }; then
    die "cannot write the shared-storage check file in ${dir}"
  fi
  mkdir -p "$(dirname "${log}")"
  if ! "$@" >"${log}" 2>&1; then
    answer="$(grep -m1 -o 'cluster check failed: .*' "${log}" || true)"
    die "${answer:-cluster check did not run: $(tail -n 1 "${log}")} (log: ${log})"
  fi
  rm -f "${dir}/.tau2-shared-check"
  note "$(grep -m1 -o 'cluster check: .*' "${log}" || printf 'cluster check passed')"
}

# slime's job: watched on a cluster this script started on several nodes (WATCH_CMD, cluster_watch.sh). The place
# for a supervisor that restarts a failed job (MAX_RESTARTS) is here, around watched_job: the plan stays the same.
step_job() { watched_job "$@"; }
