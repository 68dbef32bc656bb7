#!/usr/bin/env bash
# Stage: GRPO on tau2 train tasks with this package's multi-turn rollout (slime's train.py, training and rollout
# colocated on the policy GPUs). Needs the user simulator (scripts/start_user_sim.sh) on the other GPUs.
#
#   bash scripts/train_grpo.sh                # ${RFT_CKPT_DIR} -> ${GRPO_CKPT_DIR}
#   GRPO_ASYNC=1 bash scripts/train_grpo.sh   # asynchronous GRPO (below)
#   DRY_RUN=1 bash scripts/train_grpo.sh      # print the commands instead
#
# GRPO_ASYNC=1 runs slime's train_async.py instead: rollout for step n+1 runs while step n trains, on separate GPUs
# (train_async.py refuses --colocate), so the policy GPUs are split: GRPO_ASYNC_ROLLOUT_GPUS (default half of them)
# serve SGLang engines, the rest train (TRAIN_TP capped at their number). Needs at least 2 policy GPUs (layouts 8, 4).
#   GRPO_ASYNC_ROLLOUT_FUNCTION  tau2_rl_pipeline.slime_plugins.adapter.generate_rollout_fully_async: slime's fully async
#                                rollout (a pool of episodes in flight across rollout boundaries; it calls our
#                                custom generate through slime's generate_and_rm_group), stopped by an abort storm
#                                (slime's worker alone would drop failing groups and wait for ever)
#   GRPO_MAX_STALENESS=1         eta: no trained token comes from weights more than eta versions behind the weights
#                                training it (tau2_rl_pipeline/slime_plugins/staleness.py, exported to it as
#                                TAU2_MAX_STALENESS): new groups start only while that can hold (AReaL's
#                                max_head_offpolicyness rule), turns that still lag past it are masked and counted,
#                                rollout/staleness/* logged; --sglang-server-concurrency is bounded to match
#                                ((eta + 1) x the rollout's samples over the engines; slime's default, 512 per engine,
#                                kept ~1024 groups in flight for a 16-group step). -1 = unbounded. 0 is refused here:
#                                train_async.py collects each rollout before the previous step's update, so every
#                                token is at least 1 behind (eta = 0 is the synchronous path, GRPO_ASYNC=0).
#                                bench/README.md P12: the measurement behind the default
# In both modes (tests/contract/test_partial_rollout.py and test_slime_rollout.py run slime's own rollout code):
#   GRPO_PARTIAL_ROLLOUT=1       --partial-rollout: an episode cut by the rollout (slime's end-of-rollout abort in
#                                train.py; in train_async.py a weight update, whose /pause_generation aborts the
#                                requests in flight) goes back to slime's buffer and, handed back, goes on where it
#                                was cut (TAU2_PARTIAL_RESUME=1; 0 starts it again)
#   GRPO_MASK_OFFPOLICY=1        --mask-offpolicy-in-partial-rollout: no token sampled by weights older than its
#                                episode's last turn is trained (our generate masks each turn by the weight version
#                                SGLang reported for it: a resumed episode's earlier turns, and in the async mode an
#                                episode that met a weight update between two turns). 0 trains them, and is refused
#                                unless TIS corrects them: slime's PPO ratio uses the log-probs the actor recomputes,
#                                so without TIS they are trained as if on-policy
#   GRPO_USE_TIS=1               --use-tis: truncated importance sampling with the rollout log-probs our generate
#                                keeps. GRPO_ALGORITHM=awsft never uses TIS (slime's custom loss has no importance
#                                ratio), so there GRPO_MASK_OFFPOLICY must stay 1
#   always                       slime_plugins/batch.py: a group whose samples all aborted never takes a batch slot
#                                (dynamic filter, reason all_aborted; the async worker requeues such groups itself),
#                                and aborted samples are left out of the logged raw_reward, counted apart
# Starts from GRPO_INIT_DIR's weights at rollout 0 without its optimizer state, with the same checkpoint as the KL
# reference; resumes if GRPO_CKPT_DIR already holds a checkpoint. Every default below is overridable.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
plan_stage grpo  # tau2_rl_pipeline/launch: every setting above read, checked and run there
