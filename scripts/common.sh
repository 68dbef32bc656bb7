# shellcheck shell=bash source-path=SCRIPTDIR
# Sourced by every stage script: paths, the GPU layout, the dry run, and input checks that fail with one line.
# It only defines things. Every default is `${VAR:-default}`: export the variable to override it.
#
# Dry run (DRY_RUN=1) prints each command as `+ <command>`, shell-quoted with printf %q, instead of running it.
#   still checked: numbers, choices, the GPU layout, option consistency (a bad value is still an error);
#   only warned about: input paths that do not exist yet (earlier stages have not run), ports in use;
#   skipped, with a note: GPU count (nvidia-smi), server reachability (curl), tools on PATH.
# Notes and warnings go to stderr; stdout carries only the `+ ` command lines and pipeline stage headers.

# ---- helpers ------------------------------------------------------------------------------------------------
# A failure inside $(...) stops the script too (bash does not pass errexit into command substitutions by default).
shopt -s inherit_errexit
# A stage script that runs another (train_rft.sh runs train_sft.sh) exports STAGE_SCRIPT, so messages name it.
PROG="${STAGE_SCRIPT:-$(basename "$0")}"
die() { printf '%s: error: %s\n' "${PROG}" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "${PROG}" "$*" >&2; }

DRY_RUN="${DRY_RUN:-0}"
case "${DRY_RUN}" in 0 | 1) ;; *) die "DRY_RUN=${DRY_RUN} must be 0 or 1" ;; esac
export DRY_RUN
is_dry() { [[ "${DRY_RUN}" == 1 ]]; }

