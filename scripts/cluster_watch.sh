# shellcheck shell=bash
# Sourced by common.sh (after cluster.sh): keeping watch over a multi-node run the scripts started, from both ends.
# On the head, `watched_job` runs slime's job with cluster_watch beside it, so a node that leaves the Ray cluster
# stops the run in one line naming it; on each worker, `head_leash_line` (appended to its `ray start` over ssh) stops
# that worker's Ray once the head has been silent for RAY_HEAD_LOST_TIMEOUT seconds. What each fault does on separate
# hosts, with times: tests/contract/test_hosts_faults.py, docs/hardening.md.

WATCH_CMD=()  # the plan's: the watch of a cluster started here on several nodes (empty: nothing to watch)

# After a worker's `ray start` over ssh: a loop on that worker that stops its Ray (`ray stop --force`: the head is
# gone, there is nothing to stop gracefully for) once the head's GCS has not answered for RAY_HEAD_LOST_TIMEOUT
# seconds, and ends by itself (within 3 s) once that worker's raylet is gone (the EXIT trap's `ray stop`). It knocks
# every second, each knock given 2 s (room for one retransmitted SYN on a busy link), so it starts the stop within
# RAY_HEAD_LOST_TIMEOUT + 4 s of the head's last answer (bash's SECONDS counts whole seconds); the stop itself takes
# the `ray` command's start-up, a few seconds.
# Why: a worker cut off from the head (its link down, the head's Ray killed, the head machine gone) keeps its raylet
# and what it started with no end: the head's `ray stop` cannot reach it, and Ray's raylet does not exit while its
# link is down (measured on the namespaced hosts: tests/contract/test_hosts_faults.py).
head_leash_line() {
  local loop="last=\${SECONDS}; while sleep 1; do pgrep -x raylet >/dev/null || exit 0; if timeout 2 bash -c 'exec 3<>/dev/tcp/${MASTER_ADDR}/${RAY_GCS_PORT}' 2>/dev/null; then last=\${SECONDS}; elif ((SECONDS - last >= ${RAY_HEAD_LOST_TIMEOUT})); then exec ray stop --force; fi; done"
  printf '{ nohup setsid bash -c %q </dev/null >/dev/null 2>&1 & }' "${loop}"
}

# Stop child process $1: SIGTERM, then SIGKILL if it has not ended within 15 s (a Ray driver's SIGTERM handler shuts
# Ray down, which waits for the node that was lost).
stop_process() {
  local i
  kill "$1" 2>/dev/null || return 0
  for ((i = 0; i < 15; i++)); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  kill -9 "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# A node lost during the job: die's line, with the exit status NODE_LOST_STATUS that tells a node fault from the
# stage's own errors (MAX_RESTARTS restarts only these: tau2_rl_pipeline/cluster/restarts.py, NODE_LOST).
NODE_LOST_STATUS=75
node_lost() { (die "$@") || exit "${NODE_LOST_STATUS}"; }

# The watch's verdict in its log $1 (the line naming the node that was lost), or nothing.
watch_verdict() { grep -m1 -E '^cluster watch: (worker|the head) ' "$1" || true; }

# Run the job ($@) and, on a cluster this script started on several nodes, the watch beside it
# (tau2_rl_pipeline/cluster/watch.py): the first node that leaves the Ray cluster (a link cut, a
# raylet killed, the head's Ray gone) stops the job with one line naming that node, where the job would wait with no
# end. A job that fails by itself ends with one line naming why (tau2_rl_pipeline/cluster/job_failure.py: the storage
# full, the user simulator gone, else its last error); only a cause it cannot name waits a few seconds for the
# watch's word, in case a node's loss is why. With RAY_ADDRESS the cluster's own manager (Slurm, KubeRay) watches its
# nodes; one node has nothing to watch.
watched_job() {
  if is_dry || ((${#WATCH_CMD[@]} == 0)); then
    run "$@"
    return
  fi
  local log="${LOG_DIR}/cluster_watch.log" why watch job rc=0 line i kind="" cause=""
  mkdir -p "${LOG_DIR}"
  why="$(mktemp)"  # local, not on the shared storage: that may be what is full
  show_cmd "$@"
  "${WATCH_CMD[@]}" >"${log}" 2>&1 &
  watch=$!
  "${PYTHON}" "${TAU2_ROOT}/tau2_rl_pipeline/cluster/job_failure.py" --why "${why}" -- "$@" &
  job=$!
  wait -n "${job}" "${watch}" || true
  if kill -0 "${job}" 2>/dev/null; then
    line="$(watch_verdict "${log}")"
    if [[ -n "${line}" ]]; then
      rm -f "${why}"
      stop_process "${job}" 2>/dev/null  # not bash's "Aborted" for it
      node_lost "${line#cluster watch: }; the job is stopped: run the same command again to resume from its last checkpoint"
    fi
    note "warning: the cluster watch ended without a verdict ($(tail -n 1 "${log}")); the job goes on unwatched"
  fi
  wait "${job}" || rc=$?
  IFS=$'\t' read -r kind cause <"${why}" || true
  rm -f "${why}"
  if ((rc != 0)) && [[ "${kind}" != known ]]; then
    for ((i = 0; i < 20; i++)); do kill -0 "${watch}" 2>/dev/null || break; sleep 1; done
  fi
  stop_process "${watch}"
  line="$(watch_verdict "${log}")"
  ((rc == 0)) || [[ -z "${line}" ]] || node_lost "${line#cluster watch: }; the job ended (exit ${rc}): run the same command again to resume from its last checkpoint"
  ((rc == 0)) || die "${cause:-the job failed (exit ${rc})}"
  [[ -z "${line}" ]] || note "warning: ${line#cluster watch: } (the job had ended: exit 0)"
}
