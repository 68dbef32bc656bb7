"""Learning signals made from rollouts: rewards, curriculum, losses and SFT rows.

Learning signals made from rollouts: reward shaping (reward), the curriculum (curriculum), the LLM-judge reward
(judge_reward), the AWSFT recipe's episode weights (awsft), the policy losses shared by both trainers (losses), and
SFT rows: their format (sft_rows), the published seed data (seed_data), gold-action demonstrations (oracle_demos)
and their command line (sft_data). Imports the rollout, the benchmark side and the ground; no trainer, no slime.
"""
