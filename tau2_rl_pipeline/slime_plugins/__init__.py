"""The slime plug-ins: the only place that imports slime (a test keeps it so).

slime loads them by dotted path inside its Ray job: adapter (--custom-generate-function-path and the reward,
filter and fully async rollout hooks), partial_rollout (an episode cut at the end of a rollout resumed in the
next), sft (SFT's rollout function) and awsft (advantage-weighted SFT as a custom loss). cluster_check is run by
scripts/cluster.sh before slime's job on several nodes (every node joined, has its network interfaces and sees the
checkpoints and data).
"""
