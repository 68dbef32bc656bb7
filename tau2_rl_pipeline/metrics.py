"""Pass@k / pass^k with bootstrap CIs and a failure taxonomy, from the Pass@K evaluator's episode records.

Pure functions over plain dicts, no I/O: tau2_rl_pipeline/eval/eval_passk.py prints and saves what `summarize` returns.
Why every number carries a CI and its counts: identical single tau2 runs differ by 7-11 points (tau2
issue #540), so a bare "0.42" invites reading noise as progress.

Conventions (`summarize` also writes them into its "notes"):
- success = reward within 1e-6 of 1 (tau2's rule).
- aborted episodes (infrastructure errors) are left out of every metric and counted apart, as tau2 does.
- pass@k and pass^k are unbiased per-task estimates from that task's own n, averaged over tasks. A k is
  reported for a scope only if every task in it has n >= k (tau2 likewise caps k at the smallest n).
- success_rate, mean_partial and mean_turns are means over episodes; their CIs still resample tasks.
- micro pools the tasks of all domains; macro is the plain mean of the domain values.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np

SUCCESS_TOL = 1e-6
CI_ALPHA = 0.05  # summarize reports 95% intervals
MAX_EXAMPLES = 5
STATUSES = ("completed", "truncated", "aborted")
_INT_FIELDS = ("sample", "parse_errors", "unknown_tool_calls", "user_tool_calls_by_agent", "turns")
_STR_FIELDS = ("domain", "task_id", "status", "termination_reason")

# Failure categories over non-aborted episodes; one episode can fall in several.
_FAILURES: dict[str, Callable[[dict], bool]] = {
    "parse_errors": lambda r: r["parse_errors"] > 0,
    "unknown_tool_calls": lambda r: r["unknown_tool_calls"] > 0,
    "user_tool_calls_by_agent": lambda r: r["user_tool_calls_by_agent"] > 0,
    "premature_stop": lambda r: r["termination_reason"] == "agent_stop" and not is_success(r["reward"]),
    "max_steps_or_turns": lambda r: r["termination_reason"] in ("max_steps", "max_turns"),
    "truncated": lambda r: r["status"] == "truncated",
    "too_many_errors": lambda r: r["termination_reason"] == "too_many_errors",
}


# ---------------------------------------------------------------------------------------------------
# Estimators

def is_success(reward: float) -> bool:
    """tau2's rule: reward within 1e-6 of 1 (a NaN reward is a failure)."""
    return abs(reward - 1.0) <= SUCCESS_TOL


def _check_nck(n: int, c: int, k: int) -> None:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, Integral):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(some of k samples drawn without replacement from n, c of them successes, succeeds) = 1 - C(n-c,k)/C(n,k).

    Chen et al. 2021's product form C(n-c,k)/C(n,k) = prod_{i=n-c+1..n} (1 - k/i) avoids huge binomials.
    """
    _check_nck(n, c, k)
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_hat_k(n: int, c: int, k: int) -> float:
    """tau2's pass^k: P(all of k samples drawn without replacement succeed) = C(c,k)/C(n,k) = prod (c-i)/(n-i)."""
    _check_nck(n, c, k)
    if c < k:
        return 0.0  # explicit: the product would reach 0 but may come out as -0.0
    return math.prod((c - i) / (n - i) for i in range(k))


# ---------------------------------------------------------------------------------------------------
# Bootstrap over tasks

def _row_means(values: np.ndarray, weights: np.ndarray | None, idx: np.ndarray) -> np.ndarray:
    """(Weighted) mean of values[idx] per row, clipped to [min, max]: a mean lies there exactly, and the clip
    removes the ulp of rounding that would otherwise make identical tasks give a CI other than [v, v]."""
    v = values[idx]
    if weights is None:
        m = v.mean(axis=1)
    else:
        w = weights[idx]
        m = (v * w).sum(axis=1) / w.sum(axis=1)
    return np.clip(m, values.min(), values.max())


def _point_and_replicates(values: np.ndarray, weights: np.ndarray | None, n_boot: int,
                          seed: int) -> tuple[float, np.ndarray]:
    """Point estimate and n_boot bootstrap replicates, resampling tasks with replacement."""
    t = len(values)
    point = float(_row_means(values, weights, np.arange(t)[None, :])[0])
    idx = np.random.default_rng(seed).integers(0, t, size=(n_boot, t))
    return point, _row_means(values, weights, idx)


