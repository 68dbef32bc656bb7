"""Stages that read evaluator runs and choose what the next stage trains on.

Rejection-sampled SFT data (rft) and the GRPO task filter by RFT-sampling pass rate (difficulty)."""
