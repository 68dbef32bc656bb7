"""The embedded local backend: the same stages on one machine.

pipeline (python -m tau2_rl_pipeline.local.pipeline, the demo: base -> SFT -> RFT -> GRPO, each evaluated),
trainer (SFT and policy-gradient steps in transformers) over examples (what it learns from: sequences, masks,
padded batches) with train_log (progress and the per-step log), grpo (the GRPO/AWSFT stage over the local
engine), stage_book (what each stage did, for resume and skip), demo_report (the report, charts, comparisons)
and interrupt (Ctrl-C answered within a second while a training step holds the main thread).
"""
