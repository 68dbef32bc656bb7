"""Learning signals made from rollouts: reward shaping (reward), the curriculum (curriculum), the LLM-judge reward
(judge_reward), the policy losses shared by both trainers (losses) and the SFT rows (sft_rows: the format; seed_data: the published seed data; oracle_demos: gold-action demonstrations; sft_data: their command line). Imports the rollout,
the benchmark side and the ground; no trainer, no slime.
"""
