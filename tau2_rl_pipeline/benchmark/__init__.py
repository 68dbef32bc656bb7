"""The benchmark side: what tau2 is, made fast and safe.

tau2's versions (tau2_version: every difference between 26.3 and 1.0.1 in one place), task splits (tasks), one
episode with tau2's environment, user and evaluator (episode; gym_env wraps it for gymnasium), the fast in-memory
environments (fast_env), the user side (users, user_client, user_strategies), the NL-assertion judge (judge),
gold-action replays (oracle), and the agent's interface to tau2: parsing a completion into an action (actions)
and the prompt and tool schemas it sees (prompting). Imports only the ground (config, metrics, files, http_post).
"""

# Who plays the user (users.py makes each): here, so that a command lists them in its --help without loading tau2.
USER_KINDS = ("llm", "scripted")
