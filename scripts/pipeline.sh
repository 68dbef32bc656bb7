#!/usr/bin/env bash
# The whole recipe, stage by stage, in order. A stage whose output exists is skipped (delete the output to redo it),
# so an interrupted run picks up where it stopped; a training stage resumes from its own last checkpoint.
#
#   bash scripts/pipeline.sh                  # everything, on the layout TAU2_GPU_LAYOUT (8, 4 or 2 GPUs)
#   DRY_RUN=1 bash scripts/pipeline.sh        # the plan: stage headers and every stage's commands
# (public/pipeline.png is drawn from that plan: python -m tau2_rl_pipeline.pictures)
#
#   stage      script                          output (skip marker): the graph is tau2_rl_pipeline/launch/graph.py
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

# ---- the runner of the plan's pipeline steps: background servers (started here, stopped here: by the process group
# of the pid we started), the stage scripts, each stage's outputs checked once it ran ---------------------------------
SERVER_PIDS=()
SERVER_NAMES=()

wait_for_server() {
  local url=$1 what=$2 pid=$3 log=$4 waited=0
  if is_dry; then note "dry run: would wait up to ${SERVER_START_TIMEOUT}s for ${what} at ${url}"; return 0; fi
  until curl -fsS --max-time 5 -o /dev/null "${url}" 2>/dev/null; do
    kill -0 "${pid}" 2>/dev/null || die "${what} exited before answering at ${url}; see ${log}"
    ((waited < SERVER_START_TIMEOUT)) || die "${what} did not answer at ${url} within ${SERVER_START_TIMEOUT}s; see ${log}"
    sleep 5
    waited=$((waited + 5))
  done
}

step_server() { # name health_url command...
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

step_stop_server() { # name
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
  for name in "${SERVER_NAMES[@]}"; do step_stop_server "${name}"; done
}
trap stop_all_servers EXIT

step_header() { printf '%s\n' "$1"; }
step_note() { note "$1"; }
step_stage() { show_cmd "$@"; "$@"; }  # a stage script runs in a dry run too (it honours DRY_RUN itself)
step_need() {  # an earlier stage's output, when this stage starts: the plan's line if it is missing
  [[ -e "$1" ]] || { is_dry || die "$2"; note "warning: $2 (the dry run goes on)"; }
}

# A stage's outputs, once it ran: a training stage is done once its script exited 0 and its checkpoint directory
# names a saved iteration (then its marker is written).
step_done() {
  local stage=$1 output dir
  shift
  for output in "$@"; do
    if [[ "$(basename "${output}")" == .stage_done ]]; then
      dir="$(dirname "${output}")"
      [[ -f "${dir}/latest_checkpointed_iteration.txt" ]] || die "stage left no checkpoint in ${dir}"
      date -u +%Y-%m-%dT%H:%M:%SZ >"${output}"
    fi
    [[ -e "${output}" ]] || die "stage ${stage} finished without producing ${output}"
  done
}

plan_stage pipeline
