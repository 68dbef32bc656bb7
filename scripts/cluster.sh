# shellcheck shell=bash
# Sourced by common.sh (after the GPU layout): the Ray cluster the slime stages run on, one node or several, on
# slime's conventions (slime's scripts/run-qwen3-235B-A22B.sh and docs/en/get_started/quick_start.md, "Multi-Node
# Training"): a Ray head on this node, `ray start --address` on each worker, slime's job submitted from the head.
#
#   one node (default)   a Ray head here on POLICY_GPUS
#   HOSTFILE=FILE        the head here (MASTER_ADDR) and a worker on each other node the file lists, started over
#                        ssh (RAY_WORKER_LAUNCH=local starts them on this machine: a cluster on loopback addresses)
#   RAY_ADDRESS=URL      a cluster that is already up (Slurm, KubeRay): its jobs API, e.g. http://head:8265;
#                        nothing is started or stopped, NUM_NODES and GPUS_PER_NODE say what it holds
#
# Every node gives Ray the same GPUS_PER_NODE GPUs (POLICY_GPUS, so the layout's user-simulator GPUs stay free on
# each node). slime orders the GPUs of its placement group by node IP, then GPU id, and gives the actor the first
# ones: print_cluster_plan prints that order, so a dry run shows which node runs what.
# Every node must see the checkpoint and data directories at the same path (shared storage): before training the
# head writes a check file there and a Ray task on each node reads it, with what the stage reads: the data as the
# head has it, the HF model and the checkpoint the run loads complete; and each node must have the network interfaces
# the Gloo and NCCL variables name (cluster_check).

HOSTFILE="${HOSTFILE:-}"
RAY_ADDRESS="${RAY_ADDRESS:-}"
RAY_WORKER_LAUNCH="${RAY_WORKER_LAUNCH:-ssh}"
RAY_SSH="${RAY_SSH:-ssh -o BatchMode=yes -o ConnectTimeout=10}"
RAY_JOIN_TIMEOUT="${RAY_JOIN_TIMEOUT:-120}"
RAY_TEMP_DIR="${RAY_TEMP_DIR:-}"
require_choice RAY_WORKER_LAUNCH "${RAY_WORKER_LAUNCH}" ssh local
require_uint RAY_JOIN_TIMEOUT "${RAY_JOIN_TIMEOUT}"
[[ -n "${HOSTFILE}" && -n "${RAY_ADDRESS}" ]] &&
  die "HOSTFILE and RAY_ADDRESS are both set: start a cluster from a hostfile or join one that is up, not both"
