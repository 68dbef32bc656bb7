"""Pass@K evaluation of a policy on tau2 (python -m tau2_rl_pipeline.eval.eval_passk --help).

- eval_passk.py: the command line, setup checks, the run, and its outputs.
- runner.py: episodes run concurrently, each one a JSON-ready record (no CLI, no files).
- shards.py: the same over several rollout processes (--procs), records sent back to the one writer.
- episodes_file.py: the resumable episode log (append + fsync, torn-line repair) and secret redaction.
- backends.py: checkpoint resolution (local dir or hub id), SGLang reachability, tokenizer, local engine.
- tau2_results.py: the episodes as tau2's own Results files.
- report.py: terminal tables and the PNG chart (python -m tau2_rl_pipeline.eval.report re-renders one from a summary).
"""
