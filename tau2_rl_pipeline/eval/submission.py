"""A tau2-bench leaderboard submission from an evaluation.

It writes `<dir>/submission.json` and `<dir>/trajectories/` (the run's tau2 results files), the layout `tau2 submit
validate <dir>` (tau2-bench 1.0.1) checks.

- Results: pass_1..pass_4 per leaderboard domain (retail, airline, telecom, banking_knowledge with its
  `retrieval_config`), in percent, for every k <= the samples per task, computed by tau2's own submission code
  from the run's results files (its validator compares floats exactly) and checked against the evaluator's pass^k
  (1e-9).
- "custom" with a methodology note when the model was trained on tau2 tasks (the cookbook's SFT/RFT/GRPO train
  on tau2's train split), as the leaderboard asks; the split, the user simulator and the judge are recorded.
- Refused, with a one-line SubmissionError: results graded by pre-1.0 tau2 (26.3), runs with aborted episodes
  (the leaderboard counts infrastructure failures as failures; rerun to retry them), and runs of no leaderboard
  domain. A scripted-user run is written with a note that it is not a leaderboard score.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

LEADERBOARD_DOMAINS = ("retail", "airline", "telecom", "banking_knowledge")
CUSTOM_NOTE = ("Trained on tau2-bench tasks with the tau2 staged RL cookbook (SFT on oracle demonstrations of the "
               "train split, rejection-sampling fine-tuning, GRPO with tau2's own rewards). Agent scaffold: tau2's "
               "agent system prompt and tool schemas, tools called through the model's chat template "
               "(Qwen3 <tool_call>), one policy turn per generate call.")


class SubmissionError(ValueError):
    """The run cannot be submitted as it is; the message says why and what to do."""


def tau2_domain_results(tau2_files: Mapping[str, Path]) -> dict[str, dict[str, Any]]:
    """pass_1..pass_4 (percent) per domain as tau2's own `tau2 submit prepare` computes them from the results files:
    its validator compares them to submission.json exactly, floating-point summation order included."""
    from tau2.data_model.simulation import Results
    from tau2.scripts.leaderboard.prepare_submission import get_metrics

    _, per_domain, _, _ = get_metrics([Results.load(p) for p in tau2_files.values()])
    return {d: r.model_dump(exclude_none=True) for d, r in per_domain.items()}


def check_submittable(version: str, domains: Sequence[str]) -> None:
    """What can be refused before a run: the tau2 that grades it, and whether any domain is on the leaderboard."""
    if version.split(".")[0] != "1":
        raise SubmissionError(f"this run is graded by tau2 {version}; the leaderboard grades with tau2-bench 1.x "
                              "(1.0.1): install it (docs/tau2-versions.md) and evaluate again")
    if not any(d in LEADERBOARD_DOMAINS for d in domains):
        raise SubmissionError(f"none of {', '.join(domains)} is a leaderboard domain "
                              f"({', '.join(LEADERBOARD_DOMAINS)})")


def build_submission(summary: Mapping[str, Any], domain_results: Mapping[str, Mapping[str, Any]], *, model_name: str,
                     model_organization: str, submitting_organization: str, contact_email: str | None,
                     trained_on_tau2: bool, notes: str = "", reference_url: str | None = None,
                     trajectory_files: Mapping[str, str], today: date | None = None) -> dict[str, Any]:
    """The submission.json body (tau2 1.0.1's `Submission` model) for an evaluation's summary, with the pass^k
    values tau2 computes from its results files (`tau2_domain_results`), checked against the evaluator's."""
    settings = summary["settings"]
    version = summary["benchmark"]["tau2_version"]
    check_submittable(version, settings["domains"])
    aborted = summary["episodes"]["aborted"]
    if aborted:
        raise SubmissionError(f"{len(aborted)} episodes aborted (infrastructure failures count as failures on the "
                              "leaderboard): rerun the same command to retry them before submitting")
    domains = [d for d in LEADERBOARD_DOMAINS if d in settings["domains"]]
    results: dict[str, Any] = {}
    for d in domains:
        entry = {k: v for k, v in domain_results[d].items() if k.startswith("pass_") or k == "retrieval_config"}
        ours = summary["metrics"]["domains"][d]["metrics"]
        for key, value in ((k, v) for k, v in entry.items() if k.startswith("pass_")):
            mine = ours[f"pass^{key[5:]}"]["value"] * 100
            if not math.isclose(value, mine, rel_tol=0, abs_tol=1e-9):  # the same episodes, two implementations
                raise SubmissionError(f"{d} {key}: tau2 computes {value} from the results file, the evaluator {mine}")
        results[d] = entry
    scripted = settings["user"] != "llm"
    judge = settings.get("judge")
    parts = [CUSTOM_NOTE] if trained_on_tau2 else []
    parts.append(f"Evaluated with tau2-bench {version} on the {settings['task_split']!r} split"
                 + (f" (tasks {', '.join(settings['task_ids'])})" if settings.get("task_ids") else "")
                 + f", {settings['num_samples'] * settings.get('runs', 1)} trials per task, task-set hash "
                 f"{summary['benchmark']['task_set_hash']}.")
    if judge:
        parts.append(f"NL assertions judged by {judge['model']}.")
    if scripted:
        parts.append("User: the cookbook's offline scripted user, NOT a tau2 user simulator: not a leaderboard score.")
    if notes:
        parts.append(notes)
    omitted = settings["task_split"] != "base" or bool(settings.get("task_ids"))
    submission: dict[str, Any] = {
        "model_name": model_name, "model_organization": model_organization,
        "submitting_organization": submitting_organization, "submission_date": (today or date.today()).isoformat(),
        "submission_type": "custom" if trained_on_tau2 else "standard", "modality": "text",
        "contact_info": {"email": contact_email}, "results": results,
        "trajectories_available": True, "trajectory_files": dict(trajectory_files),
        "methodology": {
            "evaluation_date": (today or date.today()).isoformat(), "tau2_bench_version": version,
            "user_simulator": settings["user_model"], "notes": " ".join(parts),  # scripted: None (as in the files)
            "verification": {"modified_prompts": False, "omitted_questions": omitted,
                             "details": "tau2's own agent system prompt, tool schemas, evaluator and metrics; "
                                        f"split {settings['task_split']!r}"}},
    }
    if reference_url:
        submission["references"] = [{"title": "tau2 staged RL cookbook", "url": reference_url, "type": "github"}]
    return submission


def write_submission(directory: Path, submission: Mapping[str, Any], tau2_files: Mapping[str, Path],
                     write_text: Any) -> Path:
    """`directory/submission.json` and `directory/trajectories/<name>` (copies of the tau2 results files)."""
    trajectories = directory / "trajectories"
    trajectories.mkdir(parents=True, exist_ok=True)
    for domain, name in submission["trajectory_files"].items():
        shutil.copyfile(tau2_files[domain], trajectories / name)
    path = directory / "submission.json"
    write_text(path, json.dumps(submission, indent=2) + "\n")
    return path

def add_submission_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("leaderboard submission", "tau2-bench 1.0.1 (tau2_rl_pipeline/eval/submission.py)", more=True)
    g.add_argument("--submission", type=Path, default=None, metavar="DIR",
                   help="also write a submission directory here (submission.json + trajectories/)")
    g.add_argument("--model-organization", default="unknown", metavar="ORG", help="who developed the model")
    g.add_argument("--submitting-organization", default="unknown", metavar="ORG", help="who ran the evaluation")
    g.add_argument("--contact-email", default=None, metavar="EMAIL", help="contact for the submission")
    g.add_argument("--trained-on-tau2", action=argparse.BooleanOptionalAction, default=True,
                   help="trained on tau2 tasks (as the cookbook's stages are): 'custom', with a methodology note")
    g.add_argument("--submission-notes", default="", metavar="TEXT", help="added to the methodology notes")
    g.add_argument("--submission-reference", default=None, metavar="URL", help="URL of the implementation")


def submit(args: argparse.Namespace, summary: dict[str, Any], paths: dict[str, Any], secrets: Sequence[str]) -> int:
    """The leaderboard submission directory (tau2_rl_pipeline/eval/submission.py); 1 with a one-line error when it is refused."""
    names = {d: p.name for d, p in paths["tau2"].items() if d in summary["settings"]["domains"]}
    try:
        body = build_submission(
            summary, tau2_domain_results({d: paths["tau2"][d] for d in names if d in LEADERBOARD_DOMAINS}),
            model_name=summary["settings"]["model"], model_organization=args.model_organization,
            submitting_organization=args.submitting_organization, contact_email=args.contact_email,
            trained_on_tau2=args.trained_on_tau2, notes=args.submission_notes,
            reference_url=args.submission_reference,
            trajectory_files={d: n for d, n in names.items() if d in LEADERBOARD_DOMAINS})
    except SubmissionError as e:
        print(f"error: no submission written: {e}", file=sys.stderr)
        return 1
    from tau2_rl_pipeline.eval.episodes_file import atomic_write_text

    path = write_submission(args.submission, body, paths["tau2"],
                            lambda p, text: atomic_write_text(p, text, secrets))
    print(f"submission {path} ({body['submission_type']}; check it with `tau2 submit validate {args.submission}`)")
    return 0