# Names that hold credentials (WANDB_API_KEY, HF_TOKEN, OPENAI_API_KEY, ...): their values never reach a command
# line, a printed command or the Ray runtime env. Not MAX_TOKENS_PER_GPU: the word must end the name.
is_secret_name() { [[ "$1" =~ (^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$ ]]; }

# Values of the secret-named variables in the environment (4+ characters), one per line.
secret_values() {
  local name value
  while IFS= read -r name; do
    is_secret_name "${name}" || continue
    value="${!name}"
    ((${#value} >= 4)) && printf '%s\n' "${value}"
  done < <(compgen -e)
  return 0
}

# A command as one line, each argument quoted with printf %q and any secret value in it replaced by ***.
# Commands never carry secrets (they travel in the environment); this guards the printout anyway.
quote_cmd() {
  local arg value quoted=() secrets
  mapfile -t secrets < <(secret_values)
  for arg in "$@"; do
    for value in "${secrets[@]}"; do arg="${arg//"${value}"/***}"; done
    quoted+=("$(printf '%q' "${arg}")")
  done
  printf '%s' "${quoted[*]}"
}
show_cmd() { printf '+ %s\n' "$(quote_cmd "$@")"; }

# Print the exact command; run it unless this is a dry run.
run() {
  show_cmd "$@"
  is_dry || "$@"
}

enter_dir() {
  show_cmd cd "$1"
  is_dry || cd "$1" || die "cannot enter $1"
}

require_uint() { [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1=$2 must be a positive integer"; }
require_number() { [[ "$2" =~ ^[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]] || die "$1=$2 must be a non-negative number"; }
# A true/false setting spelled as tau2_rl_pipeline.config reads it (1/true/yes/on, 0/false/no/off): prints 1 or 0.
bool_setting() {
  case "${2,,}" in
    1 | true | yes | on) printf 1 ;;
    0 | false | no | off) printf 0 ;;
    *) die "$1=$2 must be true or false (1/0, yes/no, on/off)" ;;
  esac
}
require_choice() {
  local name=$1 value=$2 choice
  shift 2
  for choice in "$@"; do [[ "${value}" == "${choice}" ]] && return 0; done
  die "${name}=${value} is not one of: $*"
}

# A problem of the machine's current state: an error in a real run, a warning in a dry run.
problem() {
  if is_dry; then note "warning: $1 (the dry run goes on)"; else die "$1"; fi
}
require_file() { [[ -f "$1" ]] || problem "$2 not found: $1"; }
require_dir() { [[ -d "$1" ]] || problem "$2 not found: $1"; }

require_tool() {
  if is_dry; then return 0; fi
  command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH ($2)"
}

# GPU ids are physical indices as `nvidia-smi -L` lists them; the scripts set CUDA_VISIBLE_DEVICES from them.
gpu_count() {
  local list
  IFS=, read -r -a list <<<"$1"
  printf '%s' "${#list[@]}"
}
require_gpus() {
  local ids=$1 what=$2 id max=0 visible gpu_ids
  if is_dry; then note "dry run: not checking that GPUs ${ids} (${what}) exist"; return 0; fi
  command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: ${what} needs GPUs ${ids}"
  visible="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  IFS=, read -r -a gpu_ids <<<"${ids}"
  for id in "${gpu_ids[@]}"; do ((id > max)) && max=${id}; done
  ((max < visible)) || die "${what} needs GPUs ${ids} but nvidia-smi -L lists ${visible} GPU(s)"
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
require_port_free() { if port_in_use "$1"; then problem "port $1 ($2) is already in use on 127.0.0.1"; fi; }

# A model server this repository starts for a client of its own (user simulator, judge): the client's api base
# (${!1}) must be a local http://host:port/v1 and its model (${!2}) openai/<served name>, so the server is always where
# the client looks for it. Sets SERVED_PORT and SERVED_NAME. $3: an example api base, $4: what is served.
served_endpoint() {
  local base_var=$1 model_var=$2 example=$3 what=$4
  local base="${!base_var:-}" model="${!model_var:-}"
  [[ -n "${base}" ]] || die "${base_var} is empty: set ${base_var}=${example} and ${model_var}=openai/<served name> to serve a local ${what} here (empty means a provider's ${what}: nothing to serve)"
  [[ "${base}" != *,* ]] ||
    die "${base_var}=${base} lists several servers: start each one with ${base_var} set to its own URL"
  [[ "${base}" =~ ^http://[^/:]+:([0-9]+)/v1/?$ ]] || die "${base_var}=${base} must look like ${example}"
  # shellcheck disable=SC2034  # read by the calling script
  SERVED_PORT="${BASH_REMATCH[1]}"
  [[ "${model}" == openai/?* ]] ||
    die "${model_var}=${model} must be openai/<served name> for the ${what} client to use this server"
  # shellcheck disable=SC2034  # read by the calling script
  SERVED_NAME="${model#openai/}"
}

# An SGLang server in the foreground on GPUS: launch_sglang GPUS MODEL_PATH HOST PORT TP DP MEM_FRACTION [flags...]
# (the policy, user-simulator and judge servers differ only in these and in their extra flags).
launch_sglang() {
  local gpus=$1 model=$2 host=$3 port=$4 tp=$5 dp=$6 mem=$7
  shift 7
  run env CUDA_VISIBLE_DEVICES="${gpus}" "${PYTHON}" -m sglang.launch_server --model-path "${model}" \
    --host "${host}" --port "${port}" --tp-size "${tp}" --dp-size "${dp}" --mem-fraction-static "${mem}" "$@"
}

server_up() { curl -fsS --max-time 5 -o /dev/null "$1" 2>/dev/null; }
require_server() {
  if is_dry; then note "dry run: not checking that $2 answers at $1"; return 0; fi
  require_tool curl "to reach $2"
  server_up "$1" || die "$2 not reachable at $1"
}

# A path as given, made absolute from the directory the script was started in: the scripts change into slime's or
# this repository's directory before running a command, where a relative path would point elsewhere.
abs_path() {
  if [[ -z "$1" || "$1" == /* ]]; then printf '%s' "$1"; else printf '%s/%s' "${START_DIR}" "$1"; fi
}
START_DIR="${PWD}"

# ---- paths ----------------------------------------------------------------------------------------------------
TAU2_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS_DIR="${TAU2_ROOT}/scripts"
export SLIME_DIR="${SLIME_DIR:-/root/slime}"            # slime's root: train.py, train_async.py, tools/
export MEGATRON_DIR="${MEGATRON_DIR:-/root/Megatron-LM}"
_PYTHON_GIVEN="${PYTHON:-}"
export PYTHON="${PYTHON:-python3}"
# The interpreter of this package's own commands (the GRPO gate): PYTHON when set, else the venv scripts/setup.sh
# makes (TAU2_VENV, default .venv) when it exists, else python3. PYTHON itself stays the container's (slime's).
_package_venv="${TAU2_VENV:-${TAU2_ROOT}/.venv}"
if [[ -n "${_PYTHON_GIVEN}" ]]; then
  PACKAGE_PYTHON="${_PYTHON_GIVEN}"
elif [[ -x "${_package_venv}/bin/python" ]]; then
  PACKAGE_PYTHON="${_package_venv}/bin/python"
else
  PACKAGE_PYTHON=python3
fi
export PACKAGE_PYTHON
export TAU2_OUT_DIR="${TAU2_OUT_DIR:-${TAU2_ROOT}/outputs}"
export MODEL_DIR="${MODEL_DIR:-${TAU2_OUT_DIR}/models}"
# Not TAU2_DATA_DIR: tau2-bench reads that variable to find its own domain data.
export DATA_DIR="${DATA_DIR:-${TAU2_OUT_DIR}/data}"
export CKPT_DIR="${CKPT_DIR:-${TAU2_OUT_DIR}/checkpoints}"
export LOG_DIR="${LOG_DIR:-${TAU2_OUT_DIR}/logs}"

# What each stage reads and writes (pipeline.sh and the stage scripts agree through these). The base model's
# (HF_MODEL_ID, BASE_HF_DIR, BASE_TORCH_DIST_DIR, MODEL_ARGS_SCRIPT) follow MODEL: see "model preset" below.
export DOMAINS="${DOMAINS:-airline,retail,telecom}"
export TASKS_DIR="${TASKS_DIR:-${DATA_DIR}/tasks}"
export SEED_DATA="${SEED_DATA:-${DATA_DIR}/sft_seed.jsonl}"
export RFT_DATA="${RFT_DATA:-${DATA_DIR}/sft_seed_plus_rft.jsonl}"
# The RFT sampling's episode file (the evaluator's, beside RFT_DATA) and the GRPO task index filtered from it.
export RFT_EPISODES="${RFT_EPISODES:-${RFT_DATA}.eval.json.episodes.jsonl}"
export GRPO_TASKS="${GRPO_TASKS:-${TASKS_DIR}/tau2_train_grpo_tasks.jsonl}"
export SFT_CKPT_DIR="${SFT_CKPT_DIR:-${CKPT_DIR}/sft}"
export SFT_HF_DIR="${SFT_HF_DIR:-${MODEL_DIR}/sft_hf}"
export RFT_CKPT_DIR="${RFT_CKPT_DIR:-${CKPT_DIR}/rft}"
export GRPO_CKPT_DIR="${GRPO_CKPT_DIR:-${CKPT_DIR}/grpo}"
export GRPO_HF_DIR="${GRPO_HF_DIR:-${MODEL_DIR}/grpo_hf}"
for _path_var in SLIME_DIR MEGATRON_DIR TAU2_OUT_DIR MODEL_DIR DATA_DIR CKPT_DIR LOG_DIR TASKS_DIR SEED_DATA \
  RFT_DATA SFT_CKPT_DIR SFT_HF_DIR RFT_CKPT_DIR GRPO_CKPT_DIR GRPO_HF_DIR; do
  export "${_path_var}=$(abs_path "${!_path_var}")"
done
# One loss-mask type for SFT and GRPO (the original used qwen3 for SFT and slime's default qwen for GRPO).
export LOSS_MASK_TYPE="${LOSS_MASK_TYPE:-qwen3}"
require_choice LOSS_MASK_TYPE "${LOSS_MASK_TYPE}" qwen qwen3 qwen3_5 distill_qwen

# ---- user simulator and policy server -------------------------------------------------------------------------
# At scale the user simulator is Qwen3-4B-Instruct-2507 on a local SGLang server reached through litellm.
# An explicitly empty TAU2_USER_API_BASE means the provider's default endpoint (an API model): nothing local.
export TAU2_USER_MODEL="${TAU2_USER_MODEL:-openai/Qwen/Qwen3-4B-Instruct-2507}"
export TAU2_USER_API_BASE="${TAU2_USER_API_BASE-http://127.0.0.1:30001/v1}"
# TAU2_USER_TEMPERATURE unset: Tau2Config's default (config.DEFAULT_USER_TEMPERATURE, tau2's 0), as for
# tau2-rl-qualify-user, so that the GRPO gate compares a qualification and a run made with the same defaults.
if [[ -n "${TAU2_USER_TEMPERATURE:-}" ]]; then require_number TAU2_USER_TEMPERATURE "${TAU2_USER_TEMPERATURE}"; fi
export POLICY_PORT="${POLICY_PORT:-30000}"
require_uint POLICY_PORT "${POLICY_PORT}"

# ---- GPU layout: which GPUs train/serve the policy and which serve the user simulator ------------------------
#   8: policy 0-3 (slime training + colocated SGLang engines)  | user simulator 4-7 (TP1 x DP4)   [default]
#   4: policy 0-1                                                | user simulator 2-3 (TP1 x DP2)
#   2: policy 0                                                  | user simulator 1   (TP1)
# POLICY_GPUS, USER_SIM_GPUS and USER_SIM_TP override single values of the chosen layout; how the policy GPUs are
# parallelised (TRAIN_TP, ...) follows the model preset below.
export TAU2_GPU_LAYOUT="${TAU2_GPU_LAYOUT:-8}"
case "${TAU2_GPU_LAYOUT}" in
  8) _policy_gpus=0,1,2,3 _user_sim_gpus=4,5,6,7 ;;
  4) _policy_gpus=0,1 _user_sim_gpus=2,3 ;;
  2) _policy_gpus=0 _user_sim_gpus=1 ;;
  *) die "TAU2_GPU_LAYOUT=${TAU2_GPU_LAYOUT} is not one of: 8, 4, 2" ;;
esac
export POLICY_GPUS="${POLICY_GPUS:-${_policy_gpus}}"
export USER_SIM_GPUS="${USER_SIM_GPUS:-${_user_sim_gpus}}"
export USER_SIM_TP="${USER_SIM_TP:-1}"
for _name in POLICY_GPUS USER_SIM_GPUS; do
  [[ "${!_name}" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "${_name}=${!_name} must be comma-separated GPU ids, e.g. 0,1"
done
require_uint USER_SIM_TP "${USER_SIM_TP}"
for _id in ${POLICY_GPUS//,/ }; do
  [[ ",${USER_SIM_GPUS}," == *",${_id},"* ]] && die "GPU ${_id} is in both POLICY_GPUS=${POLICY_GPUS} and USER_SIM_GPUS=${USER_SIM_GPUS}"
done
NUM_POLICY_GPUS="$(gpu_count "${POLICY_GPUS}")"
NUM_USER_SIM_GPUS="$(gpu_count "${USER_SIM_GPUS}")"
export NUM_POLICY_GPUS NUM_USER_SIM_GPUS
((NUM_USER_SIM_GPUS % USER_SIM_TP == 0)) || die "USER_SIM_TP=${USER_SIM_TP} does not divide the ${NUM_USER_SIM_GPUS} user-simulator GPUs (${USER_SIM_GPUS})"
unset _name _id _policy_gpus _user_sim_gpus
# The nodes: one, a hostfile's, or a running cluster's (NUM_NODES, GPUS_PER_NODE, HOSTFILE, RAY_ADDRESS, interfaces).
# shellcheck source=cluster.sh
source "${SCRIPTS_DIR}/cluster.sh"
# shellcheck source=cluster_watch.sh
source "${SCRIPTS_DIR}/cluster_watch.sh"

# Loopback traffic (Ray job API, SGLang) must not go through a proxy.
export no_proxy="127.0.0.1,localhost${no_proxy:+,${no_proxy}}"
export NO_PROXY="${no_proxy}"

# ---- model preset and parallel layout (docs/models-and-sizing.md) ----------------------------------------------
# MODEL picks a preset of tau2_rl_pipeline/scale/presets.py (qwen3-1.7b, qwen3-4b-instruct-2507 [default],
# qwen3-8b, qwen3-14b, qwen3-30b-a3b): the model, its Megatron flags (scripts/models/), and for the training world
# (nodes x policy GPUs a node) the parallel layout (TRAIN_TP, TRAIN_PP, TRAIN_CP, TRAIN_EP, CPU_ADAM), the max
# tokens per GPU, SGLang's memory fraction and GPUs per engine (ROLLOUT_GPUS_PER_ENGINE), and the learning rates and
# batch sizes that depend on size. RECIPE=qwen3-8b-tau2 adds the published Qwen3-8B protocol's GRPO settings. Each
# is a default: a variable set in the environment wins. size_stage (below) prints the sizing sheet and refuses,
# in one line, a layout that cannot fit.
export MODEL="${MODEL:-}" RECIPE="${RECIPE:-}"
SIZING_FORCE="$(bool_setting SIZING_FORCE "${SIZING_FORCE:-0}")"
PRESET_USER_SET=""  # names the environment set before the preset filled in the rest: never overridden
PRESET_APPLIED=0
# This machine's python3 (PYTHON is the Ray job's, perhaps only in the container): scale/ is stdlib only.
scale_cli() { PYTHONPATH="${TAU2_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m tau2_rl_pipeline.scale.cli "$@"; }
# The TAU2_* settings as every Ray worker will read them (Tau2Config): a bad value stops here, named by its variable;
# an unknown name gets a warning with the closest known one. Once per run (a stage script that runs another does
# not say it again).
if [[ -z "${STAGE_SETTINGS_CHECKED:-}" ]]; then
  scale_cli settings --prog "${PROG}" || exit 1
  export STAGE_SETTINGS_CHECKED=1
fi
# apply_preset WORLD: the preset's defaults for WORLD training GPUs (again with the asynchronous split's world).
apply_preset() {
  local out line key value
  out="$(scale_cli defaults --model "${MODEL}" --recipe "${RECIPE}" --world "$1" 2>&1)" || die "${out#error: }"
  while IFS= read -r line; do
    if [[ "${line}" == "# "* ]]; then  # a note on the recipe, said once
      [[ "${PRESET_APPLIED}" == 1 ]] || note "${line#\# }"
      continue
    fi
    key="${line%%=*}" value="${line#*=}"
    if [[ "${PRESET_APPLIED}" == 0 && -n "${!key:-}" ]]; then PRESET_USER_SET+=" ${key} "; fi
    [[ "${PRESET_USER_SET}" == *" ${key} "* ]] || export "${key}=${value}"
  done <<<"${out}"
  PRESET_APPLIED=1
}
require_uint NUM_NODES "${NUM_NODES:-1}"
apply_preset "$((NUM_NODES * GPUS_PER_NODE))"
export MODEL_ARGS_SCRIPT="${MODEL_ARGS_SCRIPT:-${SCRIPTS_DIR}/models/${MODEL_FILE}}"
export BASE_HF_DIR="${BASE_HF_DIR:-${MODEL_DIR}/${MODEL_DIR_NAME}}"
export BASE_TORCH_DIST_DIR="${BASE_TORCH_DIST_DIR:-${MODEL_DIR}/${MODEL_DIR_NAME}_torch_dist}"
# The user simulator and the judge stay on Qwen3-4B-Instruct-2507 whatever MODEL trains (download.sh fetches it).
export USER_SIM_HF_ID="${USER_SIM_HF_ID:-Qwen/Qwen3-4B-Instruct-2507}"
export USER_SIM_HF_DIR="${USER_SIM_HF_DIR:-${MODEL_DIR}/${USER_SIM_HF_ID##*/}}"
for _path_var in BASE_HF_DIR BASE_TORCH_DIST_DIR MODEL_ARGS_SCRIPT USER_SIM_HF_DIR; do
  export "${_path_var}=$(abs_path "${!_path_var}")"
done
for _name in TRAIN_TP TRAIN_PP TRAIN_CP TRAIN_EP ROLLOUT_GPUS_PER_ENGINE; do require_uint "${_name}" "${!_name}"; done
CPU_ADAM="$(bool_setting CPU_ADAM "${CPU_ADAM}")"
((NUM_POLICY_GPUS % TRAIN_TP == 0)) || die "TRAIN_TP=${TRAIN_TP} does not divide the ${NUM_POLICY_GPUS} policy GPUs (${POLICY_GPUS})"
unset _name _path_var

# size_stage STAGE [flags of tau2_rl_pipeline.scale.cli check]: print the sizing sheet of this stage's layout
# (parameters, memory per training and SGLang GPU, the rollout step's work) and stop with one line if it cannot
# fit; SIZING_FORCE=1 makes that a warning (the estimate is conservative; the contract tier uses it). Host memory
# per node is checked against HOST_MEM_GB (GiB, each node's); unset, a real run compares it with this machine's
# MemTotal and warns only.
HOST_MEM_GB="${HOST_MEM_GB:-}"
[[ -z "${HOST_MEM_GB}" ]] || require_number HOST_MEM_GB "${HOST_MEM_GB}"
size_stage() {
  local stage=$1
  shift
  local -a turns=() host=()
  [[ -n "${TAU2_MAX_TURNS:-}" ]] && turns=(--max-turns "${TAU2_MAX_TURNS}")
  if [[ -n "${HOST_MEM_GB}" ]]; then host=(--host-mem-gb "${HOST_MEM_GB}"); elif ! is_dry; then host=(--meminfo /proc/meminfo); fi
  scale_cli check --prog "${PROG}" --name "${MODEL}" --model-file "${MODEL_ARGS_SCRIPT}" --stage "${stage}" \
    --tp "${TRAIN_TP}" --pp "${TRAIN_PP}" --cp "${TRAIN_CP}" --ep "${TRAIN_EP}" --cpu-adam "${CPU_ADAM}" \
    --engine-gpus "${ROLLOUT_GPUS_PER_ENGINE}" --node-gpus "${GPUS_PER_NODE}" --force "${SIZING_FORCE}" "${turns[@]}" \
    "${host[@]}" "$@" || exit 1
}

# ---- slime / Ray ----------------------------------------------------------------------------------------------
export RAY_DASHBOARD_PORT="${RAY_DASHBOARD_PORT:-8265}"
export RAY_GCS_PORT="${RAY_GCS_PORT:-6379}"
export MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"

source_model_args() {
  [[ -f "${MODEL_ARGS_SCRIPT}" ]] || die "model args script not found: ${MODEL_ARGS_SCRIPT}"
  # shellcheck source=models/qwen3-4B-Instruct-2507.sh
  source "${MODEL_ARGS_SCRIPT}"
}

json_string() {
  local s=$1
  [[ "${s}" =~ [[:cntrl:]] ]] && die "cannot pass a value with control characters to Ray: ${s:0:40}..."
  s="${s//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "${s}"
}

# Ray runtime env: PYTHONPATH with slime's root, Megatron-LM and this repo (slime imports our plug-ins by name),
# every exported TAU2_* variable (the original dropped some, e.g. TAU2_APPLY_CURRICULUM_WEIGHTS) and WANDB_PROJECT.
# Secret-named variables are left out of it (it lands on the command line and in Ray's job table); Ray workers
# inherit them, and WANDB_API_KEY, from the environment of the Ray head this script starts.
ray_runtime_env_json() {
  local -a pairs=(PYTHONPATH "${SLIME_DIR}:${MEGATRON_DIR}:${TAU2_ROOT}" CUDA_DEVICE_MAX_CONNECTIONS 1 PYTHONUNBUFFERED 1)
  local name body="" i item
  while IFS= read -r name; do
    if is_secret_name "${name}"; then
      note "not putting ${name} in the Ray runtime env (secret); workers inherit it from the Ray head"
      continue
    fi
    pairs+=("${name}" "${!name}")
  done < <(compgen -e | grep -E '^TAU2_' | sort)
  [[ -n "${WANDB_PROJECT:-}" ]] && pairs+=(WANDB_PROJECT "${WANDB_PROJECT}")
  # As slime's multi-node scripts pass them; SLIME_HOST_IP is not among them (each node has its own).
  pairs+=(MASTER_ADDR "${MASTER_ADDR}" no_proxy "${no_proxy}")
  for name in GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME; do
    [[ -z "${!name:-}" ]] || pairs+=("${name}" "${!name}")
  done
  for ((i = 0; i < ${#pairs[@]}; i += 2)); do
    item="$(json_string "${pairs[i]}"): $(json_string "${pairs[i + 1]}")"
    body+="${body:+, }${item}"
  done
  printf '{"env_vars": {%s}}' "${body}"
}

# Start a Ray head that sees only the policy GPUs, from slime's root, where ray_cluster_up went (the job's driver and
# workers inherit that directory); refuse to share a head that is already up (its GPUs are unknown). The workers
# (cluster.sh) join it; the EXIT trap stops them all.
ray_start_head() {
  require_port_free "${RAY_GCS_PORT}" "Ray GCS; a Ray head already running? stop it with: ray stop"
  require_port_free "${RAY_DASHBOARD_PORT}" "Ray dashboard"
  require_gpus "${POLICY_GPUS}" "policy (slime)"
  require_tool ray "Ray ships in the slime image"
  local temp_dir=()
  [[ -z "${RAY_TEMP_DIR}" ]] || temp_dir=(--temp-dir "${RAY_TEMP_DIR}")
  RAY_STARTED=1  # before the start: a head that fails half-way is stopped too
  trap ray_stop_cluster EXIT
  run env CUDA_VISIBLE_DEVICES="${POLICY_GPUS}" ray start --head --node-ip-address "${MASTER_ADDR}" \
    --port "${RAY_GCS_PORT}" --num-gpus "${NUM_POLICY_GPUS}" --disable-usage-stats \
    --dashboard-host 127.0.0.1 --dashboard-port "${RAY_DASHBOARD_PORT}" "${temp_dir[@]}"
}

# Submit slime's entry point ($1: train.py or train_async.py) with the remaining arguments and wait for it.
# The job runs slime from its own root, where ray_cluster_up left us, and names the entry point by its absolute path
# (the original set Ray's working_dir to the cookbook, where train.py is not); to the head this script started, or to
# RAY_ADDRESS's; watched on a cluster it started (watched_job).
ray_submit() {
  local entry=$1
  shift
  local runtime_env
  runtime_env="$(ray_runtime_env_json)"
  watched_job ray job submit --address="${RAY_JOBS_API}" \
    --runtime-env-json="${runtime_env}" -- "${PYTHON}" "${SLIME_DIR}/${entry}" "$@"
}

# ---- flag groups shared by SFT and GRPO (one flag per line; read with mapfile) --------------------------------
# A run resumes when SAVE ($1) already holds a checkpoint: Megatron's tracker, which slime's own test of --load reads.
resuming() { [[ -f "$1/latest_checkpointed_iteration.txt" ]]; }

# The checkpoint the actor loads (slime's --load): SAVE on a resume, else INIT. The cluster check covers this one.
loaded_checkpoint() {
  local init=$1 save=$2
  if resuming "${save}"; then printf '%s\n' "${save}"; else printf '%s\n' "${init}"; fi
}

# Fresh start from INIT: load its weights only, at step 0 (the original's GRPO --load of the SFT checkpoint
# resumed at the SFT step count with the SFT optimizer). Resume when SAVE already holds a checkpoint.
checkpoint_flags() {
  local init=$1 save=$2
  if resuming "${save}"; then
    note "resuming from ${save}"
    printf '%s\n' --load "${save}"
  else
    printf '%s\n' --load "${init}" --finetune --no-load-optim --no-load-rng --start-rollout-id 0
  fi
  printf '%s\n' --save "${save}"
}

perf_flags() {
  local max_tokens=$1
  printf '%s\n' --tensor-model-parallel-size "${TRAIN_TP}"
  ((TRAIN_TP > 1)) && printf '%s\n' --sequence-parallel
  printf '%s\n' --pipeline-model-parallel-size "${TRAIN_PP}" --context-parallel-size "${TRAIN_CP}" \
    --expert-model-parallel-size "${TRAIN_EP}" --expert-tensor-parallel-size 1 \
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 \
    --use-dynamic-batch-size --max-tokens-per-gpu "${max_tokens}"
  # CPU Adam, as slime's run scripts spell it: optimizer states in host memory, stepped on the CPU.
  if [[ "${CPU_ADAM}" == 1 ]]; then
    printf '%s\n' --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer
  fi
}

# Megatron's dropout defaults to 0.1; fp32 reductions and softmax for stability (as slime's Qwen3 scripts do).
misc_flags() {
  printf '%s\n' --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 \
    --attention-softmax-in-fp32 --attention-backend flash
}

# slime's own wandb flags, on when WANDB_API_KEY is set. The key itself is never a flag: slime logs its whole
# argument namespace as the run config, and wandb reads WANDB_API_KEY from the environment.
wandb_flags() {
  if [[ -n "${WANDB_API_KEY:-}" ]]; then
    printf '%s\n' --use-wandb --wandb-project "${WANDB_PROJECT:-tau2-rl-pipeline}" --wandb-group "${WANDB_GROUP:-$1}"
  else
    note "WANDB_API_KEY not set: no wandb logging"
  fi
}

# Extra slime/Megatron flags, split on spaces (e.g. EXTRA_SLIME_ARGS="--optimizer-cpu-offload").
extra_flags() {
  local extra
  read -r -a extra <<<"${EXTRA_SLIME_ARGS:-}"
  ((${#extra[@]} == 0)) || printf '%s\n' "${extra[@]}"
}

# Each server of a URL list (a router's URL, or several servers' comma-separated, as the clients take them) answers
# at URL+$2. $4=ray: a client inside the Ray job, which on several nodes may run on any of them, where a loopback URL
# names another machine: refused (unless the nodes are themselves loopback addresses of this machine).
require_servers() {
  local urls=$1 suffix=$2 what=$3 where=${4:-} url
  for url in ${urls//,/ }; do
    if [[ "${where}" == ray ]] && ((NUM_NODES > 1)) && ! cluster_on_loopback && [[ "${url}" =~ ^https?://(127\.[0-9.]+|localhost|\[::1\])(:|/|$) ]]; then
      die "${what} at ${url} is on loopback: on ${NUM_NODES} nodes the rollout runs on any of them; give an address every node reaches (a router's: scripts/start_router.sh)"
    fi
    require_server "${url%/}${suffix}" "${what}"
  done
}

# The user simulator's OpenAI-compatible endpoint(s), if local (TAU2_USER_API_BASE non-empty: a server's or a
# router's URL, or several servers' comma-separated). $1=ray: its client runs in the Ray job.
require_user_sim() {
  if [[ -z "${TAU2_USER_API_BASE}" ]]; then
    note "TAU2_USER_API_BASE is empty: user simulator ${TAU2_USER_MODEL} at its provider's default endpoint"
    return 0
  fi
  require_servers "${TAU2_USER_API_BASE}" /models "user simulator (start it with scripts/start_user_sim.sh)" "${1:-}"
}
