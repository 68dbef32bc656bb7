"""Is checkpoint B better than A? A paired comparison of two evaluator runs over the same tasks.

Two runs on the same tasks share each task's difficulty, so their two CIs side by side say little: a real gain
hides under task-to-task spread, and noise looks like a gain. Compared per task instead, d = B's value - A's
value (pass@1: the task's success rate; pass^k: tau2's unbiased per-task estimate, each run's own n), the
difference is mean(d) over tasks, with
- a 95% paired bootstrap CI: tasks resampled with replacement, each carrying its pair (metrics.bootstrap_ci on d);
- a paired permutation p-value: with no difference, A and B are exchangeable within each task, so each d's sign
  is a fair coin; p = share of sign patterns whose |mean| reaches the observed one. With at most EXACT_MAX_TASKS
  tasks all 2^T patterns are enumerated (an exact p); above, N_PERM random ones, p = (1 + hits) / (1 + N_PERM).
A difference is called significant when p < SIGNIFICANCE (two-sided).

Runs are compared only when they ask the same question (`check_comparable`): the same benchmark (tau2 version
and task-set hash), tasks, user simulator and sampling settings; otherwise a one-line NotComparable names the
first differing field. The model, the seed and where it ran may differ. Pure: tau2_rl_pipeline/eval/compare_cli.py does the I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from tau2_rl_pipeline.metrics import bootstrap_ci, is_success, pass_hat_k

SIGNIFICANCE = 0.05
EXACT_MAX_TASKS = 16  # 2^16 sign patterns: exact and still a few milliseconds
N_PERM = 20_000
N_BOOT = 10_000
# Fields of the evaluator's settings two compared runs must share (the run's question, not who answered it).
COMPARED_FIELDS = ("benchmark", "judge", "domains", "task_split", "task_ids", "user", "user_model",
                   "user_temperature", "user_strategy", "user_llm_args", "num_samples", "runs", "sampling",
                   "max_turns", "max_steps", "max_errors", "max_context_len")
# The user LLM's arguments that say how it is reached, not what it answers (not compared, may change on a resume).
USER_TRANSPORT_ARGS = ("api_base", "num_retries", "timeout")
# summaries written before a field existed: an LLM user then always ran tau2's own strategy
_DEFAULTS = {"runs": lambda s: 1, "user_strategy": lambda s: {"name": "llm"} if s.get("user") == "llm" else None}
_IGNORED = {"sampling": ("stop_token_ids",), "judge": ("api_base",),  # follow the tokenizer / the endpoint
            "user_llm_args": USER_TRANSPORT_ARGS}
_AS_SETS = ("domains", "task_ids")  # the same tasks in another order ask the same question


class NotComparable(ValueError):
    """The two runs differ in what they measure (benchmark, tasks, user simulator or sampling)."""


# ---------------------------------------------------------------------------------------------------
# Comparability

def _field(settings: dict[str, Any], name: str) -> Any:
    value = settings[name] if name in settings else _DEFAULTS.get(name, lambda s: None)(settings)
    if isinstance(value, dict) and name in _IGNORED:
        value = {k: v for k, v in value.items() if k not in _IGNORED[name]}
    if isinstance(value, list) and name in _AS_SETS:
        value = sorted(value)
    return value


def check_comparable(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Raise NotComparable naming the first field (dotted inside a dict) on which two runs' settings differ."""
    for name in COMPARED_FIELDS:
        va, vb = _field(a, name), _field(b, name)
        if va == vb:
            continue
        if isinstance(va, dict) and isinstance(vb, dict):
            key = next(k for k in sorted({*va, *vb}) if va.get(k) != vb.get(k))
            name, va, vb = f"{name}.{key}", va.get(key), vb.get(key)
        raise NotComparable(f"the runs differ in {name} ({va!r} vs {vb!r}): a paired comparison needs the same "
                            "benchmark, tasks, user simulator and sampling settings")


# ---------------------------------------------------------------------------------------------------
# Paired statistics

def _diffs(diffs: Sequence[float]) -> np.ndarray:
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 1 or d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"paired differences must be a non-empty 1-D sequence of finite numbers, got {diffs!r}")
    return d


