"""Learning signals made from rollouts: reward shaping (reward), the curriculum (curriculum), the LLM-judge reward
(judge_reward), the policy losses shared by both trainers (losses) and the SFT data (sft_data). Imports the rollout,
the benchmark side and the ground; no trainer, no slime.
"""