[[ -z "${RAY_ADDRESS}" || "${RAY_ADDRESS}" =~ ^https?://[^/]+:[0-9]+/?$ ]] ||
  die "RAY_ADDRESS=${RAY_ADDRESS} must be the cluster's jobs API, e.g. http://10.0.0.1:8265"

is_ipv4() {
  local IFS=. octet
  [[ "$1" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || return 1
  for octet in $1; do ((10#${octet} <= 255)) || return 1; done
}

# The workers of HOSTFILE into WORKERS: one node per line, `ADDRESS [slots=N]` as in slime's mpi hostfile (the
# address first; slots, if given, the node's GPUs), '#' comments, blank lines, spaces and tabs, Windows line ends and
# a byte-order mark ignored, the head's own line (MASTER_ADDR) skipped. A bad line is an error naming it; so is a
# worker line that is the head machine by another of its addresses (a second `ray start` there, on the same GPUs).
WORKERS=()
read_hostfile() {
  local file=$1 line number=0 addr slots extra seen=" " head
  [[ -f "${file}" ]] || die "HOSTFILE not found: ${file}"
  while IFS= read -r line || [[ -n "${line}" ]]; do
    number=$((number + 1))
    line="${line//$'\r'/}"
    ((number > 1)) || line="${line#$'\xef\xbb\xbf'}"
    read -r addr slots extra <<<"${line%%#*}"
    [[ -n "${addr}" ]] || continue
    local where="HOSTFILE ${file} line ${number}"
    is_ipv4 "${addr}" || die "${where}: '${addr}' is not an IPv4 address (one node per line: ADDRESS [slots=N])"
    [[ -z "${extra}" ]] || die "${where}: unexpected '${extra}' after the slots (one node per line: ADDRESS [slots=N])"
    if [[ -n "${slots}" ]]; then
      [[ "${slots}" =~ ^slots=([1-9][0-9]*)$ ]] || die "${where}: '${slots}' is not slots=N"
      ((BASH_REMATCH[1] >= GPUS_PER_NODE)) ||
        die "${where}: ${addr} has slots=${BASH_REMATCH[1]}, fewer than the GPUS_PER_NODE=${GPUS_PER_NODE} Ray GPUs each node gives"
    fi
    [[ "${seen}" != *" ${addr} "* ]] || die "${where}: ${addr} is listed twice"
    seen+="${addr} "
    [[ "${addr}" != "${MASTER_ADDR}" ]] || continue
    head="$(head_machine "${addr}")"
    [[ -z "${head}" ]] ||
      die "${where}: ${addr} is the head machine (${head}): list each other machine once; the head's own line is MASTER_ADDR=${MASTER_ADDR}"
    WORKERS+=("${addr}")
  done <"${file}"
}

# Why worker address $1 is the head machine itself, or nothing: the head's SLIME_HOST_IP, a loopback address while
# the head is not on loopback, or (a real run over ssh) an address of this machine as `hostname -I` lists them.
head_machine() {
  if [[ "$1" == "${SLIME_HOST_IP:-}" ]]; then
    echo "its SLIME_HOST_IP"
  elif [[ "$1" == 127.* && "${MASTER_ADDR}" != 127.* ]]; then
    echo "a loopback address is this machine"
  elif ! is_dry && [[ "${RAY_WORKER_LAUNCH}" == ssh && " $(hostname -I 2>/dev/null) " == *" $1 "* ]]; then
    echo "an address of this machine: hostname -I"
  fi
}

# Are all the nodes loopback addresses of this one machine (a cluster on loopback: several raylets here)?
cluster_on_loopback() {
  local addr
  for addr in "${MASTER_ADDR:-}" "${WORKERS[@]}"; do [[ "${addr}" == 127.* ]] || return 1; done
}

# ---- the cluster's size ---------------------------------------------------------------------------------------
GPUS_PER_NODE="${GPUS_PER_NODE:-${NUM_POLICY_GPUS}}"
require_uint GPUS_PER_NODE "${GPUS_PER_NODE}"
if [[ -z "${RAY_ADDRESS}" ]] && ((GPUS_PER_NODE != NUM_POLICY_GPUS)); then
  die "GPUS_PER_NODE=${GPUS_PER_NODE} but each node gives Ray its ${NUM_POLICY_GPUS} policy GPUs (POLICY_GPUS=${POLICY_GPUS}); set POLICY_GPUS or TAU2_GPU_LAYOUT instead"
fi
if [[ -n "${HOSTFILE}" ]]; then
  [[ -n "${MASTER_ADDR:-}" ]] || die "MASTER_ADDR is not set: with HOSTFILE it is this node's (the Ray head's) address"
  HOSTFILE="$(abs_path "${HOSTFILE}")"
  read_hostfile "${HOSTFILE}"
  ((${#WORKERS[@]} > 0)) || die "HOSTFILE ${HOSTFILE} lists no worker besides the head (MASTER_ADDR=${MASTER_ADDR})"
  [[ -z "${NUM_NODES:-}" || "${NUM_NODES}" == $((${#WORKERS[@]} + 1)) ]] ||
    die "NUM_NODES=${NUM_NODES} but HOSTFILE ${HOSTFILE} holds the head and ${#WORKERS[@]} worker(s)"
  NUM_NODES=$((${#WORKERS[@]} + 1))
fi
NUM_NODES="${NUM_NODES:-1}"
require_uint NUM_NODES "${NUM_NODES}"
if [[ -z "${HOSTFILE}" && -z "${RAY_ADDRESS}" ]] && ((NUM_NODES > 1)); then
  die "NUM_NODES=${NUM_NODES}: list the workers in HOSTFILE (the scripts start them) or join a running cluster with RAY_ADDRESS"
fi
export NUM_NODES GPUS_PER_NODE

# ---- interfaces: what slime's users set where a node has several addresses (Docker, Slurm) ---------------------
#   MASTER_ADDR         the head's address (Ray GCS, workers join it)
#   SLIME_HOST_IP       the address slime announces for this node's servers and process groups; per node: this
#                       node's here, each worker's hostfile address on that worker (never one value for all)
#   GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME   the network interface of Gloo's and NCCL's traffic on every node
if ((NUM_NODES > 1)); then
  if [[ -n "${RAY_ADDRESS}" ]]; then
    _host="${RAY_ADDRESS#*://}"
    export MASTER_ADDR="${MASTER_ADDR:-${_host%%:*}}"
    _required=(GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME)
  else
    _required=(SLIME_HOST_IP GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME)
  fi
  for _name in "${_required[@]}"; do
    [[ -n "${!_name:-}" ]] || die "${_name} is not set: a ${NUM_NODES}-node run needs it (see docs/multi-node.md)"
  done
  is_ipv4 "${MASTER_ADDR}" || [[ -n "${RAY_ADDRESS}" ]] || die "MASTER_ADDR=${MASTER_ADDR} must be the head's IPv4 address"
  [[ -z "${SLIME_HOST_IP:-}" ]] || is_ipv4 "${SLIME_HOST_IP}" || die "SLIME_HOST_IP=${SLIME_HOST_IP} must be an IPv4 address"
  unset _host _required _name
fi
# The interface variables that are set, as NAME=VALUE: each must name an interface of every node. The rules (Gloo's
# exact names; NCCL's prefixes, `^` and `=`) are tau2_rl_pipeline/cluster/net.py's alone: here it
# judges this node before Ray starts (not when joining RAY_ADDRESS: the script may run off the cluster), and the
# cluster check (cluster_check --interface) every node once the cluster is up.
INTERFACE_SETTINGS=()
for _name in GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME; do
  [[ -z "${!_name:-}" ]] || { export "${_name?}"; INTERFACE_SETTINGS+=("${_name}=${!_name}"); }
done
if ((${#INTERFACE_SETTINGS[@]} > 0)) && [[ -z "${RAY_ADDRESS}" ]]; then  # this machine's python3, stdlib only
  _out="$(PYTHONPATH="${TAU2_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m tau2_rl_pipeline.cluster.net \
    "${INTERFACE_SETTINGS[@]}" 2>&1)" || problem "$(head -n 1 <<<"${_out}")"
fi
unset _name _out
[[ -z "${SLIME_HOST_IP:-}" ]] || export SLIME_HOST_IP
# Traffic to the head and the workers must not go through a proxy either.
for _addr in "${MASTER_ADDR:-}" "${WORKERS[@]}"; do
  [[ -z "${_addr}" ]] || no_proxy="${no_proxy:+${no_proxy},}${_addr}"
done
export no_proxy NO_PROXY="${no_proxy:-}"
unset _addr

# ---- where slime places the actor and the rollout engines ------------------------------------------------------
# cluster_placement MODE [ROLLOUT_GPUS]: MODE train (SFT, RFT: training only), colocate (synchronous GRPO: every
# GPU trains and rolls out), split (asynchronous GRPO: ROLLOUT_GPUS serve SGLang, the rest train). Sets
# ACTOR_NUM_NODES, ACTOR_GPUS_PER_NODE (the actor's world size is their product), ROLLOUT_NUM_GPUS, PLACEMENT_MODE.
cluster_placement() {
  local mode=$1 rollout=${2:-0} total=$((NUM_NODES * GPUS_PER_NODE)) actor
  case "${mode}" in
    train) actor=${total} rollout=0 ;;
    colocate) actor=${total} rollout=${total} ;;
    split) actor=$((total - rollout)) ;;
    *) die "cluster_placement: unknown mode ${mode}" ;;
  esac
  if ((actor <= GPUS_PER_NODE)); then
    ACTOR_NUM_NODES=1 ACTOR_GPUS_PER_NODE=${actor}
  elif ((actor % GPUS_PER_NODE == 0)); then
    ACTOR_NUM_NODES=$((actor / GPUS_PER_NODE)) ACTOR_GPUS_PER_NODE=${GPUS_PER_NODE}
  else
    die "${actor} training GPUs on nodes of ${GPUS_PER_NODE}: they must fill whole nodes or fit in one (change GRPO_ASYNC_ROLLOUT_GPUS)"
  fi
  ROLLOUT_NUM_GPUS=${rollout} PLACEMENT_MODE=${mode}
  export ACTOR_NUM_NODES ACTOR_GPUS_PER_NODE ROLLOUT_NUM_GPUS
}

# slime's placement flags for the layout cluster_placement set, one per line. --num-gpus-per-node on every stage:
# slime's default is 8, and its rollout-engine address allocation (slime/ray/rollout.py,
# _allocate_rollout_engine_addr_and_ports_normal) counts that many GPUs as one node, so with fewer Ray GPUs per node
# the engines of the next node(s) would be given this node's host, ports and dist_init_addr.
placement_flags() {
  printf '%s\n' --actor-num-nodes "${ACTOR_NUM_NODES}" --actor-num-gpus-per-node "${ACTOR_GPUS_PER_NODE}" \
    --num-gpus-per-node "${GPUS_PER_NODE}"
  case "${PLACEMENT_MODE}" in
    colocate) printf '%s\n' --colocate ;;  # slime makes the rollout's GPUs the actor's
    split) printf '%s\n' --rollout-num-gpus "${ROLLOUT_NUM_GPUS}" ;;
  esac
}

# "a-b" (or "a") of the integer range [lo, hi), or empty.
span() { if (($2 > $1 + 1)); then printf '%s-%s' "$1" "$(($2 - 1))"; elif (($2 == $1 + 1)); then printf '%s' "$1"; fi; }

# The nodes in the order slime sorts its placement group's GPUs (node IP, then GPU id): the actor takes the first
# ACTOR_NUM_NODES x ACTOR_GPUS_PER_NODE, the rollout the next ROLLOUT_NUM_GPUS (the same ones when colocated), each
# SGLang engine ROLLOUT_GPUS_PER_ENGINE consecutive ones. One line per node, to stderr, for a dry run to show.
print_cluster_plan() {
  local per_engine=${ROLLOUT_GPUS_PER_ENGINE:-1} actor=$((ACTOR_NUM_NODES * ACTOR_GPUS_PER_NODE))
  local rollout_lo=${actor} i lo hi what a first last nodes=()
  [[ "${PLACEMENT_MODE}" == colocate ]] && rollout_lo=0
  local rollout_hi=$((rollout_lo + ROLLOUT_NUM_GPUS))
  if [[ -n "${RAY_ADDRESS}" ]]; then
    note "cluster plan: join the Ray cluster at ${RAY_ADDRESS}: ${NUM_NODES} node(s) x ${GPUS_PER_NODE} GPUs, in node-IP order:"
    for ((i = 0; i < NUM_NODES; i++)); do nodes+=("node-${i}"); done
  else
    note "cluster plan: ${NUM_NODES} node(s) x ${GPUS_PER_NODE} Ray GPUs (POLICY_GPUS=${POLICY_GPUS} on each), head ${MASTER_ADDR}:${RAY_GCS_PORT}, in node-IP order:"
    mapfile -t nodes < <(printf '%s\n' "${MASTER_ADDR}" "${WORKERS[@]}" | sort -t. -k1,1n -k2,2n -k3,3n -k4,4n)
  fi
  for ((i = 0; i < NUM_NODES; i++)); do
    lo=$((i * GPUS_PER_NODE)) hi=$(((i + 1) * GPUS_PER_NODE)) what=""
    a="$(span $((lo > actor ? actor : lo)) $((hi < actor ? hi : actor)))"
    [[ -n "${a}" ]] && what+="actor ranks ${a}"
    if ((ROLLOUT_NUM_GPUS > 0 && hi > rollout_lo && lo < rollout_hi)); then
      first=$((lo > rollout_lo ? lo : rollout_lo)) last=$((hi < rollout_hi ? hi : rollout_hi))
      first=$(((first - rollout_lo) / per_engine)) last=$(((last - rollout_lo + per_engine - 1) / per_engine))
      what+="${what:+; }SGLang engines $(span "${first}" "${last}") (${per_engine} GPU(s) each)"
    fi
    local role="worker"
    [[ -n "${RAY_ADDRESS}" ]] && role="node"
    [[ "${nodes[i]}" == "${MASTER_ADDR}" ]] && role="head"
    note "  ${nodes[i]} (${role}): ${what:-idle}"
  done
  if ((ROLLOUT_NUM_GPUS > 0)); then
    note "  user simulator: ${TAU2_USER_API_BASE:-the provider endpoint} (scripts/start_user_sim.sh on USER_SIM_GPUS=${USER_SIM_GPUS}; several behind scripts/start_router.sh)"
  fi
}

# ---- starting, joining and stopping the cluster ----------------------------------------------------------------
RAY_STARTED=0
WORKERS_STARTED=()

# The command that runs shell command line $2 on worker $1, into WORKER_CMD: over RAY_SSH, or here with
# RAY_WORKER_LAUNCH=local.
worker_cmd() {
  if [[ "${RAY_WORKER_LAUNCH}" == local ]]; then
    WORKER_CMD=(bash -c "$2")
  else
    read -r -a WORKER_CMD <<<"${RAY_SSH}"
    WORKER_CMD+=("$1" "$2")
  fi
}

# The command line that joins worker $1 to the head: the same Ray GPUs as the head's, this node's own SLIME_HOST_IP,
# the interface variables, run from slime's root as on the head.
worker_join_line() {
  local ip=$1 name
  local -a cmd=(env CUDA_VISIBLE_DEVICES="${POLICY_GPUS}" SLIME_HOST_IP="${ip}")
  for name in GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME; do
    [[ -z "${!name:-}" ]] || cmd+=("${name}=${!name}")
  done
  cmd+=(ray start --address "${MASTER_ADDR}:${RAY_GCS_PORT}" --node-ip-address "${ip}" --num-gpus "${GPUS_PER_NODE}"
    --disable-usage-stats)
  [[ -z "${RAY_TEMP_DIR}" ]] || cmd+=(--temp-dir "${RAY_TEMP_DIR}/node-${ip}")
  local quoted
  quoted="$(printf '%q ' "${cmd[@]}")"
  printf 'cd %q && %s' "${SLIME_DIR}" "${quoted% }"
  [[ "${RAY_WORKER_LAUNCH}" != ssh ]] || printf ' && %s' "$(head_leash_line)"  # cluster_watch.sh
}

# The head runs here: MASTER_ADDR and SLIME_HOST_IP must be addresses of this node (a 127.x address always is), as
# `hostname -I` lists them (where it cannot, nothing is checked). A dry run skips this (it may plan from elsewhere).
require_head_here() {
  local name own
  if is_dry || ! own=" $(hostname -I 2>/dev/null) " || [[ "${own}" == "  " ]]; then return 0; fi
  for name in MASTER_ADDR SLIME_HOST_IP; do
    [[ -z "${!name:-}" || "${!name}" == 127.* || "${own}" == *" ${!name} "* ]] ||
      die "${name}=${!name} is not an address of this node (it has:${own% }): run the stage on the head, MASTER_ADDR"
  done
}

# Each worker answers over ssh before anything starts (a dry run and RAY_WORKER_LAUNCH=local skip this).
require_workers_reachable() {
  local ip out ssh
  if is_dry || [[ "${RAY_WORKER_LAUNCH}" == local ]]; then return 0; fi
  read -r -a ssh <<<"${RAY_SSH}"
  for ip in "${WORKERS[@]}"; do
    out="$("${ssh[@]}" "${ip}" true 2>&1)" ||
      die "worker ${ip} (HOSTFILE) is not reachable over ssh (${RAY_SSH}): $(tail -n 1 <<<"${out}")"
  done
}

# `ray start --address` on every worker at once (as slime's script does). Each worker is recorded before its start
# (so the EXIT trap stops every worker tried, whatever failed), and every start is waited for before failing (a
# worker still starting when another fails would otherwise start after its `ray stop`); the first worker that
# failed is named with the last line it printed.
ray_start_workers() {
  local ip i failed="" logs=() pids=()
  for ip in "${WORKERS[@]}"; do
    worker_cmd "${ip}" "$(worker_join_line "${ip}")"
    show_cmd "${WORKER_CMD[@]}"
    WORKERS_STARTED+=("${ip}")
    is_dry && continue
    logs+=("$(mktemp)")
    "${WORKER_CMD[@]}" >"${logs[-1]}" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[i]}" || [[ -n "${failed}" ]] ||
      failed="worker ${WORKERS[i]} could not join the Ray cluster at ${MASTER_ADDR}:${RAY_GCS_PORT}: $(tail -n 1 "${logs[i]}")"
  done
  rm -f "${logs[@]}"
  [[ -z "${failed}" ]] || die "${failed}"
}

# Stop what ray_start_head and ray_start_workers started or tried to start: each worker over ssh (RAY_WORKER_LAUNCH=
# local: the head's `ray stop` stops every raylet here), then the head. Once: a second call (the EXIT trap after an
# explicit call) does nothing; a worker whose stop fails is named and the others are still stopped.
ray_stop_cluster() {
  local ip
  [[ "${RAY_STARTED}" == 1 ]] || return 0
  RAY_STARTED=0
  if [[ "${RAY_WORKER_LAUNCH}" == ssh ]]; then
    for ip in "${WORKERS_STARTED[@]}"; do
      worker_cmd "${ip}" "ray stop"
      run "${WORKER_CMD[@]}" ||
        note "warning: ray stop on worker ${ip} failed: its leash stops its Ray once the head has been silent for RAY_HEAD_LOST_TIMEOUT=${RAY_HEAD_LOST_TIMEOUT} s; if it answers ssh again, run ray stop there"
    done
  fi
  WORKERS_STARTED=()
  run ray stop || note "warning: ray stop on the head failed"
}

# Before training: every node joined with its GPUs, has the interfaces GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME name
# (INTERFACE_SETTINGS), and sees the stage's paths where the head sees them (one Ray task pinned to each node reads
# them). On a cluster started here it runs as a Ray driver on the head; on one joined by RAY_ADDRESS as a Ray job,
# from wherever the script runs.
# cluster_check DIR... -- [--data FILE] [--checkpoint DIR] [--hf-model DIR]...: each DIR (written: checkpoints) gets
# a check file with a fresh token that every node must read back; what follows `--` names what the stage reads, each
# to be on every node as the head has it: the data file identical (size, sha256), the Megatron checkpoint(s) the run
# loads (loaded_checkpoint) and the HF model complete (tau2_rl_pipeline/cluster/inputs.py).
cluster_check() {
  local path token log answer dirs=() cmd check setting
  ((NUM_NODES > 1)) || return 0
  token="$(date +%s%N)-$$-${RANDOM}"
  check=(-m tau2_rl_pipeline.cluster.check --nodes "${NUM_NODES}" --gpus-per-node "${GPUS_PER_NODE}"
    --timeout "${RAY_JOIN_TIMEOUT}")
  for setting in "${INTERFACE_SETTINGS[@]}"; do check+=(--interface "${setting}"); done
  while (($# > 0)) && [[ "$1" != -- ]]; do
    dirs+=("$1")
    check+=(--token "$1/.tau2-shared-check=${token}")
    shift
  done
  (($# == 0)) || shift
  check+=("$@")
  if [[ -n "${RAY_ADDRESS}" ]]; then
    cmd=(ray job submit --address="${RAY_JOBS_API}" --runtime-env-json="$(ray_runtime_env_json)" -- "${PYTHON}"
      "${check[@]}")
  else
    cmd=(env PYTHONPATH="${TAU2_ROOT}" "${PYTHON}" "${check[@]}" --address "${MASTER_ADDR}:${RAY_GCS_PORT}"
      --expect "$(IFS=,; printf '%s' "${MASTER_ADDR},${WORKERS[*]}")")
  fi
  show_cmd "${cmd[@]}"
  is_dry && return 0
  for path in "${dirs[@]}"; do
    if ! { mkdir -p "${path}" && printf '%s' "${token}" >"${path}/.tau2-shared-check"; }; then
      die "cannot write the shared-storage check file in ${path}"
    fi
  done
  log="${LOG_DIR}/cluster_check.log"
  mkdir -p "${LOG_DIR}"
  if ! "${cmd[@]}" >"${log}" 2>&1; then
    answer="$(grep -m1 -o 'cluster check failed: .*' "${log}" || true)"
    die "${answer:-cluster check did not run: $(tail -n 1 "${log}")} (log: ${log})"
  fi
  for path in "${dirs[@]}"; do rm -f "${path}/.tau2-shared-check"; done
  note "$(grep -m1 -o 'cluster check: .*' "${log}" || printf 'cluster check passed')"
}

# The cluster for a stage: print the plan; start it (head, then the workers) or join RAY_ADDRESS; check it. $@: the
# arguments of cluster_check (DIR... -- --data FILE --checkpoint DIR --hf-model DIR). Leaves the script in slime's root, where the job runs from.
ray_cluster_up() {
  print_cluster_plan
  enter_dir "${SLIME_DIR}"
  if [[ -n "${RAY_ADDRESS}" ]]; then
    RAY_JOBS_API="${RAY_ADDRESS%/}"
  else
    RAY_JOBS_API="http://127.0.0.1:${RAY_DASHBOARD_PORT}"
    ((NUM_NODES == 1)) || require_head_here
    require_workers_reachable
    ray_start_head
    ray_start_workers
  fi
  cluster_check "$@"
}
