"""The GRPO script's gate: a qualification counts only for the user and tasks the run uses.

The GRPO script's gate (`tau2-rl-qualify-user --check`, scripts/train_grpo.sh): a qualification counts for a run
only if it qualified the very user the run's rewards come from, on the tasks the run trains on.

It compares, in this order, and refuses in one line naming the first field that differs:
- the user kind (GRPO plays tau2's LLM user, never the scripted one);
- TAU2_USER_MODEL, TAU2_USER_API_BASE (the same server however spelt: localhost is 127.0.0.1, a default port
  written out or not, several servers in any order), TAU2_USER_TEMPERATURE, TAU2_USER_STRATEGY (and, for verify
  and reflection, TAU2_USER_STRATEGY_MAX_CHECKS);
- the installed tau2's version;
- the (domain, split) pairs the run trains on (the GRPO task index's rows, or --domains x --task-split when it
  does not exist yet): each must be among the qualification's domains, on its split;
- then the failure rate against the bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tau2_rl_pipeline.benchmark.tau2_version import VERSION
from tau2_rl_pipeline.config import Tau2Config

FORMAT = "tau2_rl_pipeline.qualify_user/1"
CHECKED_STRATEGIES = ("verify", "reflection")  # the strategies whose number of checks changes the user


class QualificationError(ValueError):
    """A qualification summary that cannot be read, or that does not cover the run (the GRPO script's --check)."""


def user_settings(user: str, cfg: Tau2Config) -> dict[str, Any]:
    """What a qualification records of the user configuration it qualified (the gate compares each)."""
    llm = user == "llm"
    checks = cfg.user_strategy_max_checks if llm and cfg.user_strategy in CHECKED_STRATEGIES else None
    return {"user": user, "user_model": cfg.user_model if llm else None,
            "user_api_base": cfg.user_api_base if llm else None,
            "user_temperature": cfg.user_temperature if llm else None,
            "user_strategy": cfg.user_strategy if llm else None, "user_strategy_max_checks": checks}


def run_scope(tasks_file: Path | None, domains: Iterable[str], split: str) -> set[tuple[str, str]]:
    """The (domain, split) pairs a GRPO run trains on: its task index's rows when the file exists, else
    `domains` x `split`."""
    if tasks_file is not None and tasks_file.is_file():
        scope = set()
        for n, line in enumerate(tasks_file.read_text().splitlines(), 1):
            if line.strip():
                try:
                    meta = json.loads(line)["metadata"]
                    scope.add((meta["domain"], meta["split"]))
                except (ValueError, KeyError, TypeError) as e:
                    raise QualificationError(f"{tasks_file}:{n}: not a task index row ({e})") from None
        return scope
    return {(d, split) for d in domains}


LOOPBACK = ("localhost", "127.0.0.1", "::1", "[::1]")


def same_server(url: str) -> str:
    """One spelling of an API base: scheme and host in lower case, a loopback host (localhost, ::1) as 127.0.0.1,
    the scheme's default port written out, no trailing slash."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.hostname:
        return url.strip().rstrip("/")
    host = "127.0.0.1" if parts.hostname.lower() in LOOPBACK else parts.hostname.lower()
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), "")
    return f"{parts.scheme.lower()}://{host}:{port}{parts.path.rstrip('/')}"


def _norm(field: str, value: Any) -> Any:
    if field == "user_api_base":  # several servers, comma-separated: the same set in any order is the same user
        return sorted(same_server(u) for u in (value or "").split(",") if u.strip())
    if field == "user_temperature" and value is not None:
        return float(value)
    return value


def check(summary_path: Path, max_failure_rate: float, cfg: Tau2Config, scope: set[tuple[str, str]]) -> str:
    """The verdict line when the qualification covers this run within the bound; else QualificationError."""
    try:
        summary = json.loads(summary_path.read_text())
        if summary.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} summary")
        settings, overall = summary["settings"], summary["qualification"]["overall"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise QualificationError(f"{summary_path}: not a user-simulator qualification ({e}); run "
                                 "tau2-rl-qualify-user first") from None
    if settings.get("user") != "llm":
        raise QualificationError(f"{summary_path} qualified the {settings.get('user')} user, but GRPO's rollout plays "
                                 f"tau2's LLM user (TAU2_USER_MODEL={cfg.user_model!r}): qualify that one (--user llm)")
    wanted = user_settings("llm", cfg)
    for field, variable in (("user_model", "TAU2_USER_MODEL"), ("user_api_base", "TAU2_USER_API_BASE"),
                            ("user_temperature", "TAU2_USER_TEMPERATURE"), ("user_strategy", "TAU2_USER_STRATEGY"),
                            ("user_strategy_max_checks", "TAU2_USER_STRATEGY_MAX_CHECKS")):
        if field not in settings:
            raise QualificationError(f"{summary_path} records no {field} ({variable}): it predates the full gate; "
                                     "qualify again with tau2-rl-qualify-user")
        if _norm(field, settings[field]) != _norm(field, wanted[field]):
            raise QualificationError(f"{summary_path} qualified {field} {settings[field]!r}, but this run has "
                                     f"{variable}={wanted[field]!r}: qualify the user this run uses")
    qualified_version = (settings.get("benchmark") or {}).get("tau2_version")
    if qualified_version != VERSION:
        raise QualificationError(f"{summary_path} qualified on tau2_version {qualified_version!r}, but tau2 "
                                 f"{VERSION} is installed: qualify again with this tau2")
    covered = {(d, settings.get("task_split")) for d in settings.get("domains") or []}
    missing = sorted(scope - covered)
    if missing:
        pairs = ", ".join(f"{d} ({s} split)" for d, s in missing)
        raise QualificationError(f"{summary_path} qualified domains {sorted(d for d, _ in covered)} on the "
                                 f"{settings.get('task_split')!r} split, but this run trains on {pairs}: qualify "
                                 "those (--domains, --task-split)")
    name = settings["user_model"]
    if overall["value"] is None or overall["value"] > max_failure_rate:
        raise QualificationError(f"user simulator {name!r} fails the oracle agent in {overall['failed']}/"
                                 f"{overall['n_episodes']} episodes ({overall['value']}), above the allowed "
                                 f"{max_failure_rate}: its rewards would punish correct episodes")
    return f"user simulator {name!r} qualified: failure {overall['value']:.3f} <= {max_failure_rate}"
