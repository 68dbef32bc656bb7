#!/usr/bin/env bash
# A stage on Slurm: writes the batch script (#SBATCH lines from the options below) under $LOG_DIR/slurm and submits
# it with sbatch. In the allocation it starts a Ray head on the first node and a worker on each other one (srun), runs
# the stage script joined to them (RAY_ADDRESS), and stops them; a job Slurm requeues after a node failure resumes
# from the stage's checkpoint. The decisions are tau2_rl_pipeline/cluster/slurm.py's (docs/multi-node.md, "On Slurm").
#
#   bash scripts/slurm.sh --nodes 2 --gpus-per-node 8 --partition gpu --time 24:00:00 train_grpo.sh
#   DRY_RUN=1 bash scripts/slurm.sh --nodes 2 train_grpo.sh     # print the batch script and the plan instead
#   bash scripts/slurm.sh --help                                 # every option
#
# The stage's own settings (TAU2_GPU_LAYOUT, GRPO_*, ...) are exported as for the stage script: sbatch passes the
# environment on to the job.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHONPATH="${ROOT}${PYTHONPATH:+:${PYTHONPATH}}" exec python3 -m tau2_rl_pipeline.cluster.slurm submit "$@"
