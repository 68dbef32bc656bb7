#!/usr/bin/env bash
# Serve SGLang's router (the sglang-router package, SGLang's own) in front of several SGLang servers, e.g. user
# simulators or RFT policy servers started on other GPUs or nodes (scripts/start_user_sim.sh,
# start_policy_server.sh, each with *_HOST=0.0.0.0). A client takes the router's URL as it takes one server's:
# TAU2_USER_API_BASE=http://HOST:PORT/v1, RFT_POLICY_URL or eval's --sglang-url http://HOST:PORT. (The clients also
# take the servers' URLs comma-separated and spread the load themselves, with no router.) Runs in the foreground;
# stop it with Ctrl-C.
#
#   ROUTER_WORKER_URLS=http://10.0.0.2:30001,http://10.0.0.3:30001 ROUTER_HOST=0.0.0.0 bash scripts/start_router.sh
#   DRY_RUN=1 ROUTER_WORKER_URLS=... bash scripts/start_router.sh
#
# ROUTER_POLICY: cache_aware (default; a conversation's next turn goes where its prefix is cached), round_robin,
# power_of_two, random.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage env  # the settings (paths, layout, preset) from tau2_rl_pipeline/launch

ROUTER_WORKER_URLS="${ROUTER_WORKER_URLS:-}"
ROUTER_HOST="${ROUTER_HOST:-127.0.0.1}"
ROUTER_PORT="${ROUTER_PORT:-30100}"
ROUTER_POLICY="${ROUTER_POLICY:-cache_aware}"
ROUTER_METRICS_PORT="${ROUTER_METRICS_PORT:-29000}"  # the router's Prometheus port: one per router on a node

[[ -n "${ROUTER_WORKER_URLS}" ]] ||
  die "ROUTER_WORKER_URLS is empty: list the SGLang servers to route to, comma-separated (http://host:port,...)"
read -r -a WORKER_URLS <<<"${ROUTER_WORKER_URLS//,/ }"
for url in "${WORKER_URLS[@]}"; do
  [[ "${url}" =~ ^https?://[^/]+:[0-9]+/?$ ]] ||
    die "ROUTER_WORKER_URLS: '${url}' is not http://host:port (a server's root, without /v1)"
done
require_uint ROUTER_PORT "${ROUTER_PORT}"
require_uint ROUTER_METRICS_PORT "${ROUTER_METRICS_PORT}"
require_choice ROUTER_POLICY "${ROUTER_POLICY}" cache_aware round_robin power_of_two random
require_port_free "${ROUTER_PORT}" "router"
require_port_free "${ROUTER_METRICS_PORT}" "router metrics (ROUTER_METRICS_PORT; another router on this node?)"
for url in "${WORKER_URLS[@]}"; do require_server "${url%/}/health" "SGLang server behind the router"; done
note "router on ${ROUTER_HOST}:${ROUTER_PORT} (${ROUTER_POLICY}) in front of ${#WORKER_URLS[@]} server(s)"

# exec: a signal to this script (Ctrl-C, a supervisor's SIGTERM) reaches the router itself.
ROUTER_CMD=("${PYTHON}" -m sglang_router.launch_router --host "${ROUTER_HOST}" --port "${ROUTER_PORT}"
  --prometheus-port "${ROUTER_METRICS_PORT}" --policy "${ROUTER_POLICY}" --worker-urls "${WORKER_URLS[@]}")
show_cmd "${ROUTER_CMD[@]}"
is_dry || exec "${ROUTER_CMD[@]}"
