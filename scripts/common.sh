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

# ---- the plan ------------------------------------------------------------------------------------------------
TAU2_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS_DIR="${TAU2_ROOT}/scripts"
# plan_stage STAGE: ask the planner (tau2_rl_pipeline/launch, this machine's python3: stdlib only) for the stage's
# plan and run it: it prints the notes and the sizing sheet, stops with one line on what cannot run, exports the
# settings and runs its steps (the step_* verbs below, cluster.sh's and pipeline.sh's). STAGE env: the settings only.
plan_stage() {
  local plan
  plan="$(PYTHONPATH="${TAU2_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m tau2_rl_pipeline.launch "$1" \
    --prog "${PROG}")" || exit 1
  eval "${plan}"
}
step_cd() { enter_dir "$1"; }
step_run() { run "$@"; }
# shellcheck source=cluster.sh
source "${SCRIPTS_DIR}/cluster.sh"
# shellcheck source=cluster_watch.sh
source "${SCRIPTS_DIR}/cluster_watch.sh"

source_model_args() {
  [[ -f "${MODEL_ARGS_SCRIPT}" ]] || die "model args script not found: ${MODEL_ARGS_SCRIPT}"
  # shellcheck source=models/qwen3-4B-Instruct-2507.sh
  source "${MODEL_ARGS_SCRIPT}"
}

