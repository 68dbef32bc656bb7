"""bench/goodput.py's figures from its runs' records (no cluster): per fault what healed it, the work lost, the time
to training again, and the table, for both launchers; a fault after which the run never trained again is reported
as "never" with how the run ended and the one line that says why."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("goodput_bench", ROOT / "bench" / "goodput.py")
goodput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(goodput)


def ev(event: str, t: float, rollout: int | None = None) -> dict:
    return {"event": event, "time": t, **({} if rollout is None else {"rollout": rollout})}


def trained(first: int, last: int, t0: float) -> list[dict]:
    """Rollouts first..last started and trained a second apart from t0, saved after the odd ones (interval 2)."""
    out = []
    for i, r in enumerate(range(first, last + 1)):
        out += [ev("rollout", t0 + i, r), ev("trained", t0 + i + 0.5, r)]
        if r % 2 == 1:
            out.append(ev("saved", t0 + i + 0.6, r))
    return out


def run(launcher: str, events: list[dict], injected: list[dict], lines: list[tuple[float, str]], ok: bool = True,
        end: str = "job COMPLETED", faults: bool = True, wall_s: float = 100.0) -> dict:
    return {"launcher": launcher, "events": events, "injected": injected, "lines": lines, "ok": ok, "end": end,
            "faults": faults, "wall_s": wall_s, "left": {}, "job_error": None}


# a run cut in rollout 3 (checkpoint 1, rollout 2 trained and lost), requeued, resumed at 2, then a hung engine in
# rollout 6 replaced with no restart, then a killed user simulator in rollout 8 that costs nothing
EVENTS = ([ev("job", 0)] + trained(0, 2, 1) + [ev("rollout", 4, 3), ev("job", 50)] + trained(2, 7, 60)
          + trained(8, 9, 70))
CUT = {"fault": "link cut", "rollout": 3, "time": 4.2}
HUNG = {"fault": "hung engine", "rollout": 6, "time": 64.2, "replaced_after_s": 30.0}
USER = {"fault": "user sim killed", "rollout": 8, "time": 70.2}


def test_a_requeue_by_the_launcher_is_told_from_one_by_slurm() -> None:
    said = [(30.0, "slurm: worker 198.18.0.3 left the Ray cluster during the job (...); requeueing the job "
                   "(restart 1 of at most 5): it resumes from the stage's last checkpoint (after 20 s)")]
    faulted = run("slurm", EVENTS, [{**CUT, "slurm_restarts": 0}, HUNG, USER], said)
    faulted["slurm_states"] = [(0.5, "RUNNING", "0", "n[1-2]"), (31.0, "PENDING", "1", "(null)"),
                               (44.0, "RUNNING", "1", "n[1,3]")]
    rows = goodput.per_fault(faulted)
    cut, hung, user = rows
    assert cut["checkpoint"] == 1 and cut["lost"] == [2] and cut["restarts"] == 1
    assert round(cut["to_training_s"], 1) == 56.3  # the requeued run's first trained rollout, at 60.5
    assert cut["healed_by"].startswith("a requeue by the launcher")
    assert round(cut["running_again_s"], 1) == 39.8 and hung["running_again_s"] is None  # Slurm's part of it
    assert hung["restarts"] == 0 and hung["lost"] == [] and hung["healed_by"].startswith("slime's fault tolerance")
    assert user["healed_by"].startswith("the client's retries")
    # the same run without the launcher's line: Slurm requeued it (a node DOWN)
    assert goodput.per_fault(run("slurm", EVENTS, [CUT], []))[0]["healed_by"].startswith("a requeue by Slurm")
    # on the hosts tier the restart is the supervisor's
    hosts = goodput.per_fault(run("hosts", EVENTS, [CUT], [(30.0, "train_grpo.sh: restart 1 of 5: ...")]))[0]
    assert hosts["healed_by"] == "a restart by the MAX_RESTARTS supervisor"


def test_a_fault_never_healed_says_how_the_run_ended_and_why() -> None:
    events = [ev("job", 0)] + trained(0, 2, 1) + [ev("rollout", 4, 3)]
    lines = [(10.0, "slurm: error: Slurm did not requeue job 3 within 300 s of scontrol requeue"),
             (11.0, "slurm: got signal 15 (job 3, restart 1): stopping the stage and Ray"),
             (12.0, "srun: error: t2h1s1-h2: task 0: Killed")]  # Slurm's own, at every teardown
    faulted = run("slurm", events, [{"fault": "head's Ray killed", "rollout": 3, "time": 4.2}], lines, ok=False,
                  end="job FAILED (Slurm's Restarts 1, ExitCode 1:0)")
    row = goodput.per_fault(faulted)[0]
    assert row["to_training_s"] is None and row["lost"] == []
    assert row["healed_by"] == ("never: job FAILED (Slurm's Restarts 1, ExitCode 1:0); slurm: error: Slurm did not "
                                "requeue job 3 within 300 s of scontrol requeue")
    table = goodput.report(run("slurm", trained(0, 5, 1), [], [], faults=False, wall_s=50.0), faulted, 6, 2)
    assert "| head's Ray killed | 3 | 1 | 0  | never | 0 | never: job FAILED" in table
    assert "wall-time ratio, faulted / fault-free: 2.00 (the faulted run did not end by itself" in table
    assert "  slurm: error: Slurm did not requeue job 3" in table


def test_the_table_has_a_row_per_fault_with_its_figures() -> None:
    clean = run("slurm", [ev("job", 0)] + trained(0, 9, 1), [], [], faults=False, wall_s=40.0)
    faulted = run("slurm", EVENTS, [CUT, HUNG, USER], [], wall_s=100.0)
    table = goodput.report(clean, faulted, 10, 2)
    assert "launcher: slurm" in table
    assert "fault-free: job COMPLETED, 40 s, 10 of 10 rollouts trained (0 trained again after a restart), 1 job" in table
    assert "faulted: job COMPLETED, 100 s, 10 of 10 rollouts trained (1 trained again after a restart), 2 job" in table
    assert "wall-time ratio, faulted / fault-free: 2.50\n" in table
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| fault ")]
    assert [r.split(" | ")[0] for r in rows] == ["| link cut", "| hung engine", "| user sim killed"]
    assert rows[0].startswith("| link cut | 3 | 1 | 1 [2] | 56 s | 1 | a requeue by Slurm")
    faulted["slurm_states"] = [(2.0, "RUNNING", "0", "n[1-2]", {"n1": "alloc", "n2": "alloc", "n3": "idle"}),
                               (44.0, "RUNNING", "1", "n[1,3]", {"n1": "alloc", "n2": "down*", "n3": "alloc"})]
    table = goodput.report(clean, faulted, 10, 2)
    assert "| link cut | 3 | 1 | 1 [2] | 56 s (the job running again after 40 s) | 1 |" in table
    assert table.endswith("      0 s RUNNING 0 n[1-2]; n1 alloc n2 alloc n3 idle\n"
                          "     42 s RUNNING 1 n[1,3]; n1 alloc n2 down* n3 alloc")
    assert "(a new engine in its slot after 30 s) | 0 | slime's fault tolerance" in rows[1]
