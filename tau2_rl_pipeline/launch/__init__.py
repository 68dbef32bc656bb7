"""The stage planner: what each stage script runs, decided once, in typed Python (the scripts only run it).

From the preset or recipe, the GPU layout, the cluster (one node, a hostfile's, a running Ray cluster's) and the
TAU2_*/stage variables, `stages.plan_stage` builds one `plan.StagePlan` per stage: slime's argv, the environment and
Ray runtime env, what runs on which node and GPU, the sizing sheet, and every refusal, one line before anything
starts. The stage scripts print it (a dry run) and run its steps; the tests and the pictures read the object.

  settings  the environment read as typed settings: paths, the GPU layout, numbers and switches (one-line refusals)
  machine   what the planner asks of this machine (files, ports, GPUs, servers, interfaces): the only I/O
  cluster   the nodes (hostfile, RAY_ADDRESS), slime's placement of actor and engines, the Ray commands
  recipe    the GRPO, AWSFT and SFT defaults, shared by the slime scripts and the local backend
  stages    one plan per stage: SFT, RFT, GRPO (sync, async, AWSFT), RFT generation, the pipeline
  graph     the stage graph: the order, each stage's outputs (scripts/pipeline.sh and local/pipeline.py)
  plan      the plan object and how the scripts receive it (bash words for the runner in scripts/common.sh)
"""
