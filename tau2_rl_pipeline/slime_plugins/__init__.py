"""The slime plug-ins: the only place that imports slime (a test keeps it so).

slime loads them by dotted path inside its Ray job: adapter (--custom-generate-function-path and the reward,
filter and fully async rollout hooks), partial_rollout (an episode cut at the end of a rollout resumed in the
next), sft (SFT's rollout function) and awsft (advantage-weighted SFT as a custom loss). The cluster tools the
scripts run beside slime's job are in tau2_rl_pipeline/cluster.
"""
