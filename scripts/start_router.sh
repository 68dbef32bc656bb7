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
plan_stage router  # tau2_rl_pipeline/launch: every setting above read, checked and run there
