"""The test suite's tiers: which marks a test module gets by where it lives, what the quick tier leaves out, and
which product modules a set of test modules reaches.

The full suite (`bash scripts/test.sh`, CI) runs everything; `bash scripts/test.sh --quick` leaves out the tests
marked with a mark in QUICK_LEAVES_OUT: a developer's loop of at most 3 minutes on a quiet 2-core machine that
still imports every module of tau2_rl_pipeline from some test (tests/test_tiers.py holds it to that). Marks go by
path and test name here (tests/conftest.py applies them), so no test module needs an edit to join a tier; a test
may also carry `@pytest.mark.slow` (or another registered mark) itself.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

MARKERS = {
    "slow": "more than a few seconds of CPU (a whole stage, CLI or script run, a training loop): left out of --quick",
    "contract": "runs slime's and Megatron-LM's own code (tests/contract; needs ../shared/third_party)",
    "hosts": "a cluster of namespaced hosts (root, network namespaces, sshd; the CI step TAU2_HOSTS_TIER=1)",
    "slurm": "Slurm on namespaced hosts (tests/slurm, or TAU2_SLURM_TIER=1)",
}
QUICK_LEAVES_OUT = ("slow", "hosts", "slurm")

# Slow tests, by module (a path under tests/): every test of the module (ALL), or the tests named (functions, each
# with all its parameters). A whole module is slow when its tests run stage scripts, CLIs, servers, clusters or
# training in child processes; a named test, when --durations=0 and its CPU time put it among the heaviest.
# Kept here rather than as marks in the modules, so a tier changes in one place (tests/test_tiers.py checks that
# each module and test named exists).
ALL = frozenset({"*"})
SLOW: dict[str, frozenset[str]] = {
    **dict.fromkeys([
        "test_local_pipeline.py", "test_tau2_v1.py", "test_local_algorithms.py", "test_resume.py",
        "test_interrupt.py", "test_faults.py", "test_cluster_scripts.py", "test_readme_commands.py",
        "test_clear_errors.py", "test_packaging.py", "test_use_tau2.py", "test_models.py",
        "test_gpu_check.py", "test_bench_harness.py", "test_bench_long_tail.py", "contract/test_ray_cluster.py",
        "contract/test_router.py", "contract/test_stage_argv.py", "contract/test_preset_argv.py",
        "contract/test_multinode_argv.py", "contract/test_slime_awsft.py", "contract/test_checkpoint_check.py",
        "contract/test_offpolicy_losses.py"], ALL),
    "test_scripts.py": frozenset({"test_shellcheck_passes_on_every_script",  # the gate's quick test: reads_the_domains
                                  "test_grpo_requires_a_qualified_user_simulator_when_asked",
                                  "test_the_grpo_gate_refuses_a_qualification_that_does_not_cover_the_run",
                                  "test_the_grpo_gate_runs_on_the_package_interpreter_outside_the_container",
                                  "test_every_setting_reaches_the_output", "test_secrets_never_reach_the_output",
                                  "test_stages_hand_their_outputs_to_the_next_stage",
                                  "test_pipeline_runs_every_stage_in_order",
                                  "test_pipeline_really_runs_the_missing_stage_then_skips_it",
                                  "test_pipeline_skips_stages_whose_output_exists"}),
    "test_fast_env.py": frozenset({"test_rewards_match_tau2_on_oracle_and_perturbed_replays"}),  # every test task
    "test_eval_passk.py": frozenset({"test_two_rollout_processes_write_the_run_of_one",
                                     "test_sigkill_then_resume_equals_an_uninterrupted_run"}),
    "test_adversarial_outputs.py": frozenset({"test_bad_outputs_in_live_episodes_are_scored_as_the_models_and_never_crash"}),
    "test_pictures.py": frozenset({"test_a_bad_pictures_command_is_one_line_in_words",
                                   "test_pipeline_picture_names_every_stage_script",
                                   "test_pictures_regenerate_from_a_fresh_shell",
                                   "test_readme_tasks_command_runs_as_typed_from_a_fresh_shell",
                                   "test_console_scripts_help_fits_one_screen_from_a_fresh_shell",
                                   "test_pipeline_plan_has_the_files_servers_and_gpus_the_scripts_use",
                                   "test_checked_in_pictures_are_the_ones_the_command_writes"}),
    "test_oracle.py": frozenset({"test_write_action_counts_match_the_measured_ones",
                                 "test_oracle_replay_scores_one_and_dropping_last_write_scores_zero"}),  # every task
    "test_trainer.py": frozenset({"test_every_grpo_setting_changes_the_update",
                                  "test_sft_stopped_by_ctrl_c_resumes_at_its_last_saved_step_and_ends_where_an_unstopped_run_ends",
                                  "test_a_wholly_masked_example_counts_as_slime_counts_it",
                                  "test_training_is_deterministic_for_a_seed_and_the_seed_matters",
                                  "test_micro_batches_with_accumulation_give_the_same_gradient_as_one_batch",
                                  "test_without_a_terminal_each_training_step_logs_a_line",
                                  "test_wandb_logs_every_step_and_runs_offline_without_a_key"}),
    "test_sft_data.py": frozenset({"test_offline_without_a_cache_is_a_one_line_error",
                                   "test_offline_reads_the_hub_cache",
                                   "test_every_train_task_of_the_three_domains_has_a_demonstration_at_reward_one"}),
    "contract/test_sft_masks.py": frozenset({"test_slime_sft_masks_equal_the_local_ones_on_every_oracle_row",
                                             "test_slime_sft_masks_equal_the_local_ones_on_the_seed_rows"}),
    "contract/test_logit_memory.py": frozenset({"test_grpo_keeps_three_fp32_buffers_at_its_peaks"}),
    "test_secrets.py": frozenset({"test_the_evaluator_writes_no_key_in_any_output"}),
}
HOSTS_MODULES = frozenset({"test_hosts.py", "contract/test_hosts_cluster.py", "contract/test_hosts_faults.py",
                           "contract/test_hosts_restarts.py", "contract/test_engine_hang.py",
                           "test_multinode_doc.py"})


def marks_for(rel: str, test: str = "") -> set[str]:
    """The marks a test gets from its module's path under tests/ (posix, e.g. 'contract/test_router.py') and its
    function's name."""
    marks = set()
    if rel.startswith("contract/"):
        marks.add("contract")
    if rel.startswith("slurm/"):
        marks.add("slurm")
    if rel in HOSTS_MODULES:
        marks.add("hosts")
    if SLOW.get(rel) == ALL or test in SLOW.get(rel, ()):
        marks.add("slow")
    return marks


