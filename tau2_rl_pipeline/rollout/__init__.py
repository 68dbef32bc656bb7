"""The rollout: token in, token out.

A multi-turn episode against a policy engine (episode_loop.run_episode; what it produced: trajectory), keeping the
exact sampled token ids, log-probs and a loss mask over policy tokens only (tokens); the engines that sample them
(engines: SGLang's /generate at scale, transformers in-process locally); the guard that stops a run whose samples
all abort (abort_storm); the garbage-collector policy for long rollouts (gc_policy). Imports the benchmark side and
the ground.
"""
