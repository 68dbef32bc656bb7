# shellcheck shell=bash source-path=SCRIPTDIR
# Sourced by every stage script: the runner of a stage's plan. Every decision (defaults, checks, the layout, the
# cluster, slime's argv, the one-line refusals) is the planner's, tau2_rl_pipeline/launch; a script asks it with
# `plan_stage STAGE` and this file runs what it says: it prints each command and runs it unless this is a dry run.
#
# Dry run (DRY_RUN=1) prints each command as `+ <command>`, shell-quoted with printf %q, instead of running it.
#   still checked: numbers, choices, the GPU layout, option consistency (a bad value is still an error);
#   only warned about: input paths that do not exist yet (earlier stages have not run), ports in use;
#   skipped, with a note: GPU count (nvidia-smi), server reachability, tools on PATH.
# Notes and warnings go to stderr; stdout carries only the `+ ` command lines and pipeline stage headers.

# A failure inside $(...) stops the script too (bash does not pass errexit into command substitutions by default).
shopt -s inherit_errexit
PROG="$(basename "$0")"
die() { printf '%s: error: %s\n' "${PROG}" "$*" >&2; exit 1; }
note() { printf '%s: %s\n' "${PROG}" "$*" >&2; }
is_dry() { [[ "${DRY_RUN:-0}" == 1 ]]; }

# Values of the secret-named variables in the environment (4+ characters), one per line: names ending in KEY,
# TOKEN, SECRET, PASSWORD, PASSWD, CREDENTIAL(S) (the planner keeps them out of every command and the Ray runtime
# env by the same rule: launch/settings.py's SECRET_NAME).
secret_values() {
  local name value
  while IFS= read -r name; do
    [[ "${name}" =~ (^|_)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$ ]] || continue
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

# ---- the plan ------------------------------------------------------------------------------------------------
TAU2_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS_DIR="${TAU2_ROOT}/scripts"
# plan_stage STAGE: ask the planner (this machine's python3: the planner is stdlib only) for the stage's plan and
# run it: it prints the notes and the sizing sheet, stops with one line on what cannot run, exports the settings
# and runs its steps (the step_* verbs: below, cluster.sh's and pipeline.sh's).
plan_stage() {
  local plan
  plan="$(PYTHONPATH="${TAU2_ROOT}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m tau2_rl_pipeline.launch "$1" \
    --prog "${PROG}")" || exit 1
  eval "${plan}"
}
step_cd() { enter_dir "$1"; }
step_run() { run "$@"; }
# MAX_RESTARTS: the stage script again, under the supervisor (tau2_rl_pipeline/launch/restarts.py plans it).
step_supervise() {
  show_cmd "$@"
  is_dry || exec "$@"
}
# A server in the foreground (the router): signals to the script reach it.
step_exec() {
  show_cmd "$@"
  is_dry || exec "$@"
}
# shellcheck source=cluster.sh
source "${SCRIPTS_DIR}/cluster.sh"
# shellcheck source=cluster_watch.sh
source "${SCRIPTS_DIR}/cluster_watch.sh"
