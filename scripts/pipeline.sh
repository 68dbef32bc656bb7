#!/usr/bin/env bash
# The whole recipe, stage by stage, in order. A stage whose output exists is skipped (delete the output to redo it),
# so an interrupted run picks up where it stopped; a training stage resumes from its own last checkpoint.
#
#   bash scripts/pipeline.sh                  # everything, on the layout TAU2_GPU_LAYOUT (8, 4 or 2 GPUs)
#   DRY_RUN=1 bash scripts/pipeline.sh        # the plan: stage headers and every stage's commands
# (public/pipeline.png is drawn from that plan: python -m tau2_rl_pipeline.pictures)
#
#   stage      script                          output (skip marker)
#   download   download.sh                     ${BASE_HF_DIR}/config.json and ${SEED_DATA}
#   convert    convert_hf_to_megatron.sh       ${BASE_TORCH_DIST_DIR}/latest_checkpointed_iteration.txt
#   tasks      python -m tau2_rl_pipeline.benchmark.tasks ${TASKS_DIR}/tau2_train_all_tasks.jsonl (and the test split)
#   sft        train_sft.sh                    ${SFT_CKPT_DIR}/.stage_done
#   sft_hf     convert_megatron_to_hf.sh       ${SFT_HF_DIR}/config.json
#   rft_data   start_policy_server.sh + generate_rft.sh   ${RFT_DATA}
#   rft        train_rft.sh                    ${RFT_CKPT_DIR}/.stage_done
#   grpo_tasks python -m tau2_rl_pipeline.selection.difficulty ${GRPO_TASKS}: the train tasks whose RFT-sampling pass rate
#              is in [TAU2_GRPO_MIN_PASS_RATE, TAU2_GRPO_MAX_PASS_RATE] (default: all), counts of each bound's drops
#   grpo       train_grpo.sh                   ${GRPO_CKPT_DIR}/.stage_done
#   grpo_hf    convert_megatron_to_hf.sh       ${GRPO_HF_DIR}/config.json
# Training stages save checkpoints along the way, so their marker is written only once the stage has succeeded.
# The user simulator is started (in the background, on USER_SIM_GPUS) for rft_data and grpo unless one already
# answers at TAU2_USER_API_BASE; whatever this script starts, it stops on exit.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SERVER_START_TIMEOUT="${SERVER_START_TIMEOUT:-900}"
require_uint SERVER_START_TIMEOUT "${SERVER_START_TIMEOUT}"
STAGES=(download convert tasks sft sft_hf rft_data rft grpo_tasks grpo grpo_hf)
DONE_MARKER=.stage_done

stage_outputs() {
  case "$1" in
    download) printf '%s\n' "${BASE_HF_DIR}/config.json" "${SEED_DATA}" ;;
    convert) printf '%s\n' "${BASE_TORCH_DIST_DIR}/latest_checkpointed_iteration.txt" ;;
    tasks) printf '%s\n' "${TASKS_DIR}/tau2_train_all_tasks.jsonl" "${TASKS_DIR}/tau2_test_all_tasks.jsonl" ;;
    sft) printf '%s\n' "${SFT_CKPT_DIR}/${DONE_MARKER}" ;;
    sft_hf) printf '%s\n' "${SFT_HF_DIR}/config.json" ;;
    rft_data) printf '%s\n' "${RFT_DATA}" ;;
    rft) printf '%s\n' "${RFT_CKPT_DIR}/${DONE_MARKER}" ;;
    grpo_tasks) printf '%s\n' "${GRPO_TASKS}" ;;
    grpo) printf '%s\n' "${GRPO_CKPT_DIR}/${DONE_MARKER}" ;;
    grpo_hf) printf '%s\n' "${GRPO_HF_DIR}/config.json" ;;
  esac
}

# ---- background servers (started here, stopped here: by the process group of the pid we started) ------------
SERVER_PIDS=()
SERVER_NAMES=()

wait_for_server() {
  local url=$1 what=$2 pid=$3 log=$4 waited=0
  if is_dry; then note "dry run: would wait up to ${SERVER_START_TIMEOUT}s for ${what} at ${url}"; return 0; fi
  require_tool curl "to wait for ${what}"
  until server_up "${url}"; do
    kill -0 "${pid}" 2>/dev/null || die "${what} exited before answering at ${url}; see ${log}"
    ((waited < SERVER_START_TIMEOUT)) || die "${what} did not answer at ${url} within ${SERVER_START_TIMEOUT}s; see ${log}"
    sleep 5
    waited=$((waited + 5))
  done
}

start_server() { # name health_url command...
  local name=$1 url=$2 log="${LOG_DIR}/$1.log"
  shift 2
  printf '+ %s >%q 2>&1 </dev/null &\n' "$(quote_cmd setsid "$@")" "${log}"
  if is_dry; then
    "$@" # the server script itself prints its command
    wait_for_server "${url}" "${name}" "" "${log}"
    return 0
  fi
  mkdir -p "${LOG_DIR}"
  setsid "$@" >"${log}" 2>&1 </dev/null &
  SERVER_PIDS+=("$!")
  SERVER_NAMES+=("${name}")
  wait_for_server "${url}" "${name}" "$!" "${log}"
}

