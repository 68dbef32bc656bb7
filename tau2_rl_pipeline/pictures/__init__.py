"""The pictures in public/, generated from the project itself (python -m tau2_rl_pipeline.pictures).

- plan.py: scripts/pipeline.sh's stages, servers, files and GPUs, read from its dry run;
- pipeline_diagram.py: public/pipeline.png from those plans;
- stage_chart.py: the demo's per-stage Pass@K chart from its report.json;
- bench_chart.py: bench/README.md's P-tables as ratios;
- __main__.py: the command that regenerates them all.
"""