def _percentile(replicates: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(replicates, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _check_boot(n_boot: int, seed: int) -> None:
    for name, v, least in (("n_boot", n_boot, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, Integral) or v < least:
            raise ValueError(f"{name} must be an int >= {least}, got {v!r}")


def _as_array(name: str, xs: Sequence[float]) -> np.ndarray:
    a = np.asarray(xs, dtype=float)
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of numbers, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {list(xs)!r}")
    return a


def bootstrap_ci(per_task_values: Sequence[float], *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                 weights: Sequence[float] | None = None) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean over tasks (tasks resampled with replacement).

    With `weights` (e.g. episodes per task) the statistic is sum(w*v)/sum(w): an episode-level rate whose
    uncertainty still comes from which tasks were drawn, since episodes of one task are not independent.
    """
    _check_boot(n_boot, seed)
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    values = _as_array("per_task_values", per_task_values)
    w = None
    if weights is not None:
        w = _as_array("weights", weights)
        if w.shape != values.shape or np.any(w <= 0):
            raise ValueError(f"weights must be {values.size} positive numbers, got {list(weights)!r}")
    return _percentile(_point_and_replicates(values, w, int(n_boot), int(seed))[1], alpha)


# ---------------------------------------------------------------------------------------------------
# Records -> per-task tallies

def _validate(records: list[dict]) -> None:
    if not isinstance(records, (list, tuple)) or not records:
        raise ValueError("records must be a non-empty list of episode dicts")
    seen: set[tuple[str, str, int]] = set()
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise ValueError(f"record {i}: expected a dict, got {type(r).__name__}")
        missing = [f for f in (*_STR_FIELDS, *_INT_FIELDS, "reward", "partial") if f not in r]
        if missing:
            raise ValueError(f"record {i}: missing fields {missing}")
        for f in _STR_FIELDS:
            if not isinstance(r[f], str):
                raise ValueError(f"record {i}: {f} must be a str, got {r[f]!r}")
        for f in _INT_FIELDS:
            if isinstance(r[f], bool) or not isinstance(r[f], Integral) or r[f] < 0:
                raise ValueError(f"record {i}: {f} must be an int >= 0, got {r[f]!r}")
        if r["status"] not in STATUSES:
            raise ValueError(f"record {i}: status must be one of {STATUSES}, got {r['status']!r}")
        for f in ("reward", "partial"):
            if isinstance(r[f], bool) or not isinstance(r[f], Real) or not math.isfinite(r[f]):
                raise ValueError(f"record {i}: {f} must be a finite number, got {r[f]!r}")
        if not 0.0 <= r["partial"] <= 1.0:
            raise ValueError(f"record {i}: partial must be in [0, 1], got {r['partial']!r}")
        key = (r["domain"], r["task_id"], r["sample"])
        if key in seen:
            raise ValueError(f"record {i}: duplicate episode domain={key[0]!r} task_id={key[1]!r} sample={key[2]}")
        seen.add(key)


class _Tasks:
    """Per-task tallies (n, successes, partial and turn sums) of the non-aborted episodes of one scope."""

    def __init__(self, episodes_by_task: dict[str, list[dict]]):
        self.ids = sorted(episodes_by_task)
        eps = [episodes_by_task[t] for t in self.ids]
        self.n = np.array([len(e) for e in eps], dtype=int)
        self.c = np.array([sum(is_success(r["reward"]) for r in e) for e in eps], dtype=int)
        self.partial = np.array([math.fsum(r["partial"] for r in e) / len(e) for e in eps])
        self.turns = np.array([math.fsum(r["turns"] for r in e) / len(e) for e in eps])

    def counts(self) -> dict[str, Any]:
        return {"n_tasks": len(self.ids), "n_episodes": int(self.n.sum()),
                "samples_per_task": {"min": int(self.n.min()), "max": int(self.n.max())}}

    def metric_inputs(self, ks: list[int]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Metric name -> (per-task values, weights); weights=None means a plain mean over tasks."""
        out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for k in ks:
            out[f"pass@{k}"] = (np.array([pass_at_k(int(n), int(c), k) for n, c in zip(self.n, self.c)]), None)
            out[f"pass^{k}"] = (np.array([pass_hat_k(int(n), int(c), k) for n, c in zip(self.n, self.c)]), None)
        w = self.n.astype(float)
        out["success_rate"] = (self.c / self.n, w)
        out["mean_partial"] = (self.partial, w)
        out["mean_turns"] = (self.turns, w)
        return out


def _select_k(n: np.ndarray, requested: list[int] | None) -> tuple[list[int], dict[str, str]]:
    """The ks every task in scope supports, and a reason for each candidate k left out."""
    candidates = requested if requested is not None else list(range(1, int(n.max()) + 1))
    lo = int(n.min())
    skipped = {str(k): f"{int((n < k).sum())} of {n.size} tasks have fewer than {k} non-aborted samples "
                       f"(min n = {lo}); pass@{k}/pass^{k} need n >= k for every task"
               for k in candidates if k > lo}
    return [k for k in candidates if k <= lo], skipped


def _entry(value: float, ci: tuple[float, float], counts: dict[str, Any]) -> dict[str, Any]:
    return {"value": value, "ci": [ci[0], ci[1]], "n_tasks": counts["n_tasks"], "n_episodes": counts["n_episodes"],
            **({"n_domains": counts["n_domains"]} if "n_domains" in counts else {})}


def _entries(reps: dict[str, tuple[float, np.ndarray]], counts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Metric name -> entry with the point estimate, the 95% percentile CI of its replicates, and the counts."""
    return {name: _entry(p, _percentile(r, CI_ALPHA), counts) for name, (p, r) in reps.items()}


def _failure_taxonomy(records: list[dict]) -> dict[str, Any]:
    """Termination-reason counts and failure categories, each with how many episodes/tasks and example ids."""
    ordered = sorted(records, key=lambda r: (r["task_id"], r["sample"]))
    kept = [r for r in ordered if r["status"] != "aborted"]
    tests = {**{name: (kept, pred) for name, pred in _FAILURES.items()},
             "aborted": (ordered, lambda r: r["status"] == "aborted")}
    categories = {}
    for name, (pool, pred) in tests.items():
        hits = [r["task_id"] for r in pool if pred(r)]
        task_ids = list(dict.fromkeys(hits))
        categories[name] = {"episodes": len(hits), "tasks": len(task_ids), "example_task_ids": task_ids[:MAX_EXAMPLES]}
    reasons = Counter(r["termination_reason"] for r in kept)
    return {"termination_reasons": dict(sorted(reasons.items())), "categories": categories}


# ---------------------------------------------------------------------------------------------------
# Summary

def _check_k_values(k_values: Sequence[int] | None, max_n: int) -> list[int] | None:
    if k_values is None:
        return None
    ks = list(k_values)
    if not ks or any(isinstance(k, bool) or not isinstance(k, Integral) or k < 1 for k in ks):
        raise ValueError(f"k_values must be a non-empty list of ints >= 1, got {k_values!r}")
    if max(ks) > max_n:
        raise ValueError(f"k={max(ks)} exceeds the most non-aborted samples any task has (n={max_n})")
    return sorted({int(k) for k in ks})


def summarize(records: list[dict], *, k_values: Sequence[int] | None = None, n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """Per-domain and overall (micro and macro) metrics with 95% bootstrap CIs over tasks, plus failure taxonomy.

    k_values=None reports every k from 1 to the smallest per-task n of each scope. Domain i (sorted by name)
    bootstraps with seed+i, so its CIs equal bootstrap_ci(per-task values, seed=seed+i) and the domains'
    resamples are independent for the macro CI; micro bootstraps the pooled tasks with `seed`.
    Returns plain JSON types only; metric keys are "pass@k", "pass^k", "success_rate", "mean_partial",
    "mean_turns", each an entry {"value", "ci": [lo, hi], "n_tasks", "n_episodes"(, "n_domains")}.
    """
    _validate(records)
    _check_boot(n_boot, seed)
    by_domain: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_domain[r["domain"]].append(r)
    kept = [r for r in records if r["status"] != "aborted"]
    n_aborted = len(records) - len(kept)
    if not kept:
        raise ValueError(f"all {len(records)} episodes are aborted: no metrics to compute")

    tasks_by_domain: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in kept:
        tasks_by_domain[r["domain"]][r["task_id"]].append(r)
    pooled = _Tasks({f"{d}/{t}": eps for d, ts in tasks_by_domain.items() for t, eps in ts.items()})
    requested = _check_k_values(k_values, int(pooled.n.max()))

    domains: dict[str, Any] = {}
    domain_reps: dict[str, dict[str, tuple[float, np.ndarray]]] = {}
    for i, domain in enumerate(sorted(by_domain)):
        recs = by_domain[domain]
        all_ids = {r["task_id"] for r in recs}
        out: dict[str, Any] = {"aborted_episodes": sum(r["status"] == "aborted" for r in recs),
                               "tasks_all_aborted": sorted(all_ids - set(tasks_by_domain.get(domain, {})))}
        if domain in tasks_by_domain:
            tasks = _Tasks(tasks_by_domain[domain])
            counts = tasks.counts()
            ks, skipped = _select_k(tasks.n, requested)
            reps = {name: _point_and_replicates(v, w, n_boot, seed + i)
                    for name, (v, w) in tasks.metric_inputs(ks).items()}
            domain_reps[domain] = reps
            out.update(counts, k_values=ks, k_skipped=skipped, metrics=_entries(reps, counts))
        else:
            out.update(n_tasks=0, n_episodes=0, samples_per_task={"min": 0, "max": 0}, k_values=[], k_skipped={},
                       metrics={})
        out["failures"] = _failure_taxonomy(recs)
        domains[domain] = out

    counts = {**pooled.counts(), "n_domains": len(domain_reps)}
    ks, skipped = _select_k(pooled.n, requested)
    micro = {name: _point_and_replicates(v, w, n_boot, seed) for name, (v, w) in pooled.metric_inputs(ks).items()}
    # Every k in micro's ks is supported by every domain (micro needs n >= k in all tasks), so each name exists.
    macro = {name: (float(_mean_over_domains(np.array([[domain_reps[d][name][0]] for d in domain_reps]))[0]),
                    _mean_over_domains(np.stack([domain_reps[d][name][1] for d in domain_reps])))
             for name in micro}
    overall = {**counts, "aborted_episodes": n_aborted,
               "domains_without_episodes": sorted(set(by_domain) - set(domain_reps)),
               "k_values": ks, "k_skipped": skipped, "micro": _entries(micro, counts), "macro": _entries(macro, counts)}
    return {"domains": domains, "overall": overall, "aborted_episodes": n_aborted,
            "ci_level": 1 - CI_ALPHA, "n_boot": int(n_boot), "seed": int(seed), "notes": _NOTES}


def _mean_over_domains(stacked: np.ndarray) -> np.ndarray:
    """Column means of a (domains, replicates) array, clipped to each column's [min, max] like _row_means."""
    return np.clip(stacked.mean(axis=0), stacked.min(axis=0), stacked.max(axis=0))


_NOTES = [
    "success = reward within 1e-6 of 1 (tau2's rule)",
    "aborted episodes (infrastructure errors) are excluded from all metrics and counted in aborted_episodes",
    "pass@k = 1 - C(n-c,k)/C(n,k), pass^k = C(c,k)/C(n,k) per task with that task's own n, averaged over tasks",
    "a k is reported for a scope only if every task in it has n >= k; others are listed in k_skipped",
    "success_rate, mean_partial and mean_turns are means over episodes (tasks with more samples weigh more)",
    "ci = 95% percentile bootstrap resampling tasks; micro pools all tasks, macro averages domain values",
    "failure categories count non-aborted episodes (one episode can be in several); 'aborted' counts aborted ones",
]


def over_runs(records: list[dict], *, num_samples: int, runs: int) -> dict[str, Any]:
    """Repeated runs (the evaluator's --runs; run r holds samples r*num_samples .. (r+1)*num_samples - 1): each
    run's own point estimate of every metric (k <= num_samples), then per domain (and overall micro with several
    domains) their mean and sample standard deviation over the runs, as the published 'mean +- sd over runs'.
    A run whose episodes all aborted has no estimate and is left out (`values` then has fewer entries)."""
    per_run = []
    for r in range(runs):
        mine = [x for x in records if r * num_samples <= x["sample"] < (r + 1) * num_samples]
        try:
            per_run.append(summarize(mine, k_values=list(range(1, num_samples + 1)), n_boot=1) if mine else None)
        except ValueError:  # every episode of this run aborted
            per_run.append(None)
    scored = [m for m in per_run if m is not None]

    def spread(scope: Callable[[dict], dict]) -> dict[str, Any]:
        names = list(dict.fromkeys(name for m in scored for name in scope(m)))
        out = {}
        for name in names:
            values = [scope(m)[name]["value"] for m in scored if name in scope(m)]
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            out[name] = {"mean": float(np.mean(values)), "sd": sd, "values": values}
        return out

    domains = sorted({d for m in scored for d in m["domains"]})
    result: dict[str, Any] = {"runs": runs, "num_samples": num_samples, "runs_scored": len(scored),
                              "domains": {d: spread(lambda m, d=d: m["domains"].get(d, {}).get("metrics", {}))
                                          for d in domains}}
    if len(domains) > 1:
        result["overall"] = spread(lambda m: m["overall"]["micro"])
    return result


def format_metric(entry: dict[str, Any]) -> str:
    """'0.425 [0.300, 0.550] (T=40 tasks, E=160 eps)': a printed number always shows its CI and counts."""
    try:
        lo, hi = entry["ci"]
        text = f"{entry['value']:.3f} [{lo:.3f}, {hi:.3f}] (T={entry['n_tasks']} tasks, E={entry['n_episodes']} eps"
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a metric entry (need value, ci=[lo, hi], n_tasks, n_episodes): {entry!r}") from e
    return text + (f", D={entry['n_domains']} domains)" if "n_domains" in entry else ")")