def sign_flip_p_value(diffs: Sequence[float], *, n_perm: int = N_PERM, seed: int = 0) -> float:
    """Two-sided paired permutation p-value of mean(diffs) = 0: exact over all 2^T sign patterns for
    T <= EXACT_MAX_TASKS, else Monte Carlo with n_perm patterns and the (1 + hits) / (1 + n_perm) estimate."""
    d = _diffs(diffs)
    t = d.size
    observed = abs(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # ties count as reaching the observed value
    if t <= EXACT_MAX_TASKS:
        signs = 1.0 - 2.0 * ((np.arange(2 ** t)[:, None] >> np.arange(t)) & 1)
        return float(np.mean(np.abs(signs @ d) >= observed - tol))
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(n_perm, t))
    hits = int(np.sum(np.abs(signs @ d) >= observed - tol))
    return (1 + hits) / (1 + n_perm)


def paired_difference(a: Sequence[float], b: Sequence[float], *, n_boot: int = N_BOOT, n_perm: int = N_PERM,
                      seed: int = 0) -> dict[str, Any]:
    """B - A over paired per-task values: both means, the difference, its 95% bootstrap CI and permutation p."""
    va, vb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if va.shape != vb.shape:
        raise ValueError(f"paired values need the same tasks: {va.size} vs {vb.size} values")
    d = _diffs(vb - va)
    lo, hi = bootstrap_ci(d, n_boot=n_boot, seed=seed)
    return {"a": float(va.mean()), "b": float(vb.mean()), "diff": float(d.mean()), "ci": [lo, hi],
            "p_value": sign_flip_p_value(d, n_perm=n_perm, seed=seed), "n_tasks": int(d.size),
            "all_alike": bool(np.all(d == d[0]))}  # every task moved by the same amount: the CI has no width


# ---------------------------------------------------------------------------------------------------
# Runs -> per-task tallies -> comparisons

Tally = tuple[int, int]  # (non-aborted episodes, successes) of one task


def task_tallies(records: Iterable[dict]) -> dict[str, dict[str, Tally]]:
    """domain -> task id -> (n, c) over non-aborted episodes (aborted ones are infrastructure, as in metrics)."""
    out: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in records:
        if r["status"] == "aborted":
            continue
        tally = out[r["domain"]][r["task_id"]]
        tally[0] += 1
        tally[1] += is_success(r["reward"])
    return {d: {t: (n, c) for t, (n, c) in ts.items()} for d, ts in out.items()}


def compare_tasks(a: dict[str, Tally], b: dict[str, Tally], *, k: int | None = None, seed: int = 0,
                  n_boot: int = N_BOOT, n_perm: int = N_PERM) -> dict[str, Any]:
    """pass@1 and pass^k of B against A over the tasks both runs scored (k: at most the given one, the runs'
    samples per task, and at most the fewest episodes any paired task has in either run), with the tasks B does
    better and worse on (by success rate) and those scored in one run only."""
    tasks = sorted(set(a) & set(b))
    if not tasks:
        raise ValueError("no task has a scored episode in both runs")
    fewest = min(min(a[t][0], b[t][0]) for t in tasks)
    wanted = k
    k = fewest if k is None else min(k, fewest)
    rate = {t: (a[t][1] / a[t][0], b[t][1] / b[t][0]) for t in tasks}
    metrics = {"pass@1": paired_difference([rate[t][0] for t in tasks], [rate[t][1] for t in tasks],
                                           n_boot=n_boot, n_perm=n_perm, seed=seed)}
    if k > 1:
        metrics[f"pass^{k}"] = paired_difference([pass_hat_k(*a[t], k) for t in tasks],
                                                 [pass_hat_k(*b[t], k) for t in tasks],
                                                 n_boot=n_boot, n_perm=n_perm, seed=seed)
    return {"n_tasks": len(tasks), "k": k, "metrics": metrics, "warnings": _short_tasks(a, b, tasks, wanted, k),
            "better_in_b": [t for t in tasks if rate[t][1] > rate[t][0]],
            "worse_in_b": [t for t in tasks if rate[t][1] < rate[t][0]],
            "unpaired_tasks": sorted(set(a) ^ set(b))}