stop_server() { # name
  local i
  if is_dry; then note "dry run: would stop $1 (its process group)"; return 0; fi
  for i in "${!SERVER_NAMES[@]}"; do
    [[ "${SERVER_NAMES[i]}" == "$1" ]] || continue
    run kill -TERM -- "-${SERVER_PIDS[i]}"
    wait "${SERVER_PIDS[i]}" 2>/dev/null || true
    unset 'SERVER_NAMES[i]' 'SERVER_PIDS[i]'
  done
}

stop_all_servers() {
  local name
  for name in "${SERVER_NAMES[@]}"; do stop_server "${name}"; done
}
trap stop_all_servers EXIT

USER_SIM_UP=0
ensure_user_sim() {
  ((USER_SIM_UP == 0)) || return 0
  USER_SIM_UP=1
  if [[ -z "${TAU2_USER_API_BASE}" ]]; then
    note "TAU2_USER_API_BASE is empty: user simulator ${TAU2_USER_MODEL} at its provider; nothing to start"
    return 0
  fi
  local url="${TAU2_USER_API_BASE%/}/models"
  if ! is_dry && server_up "${url}"; then
    note "user simulator already answers at ${url}; using it (and leaving it running)"
    return 0
  fi
  start_server user_sim "${url}" bash "${SCRIPTS_DIR}/start_user_sim.sh"
}

# ---- stages -----------------------------------------------------------------------------------------------
stage_cmd() { # print and run a stage script; it runs in a dry run too (it honours DRY_RUN itself)
  show_cmd "$@"
  "$@"
}

run_stage() {
  case "$1" in
    download) stage_cmd bash "${SCRIPTS_DIR}/download.sh" ;;
    convert) stage_cmd bash "${SCRIPTS_DIR}/convert_hf_to_megatron.sh" ;;
    tasks)
      enter_dir "${TAU2_ROOT}"
      run "${PYTHON}" -m tau2_rl_pipeline.benchmark.tasks --local_dir "${TASKS_DIR}" --domains "${DOMAINS}" --splits train,test
      ;;
    sft) stage_cmd bash "${SCRIPTS_DIR}/train_sft.sh" ;;
    sft_hf) stage_cmd env CKPT_IN="${SFT_CKPT_DIR}" HF_OUT="${SFT_HF_DIR}" bash "${SCRIPTS_DIR}/convert_megatron_to_hf.sh" ;;
    rft_data)
      ensure_user_sim
      start_server policy "http://127.0.0.1:${POLICY_PORT}/health" \
        env POLICY_MODEL_PATH="${SFT_HF_DIR}" bash "${SCRIPTS_DIR}/start_policy_server.sh"
      stage_cmd bash "${SCRIPTS_DIR}/generate_rft.sh"
      stop_server policy
      ;;
    rft) stage_cmd bash "${SCRIPTS_DIR}/train_rft.sh" ;;
    grpo_tasks)
      require_file "${RFT_EPISODES}" "the RFT stage's episode file (scripts/generate_rft.sh)"
      enter_dir "${TAU2_ROOT}"
      run "${PYTHON}" -m tau2_rl_pipeline.selection.difficulty --episodes "${RFT_EPISODES}" \
        --tasks "${TASKS_DIR}/tau2_train_all_tasks.jsonl" --out "${GRPO_TASKS}"
      ;;
    grpo)
      ensure_user_sim
      stage_cmd env GRPO_PROMPT_DATA="${GRPO_PROMPT_DATA:-${GRPO_TASKS}}" bash "${SCRIPTS_DIR}/train_grpo.sh"
      ;;
    grpo_hf) stage_cmd env CKPT_IN="${GRPO_CKPT_DIR}" HF_OUT="${GRPO_HF_DIR}" bash "${SCRIPTS_DIR}/convert_megatron_to_hf.sh" ;;
  esac
}

# A training stage is done once its script exited 0 and its checkpoint directory names a saved iteration.
mark_done() {
  local output=$1 dir
  [[ "$(basename "${output}")" == "${DONE_MARKER}" ]] || return 0
  dir="$(dirname "${output}")"
  [[ -f "${dir}/latest_checkpointed_iteration.txt" ]] || die "stage left no checkpoint in ${dir}"
  date -u +%Y-%m-%dT%H:%M:%SZ >"${output}"
}

note "layout ${TAU2_GPU_LAYOUT}: policy GPUs ${POLICY_GPUS}, user simulator GPUs ${USER_SIM_GPUS}; outputs in ${TAU2_OUT_DIR}"
total=${#STAGES[@]}
for i in "${!STAGES[@]}"; do
  stage=${STAGES[i]}
  mapfile -t outputs < <(stage_outputs "${stage}")
  missing=()
  for output in "${outputs[@]}"; do [[ -e "${output}" ]] || missing+=("${output}"); done
  if ((${#missing[@]} == 0)); then
    printf '==> stage %d/%d %s: skipped, output exists: %s\n' "$((i + 1))" "${total}" "${stage}" "${outputs[*]}"
    continue
  fi
  printf '==> stage %d/%d %s: running, output: %s\n' "$((i + 1))" "${total}" "${stage}" "${outputs[*]}"
  run_stage "${stage}"
  is_dry && continue
  for output in "${outputs[@]}"; do
    mark_done "${output}"
    [[ -e "${output}" ]] || die "stage ${stage} finished without producing ${output}"
  done
done