def product_modules(package: Path) -> set[str]:
    """Every module of the package as a dotted name; `__init__` files apart (importing a module imports them)."""
    return {".".join(p.relative_to(package.parent).with_suffix("").parts)
            for p in package.rglob("*.py") if p.name != "__init__.py"}


def _names(tree: ast.AST) -> set[str]:
    """Dotted names an import statement of this tree binds (`from a.b import c` gives a.b and a.b.c)."""
    found = set()
    for node in ast.walk(tree) if not isinstance(tree, list) else tree:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def references(source: str, modules: set[str]) -> set[str]:
    """The product modules a test module names: imported (at the top or inside a test), run by `python -m`, or
    named by path or dotted string (a monkeypatch target, a slime plug-in path)."""
    tree = ast.parse(source)
    found = _names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in re.findall(r"tau2_rl_pipeline[./][\w./]*", node.value):
                dotted = name.replace("/", ".").removesuffix(".py").rstrip(".")
                found |= {dotted, dotted.rsplit(".", 1)[0]}
    return {m for m in found if m in modules}


def loaded_with(module: str, package: Path, modules: set[str]) -> set[str]:
    """The product modules a module imports at its top level: loading it loads them (a lazy import inside a function
    does not count)."""
    path = package.parent / (module.replace(".", "/") + ".py")
    top = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.Import | ast.ImportFrom)]
    return {m for m in _names(top) if m in modules}


def helpers(source: str, tests: Path) -> list[Path]:
    """The test rigs and helper modules under tests/ a test module imports (support.hosts, slime_harness, ...)."""
    out = []
    for name in _names(ast.parse(source)):
        for base in (tests, tests / "contract"):
            path = base / (name.replace(".", "/") + ".py")
            if path.is_file() and not path.name.startswith("test_"):
                out.append(path)
    return out


def unreached(test_files: list[Path], package: Path) -> list[str]:
    """The package's modules that none of these test modules (nor the helpers they import) names, and that no named
    module loads at its top level; sorted."""
    modules = product_modules(package)
    tests = package.parent / "tests"
    sources, seen = list(test_files), set()
    reached: set[str] = set()
    while sources:
        path = sources.pop()
        if path in seen:
            continue
        seen.add(path)
        text = path.read_text()
        reached |= references(text, modules)
        sources += helpers(text, tests)
    todo = list(reached)
    while todo:
        for module in loaded_with(todo.pop(), package, modules) - reached:
            reached.add(module)
            todo.append(module)
    return sorted(modules - reached)