def _short_tasks(a: dict[str, Tally], b: dict[str, Tally], tasks: list[str], wanted: int | None,
                 k: int) -> list[str]:
    """A warning naming the tasks that keep pass^wanted from being computed (too few scored episodes)."""
    if wanted is None or k >= wanted:
        return []
    short = [f"{t} (A {a[t][0]}, B {b[t][0]})" for t in tasks if min(a[t][0], b[t][0]) < wanted]
    named = ", ".join(short[:5]) + (", ..." if len(short) > 5 else "")
    return [f"pass^{wanted} not computed: {len(short)} of {len(tasks)} paired tasks hold fewer than {wanted} "
            f"scored episodes in a run: {named}"]


def compare_runs(a: dict[str, Any], b: dict[str, Any], *, seed: int = 0, n_boot: int = N_BOOT,
                 n_perm: int = N_PERM) -> dict[str, Any]:
    """Runs {"settings", "records"} compared per domain, and over all tasks pooled when there are several domains
    (domain i, sorted, uses seed + i; the pool uses seed). Raises NotComparable first when they measure different
    things."""
    check_comparable(a["settings"], b["settings"])
    k = a["settings"].get("num_samples")
    ta, tb = task_tallies(a["records"]), task_tallies(b["records"])
    domains = sorted(set(ta) & set(tb))
    if not domains:
        raise ValueError("no domain has a scored episode in both runs")
    out = {d: compare_tasks(ta[d], tb[d], k=k, seed=seed + i, n_boot=n_boot, n_perm=n_perm)
           for i, d in enumerate(domains)}
    if len(domains) > 1:
        def pool(tallies: dict[str, dict[str, Tally]]) -> dict[str, Tally]:
            return {f"{d}/{task}": v for d in domains for task, v in tallies[d].items()}

        out["overall"] = compare_tasks(pool(ta), pool(tb), k=k, seed=seed, n_boot=n_boot, n_perm=n_perm)
    return {"scopes": out, "significance": SIGNIFICANCE, "n_boot": n_boot,
            "test": "paired bootstrap CI over tasks; two-sided paired sign-flip permutation p-value"}


# ---------------------------------------------------------------------------------------------------
# Verdicts

def is_significant(entry: dict[str, Any]) -> bool:
    return entry["p_value"] < SIGNIFICANCE


def metric_text(name: str, entry: dict[str, Any]) -> str:
    lo, hi = entry["ci"]
    spread = (f"every one of the {entry['n_tasks']} tasks moved alike, so the bootstrap has no spread to show"
              if entry.get("all_alike") else f"95% CI {lo:+.3f}, {hi:+.3f}")
    return f"{name} {entry['b']:.3f} vs {entry['a']:.3f}: {entry['diff']:+.3f} [{spread}], p={entry['p_value']:.3f}"


def verdict_line(name_a: str, name_b: str, scope: str, comparison: dict[str, Any]) -> str:
    """One line per scope: every metric's difference with CI and p, then the plain verdict on pass@1."""
    head = comparison["metrics"]["pass@1"]
    if not is_significant(head):
        verdict = f"NOT significant (p >= {SIGNIFICANCE}): no evidence {name_b} differs from {name_a}"
    else:
        verdict = f"significant: {name_b} is {'better' if head['diff'] > 0 else 'worse'} than {name_a}"
    metrics = "; ".join(metric_text(n, e) for n, e in comparison["metrics"].items())
    return (f"{name_b} vs {name_a} ({scope}, {comparison['n_tasks']} paired tasks): {metrics}; "
            f"{len(comparison['better_in_b'])} tasks better, {len(comparison['worse_in_b'])} worse -> {verdict}")


def verdict_lines(name_a: str, name_b: str, result: dict[str, Any]) -> list[str]:
    """A verdict line per scope, each followed by its WARNING lines (what could not be compared)."""
    return [line for scope, c in result["scopes"].items()
            for line in (verdict_line(name_a, name_b, scope, c), *(f"WARNING ({scope}): {w}" for w in c["warnings"]))]
