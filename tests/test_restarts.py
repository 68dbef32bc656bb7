"""MAX_RESTARTS on a hostfile cluster (tau2_rl_pipeline/cluster/restarts.py, scripts/cluster_watch.sh): the
supervisor's pure decisions, the supervisor itself around a stand-in stage and a stand-in ssh, the stage script's
exit status on a watch verdict, and the dry run's hook. On separate hosts with a worker's link cut and restored:
tests/contract/test_hosts_restarts.py (the hosts tier)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_cluster_scripts import HEAD_HERE, MASTER, NETWORK, fake_cluster_tools, free_port, hostfile, one_line_error
from test_scripts import ROOT, run_script

from tau2_rl_pipeline.cluster.restarts import NODE_LOST, after_run, due, host_problem, waiting_line

FAULT = "worker 10.0.0.2 left the Ray cluster during the job (Ray marked its node dead: health check failed)"


# ---- the decisions ----------------------------------------------------------------------------------------------
def test_success_is_done_and_the_stages_own_error_is_never_restarted() -> None:
    assert after_run(0, 0, 2, None).action == "done"
    for status in (1, 2, 130, 137):
        assert after_run(status, 0, 2, "cluster check failed: ...") == after_run(status, 0, 2, None)
        assert after_run(status, 0, 2, None).action == "stop" and after_run(status, 0, 2, None).line is None


def test_a_node_fault_is_restarted_n_times_then_stops_with_one_line() -> None:
    first = after_run(NODE_LOST, 0, 2, FAULT)
    assert first.action == "restart" and first.line.startswith(f"restart 1 of 2: {FAULT}; waiting for every host")
    assert after_run(NODE_LOST, 1, 2, FAULT).line.startswith("restart 2 of 2: ")
    last = after_run(NODE_LOST, 2, 2, FAULT)
    assert last.action == "stop" and last.line == (f"{FAULT}; not restarting: all MAX_RESTARTS=2 restart(s) used (run "
                                                   "the same command again to resume from its last checkpoint)")
    assert after_run(NODE_LOST, 0, 0, None).action == "stop"


def test_a_host_is_ready_once_ssh_answers_with_ray_there_and_none_running() -> None:
    assert host_problem(0, "", "") is None
    assert host_problem(255, "", "warning: x\nssh: connect to host 10.0.0.2 port 22: No route to host\n") == (
        "no ssh (ssh: connect to host 10.0.0.2 port 22: No route to host)")
    assert host_problem(255, "", "") == "no ssh (exit 255)"
    assert host_problem(0, "ray-running\n", "").startswith("its Ray from the run before is still running")
    assert host_problem(0, "no-ray\n", "") == "ray is not on its PATH over ssh"


def test_the_wait_says_one_line_a_minute_naming_each_host() -> None:
    assert due(0.0, None) and not due(59.0, 0.0) and due(60.0, 0.0) and not due(100.0, 60.0)
    assert waiting_line({"10.0.0.2": "no ssh (timed out)", "10.0.0.3": "its Ray ..."}, 125.0, 1800.0) == (
        "waiting for 10.0.0.2: no ssh (timed out); 10.0.0.3: its Ray ... (2 of 30 min)")


# ---- the supervisor around a stand-in stage -----------------------------------------------------------------------
STAGE = """#!/bin/bash
# a stage that is stopped by a node fault on its first FAULTS runs, then succeeds
n=$(( $(cat "$RUNS" 2>/dev/null || echo 0) + 1 )); echo "$n" >"$RUNS"
echo "run $n STAGE_RESTARTS=${STAGE_RESTARTS}" >>"$LOG"
if ((n <= FAULTS)); then
  echo "train_grpo.sh: error: %s; the job is stopped: run the same command again to resume from its last checkpoint" >&2
  exit "${STATUS:-75}"
fi
echo "stage done" >&2
"""
SSH = """#!/bin/bash
# ssh refused for the first DOWN probes (a cut link), then a host with ray and no raylet
n=$(( $(cat "$PROBES" 2>/dev/null || echo 0) + 1 )); echo "$n" >"$PROBES"
if ((n <= DOWN)); then echo "ssh: connect to host $1 port 22: No route to host" >&2; exit 255; fi
exit 0
"""


def supervise(tmp_path: Path, *, faults: int, down: int, max_restarts: int = 2, status: int = NODE_LOST,
              wait_timeout: float = 30.0) -> tuple[subprocess.CompletedProcess, list[str]]:
    for name, text in (("stage", STAGE % FAULT), ("ssh", SSH)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "RUNS": str(tmp_path / "runs"), "LOG": str(tmp_path / "log"),
           "PROBES": str(tmp_path / "probes"), "FAULTS": str(faults), "DOWN": str(down), "STATUS": str(status),
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "tau2_rl_pipeline.cluster.restarts", "--prog", "train_grpo.sh", "--max-restarts",
         str(max_restarts), "--wait-timeout", str(wait_timeout), "--workers", "10.0.0.2", "--ssh",
         str(tmp_path / "ssh"), "--head", f"127.0.0.1:{free_port()}", "--dashboard-port", str(free_port()),
         "--poll", "0.2", "--", str(tmp_path / "stage")],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    log = (tmp_path / "log").read_text().splitlines() if (tmp_path / "log").exists() else []
    return proc, log


def test_a_node_fault_waits_for_the_host_and_reruns_the_stage(tmp_path: Path) -> None:
    proc, runs = supervise(tmp_path, faults=1, down=3)
    assert proc.returncode == 0, proc.stderr
    assert runs == ["run 1 STAGE_RESTARTS=0", "run 2 STAGE_RESTARTS=1"]
    mine = [line for line in proc.stderr.splitlines() if not line.startswith("train_grpo.sh: error: worker")]
    assert mine == [f"train_grpo.sh: restart 1 of 2: {FAULT}; waiting for every host to answer ssh and hold no Ray, "
                    "then rerunning from the last checkpoint",
                    "train_grpo.sh: waiting for 10.0.0.2: no ssh (ssh: connect to host 10.0.0.2 port 22: No route to "
                    "host) (0 of 0 min)",
                    "stage done"]


def test_past_max_restarts_it_stops_with_the_stages_status_and_one_line(tmp_path: Path) -> None:
    proc, runs = supervise(tmp_path, faults=5, down=0, max_restarts=2)
    assert proc.returncode == NODE_LOST and len(runs) == 3
    lines = proc.stderr.strip().splitlines()
    assert [line.split(":")[1] for line in lines if line.startswith("train_grpo.sh: restart ")] == [
        " restart 1 of 2", " restart 2 of 2"]
    assert lines[-1] == (f"train_grpo.sh: error: {FAULT}; not restarting: all MAX_RESTARTS=2 restart(s) used (run the "
                         "same command again to resume from its last checkpoint)")


def test_the_stages_own_error_is_not_retried(tmp_path: Path) -> None:
    proc, runs = supervise(tmp_path, faults=1, down=0, status=1)
    assert proc.returncode == 1 and runs == ["run 1 STAGE_RESTARTS=0"]
    assert [line for line in proc.stderr.splitlines() if ": error: " in line] == [proc.stderr.strip()]


def test_a_host_that_does_not_come_back_stops_the_wait_with_one_line(tmp_path: Path) -> None:
    proc, runs = supervise(tmp_path, faults=1, down=1000, wait_timeout=1.0)
    assert proc.returncode == NODE_LOST and len(runs) == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "train_grpo.sh: error: not restarting: 10.0.0.2: no ssh (ssh: connect to host 10.0.0.2 port 22: No route to "
        "host) after RESTART_WAIT_TIMEOUT=1 s (run the same command again once they are back)")


# ---- the scripts' side ---------------------------------------------------------------------------------------------
FAKE_WATCH = """#!/bin/bash
# PYTHON: the cluster watch says a worker was lost; anything else is the job
if [[ "$2" == tau2_rl_pipeline.cluster.watch ]]; then
  echo "cluster watch: worker 127.0.0.5 left the Ray cluster during the job (Ray marked its node dead: test)"; exit 3
fi
exec sleep 60
"""


def test_a_watch_verdict_ends_the_stage_with_the_node_lost_status(tmp_path: Path) -> None:
    bindir = fake_cluster_tools(tmp_path)
    (bindir / "python").write_text(FAKE_WATCH)
    (bindir / "python").chmod(0o755)
    # the watch the plan names on a cluster the script starts (launch/stages.py's WATCH_CMD)
    driver = ('source "$1/scripts/common.sh"; WATCH_CMD=(python -m tau2_rl_pipeline.cluster.watch); '
              'LOG_DIR="${HOME}/logs"; watched_job python job')
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "TAU2_OUT_DIR": str(tmp_path / "out"),
           "SLIME_DIR": str(tmp_path), "HOSTFILE": hostfile(tmp_path, "127.0.0.5"), "PYTHON": str(bindir / "python"),
           **HEAD_HERE}
    proc = subprocess.run(["bash", "-c", driver, "train_grpo.sh", str(ROOT)], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == NODE_LOST, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "train_grpo.sh: error: worker 127.0.0.5 left the Ray cluster during the job (Ray marked its node dead: test); "
        "the job is stopped: run the same command again to resume from its last checkpoint")


@pytest.mark.parametrize("script", ["train_grpo.sh", "train_sft.sh", "train_rft.sh"])
def test_the_dry_run_shows_the_stage_rerun_under_the_supervisor(tmp_path: Path, script: str) -> None:
    result = run_script(script, tmp_path, HOSTFILE=hostfile(tmp_path, MASTER, "10.0.0.2 slots=8"), MAX_RESTARTS="2",
                        RESTART_WAIT_TIMEOUT="600", **NETWORK)
    assert result.rc == 0, result.text
    (cmd,) = [c for c in result.commands if "tau2_rl_pipeline.cluster.restarts" in c]
    argv = cmd[cmd.index("tau2_rl_pipeline.cluster.restarts") + 1:]
    assert argv[:argv.index("--")] == ["--prog", script, "--max-restarts", "2", "--wait-timeout", "600",
                                       "--workers", "10.0.0.2", "--ssh", "ssh -o BatchMode=yes -o ConnectTimeout=10",
                                       "--head", f"{MASTER}:6379", "--dashboard-port", "8265"]
    assert argv[argv.index("--") + 1:] == ["bash", str(ROOT / "scripts" / script)]
    assert not [c for c in run_script(script, tmp_path, **NETWORK, MAX_RESTARTS="0",
                                      HOSTFILE=hostfile(tmp_path, MASTER, "10.0.0.2 slots=8")).commands
                if "tau2_rl_pipeline.cluster.restarts" in c]


@pytest.mark.parametrize(("env", "says"), [
    ({"MAX_RESTARTS": "two"}, "MAX_RESTARTS=two must be a whole number of restarts (0: off)"),
    ({"MAX_RESTARTS": "1", "RESTART_WAIT_TIMEOUT": "0"}, "RESTART_WAIT_TIMEOUT=0 must be a positive integer"),
    ({"MAX_RESTARTS": "1", "RAY_ADDRESS": "http://10.0.0.1:8265", "NUM_NODES": "2", "GPUS_PER_NODE": "4"},
     "MAX_RESTARTS=1 restarts a stage on a cluster the scripts start (HOSTFILE)"),
])
def test_bad_restart_settings_are_one_line(tmp_path: Path, env: dict[str, str], says: str) -> None:
    assert says in one_line_error(run_script("train_grpo.sh", tmp_path, **NETWORK, **env))


def test_a_stop_asked_of_the_supervisor_stops_the_stage_and_restarts_nothing(tmp_path: Path) -> None:
    """SIGTERM to the supervisor while the stage runs: the stage gets it, its trap's last words still come through,
    and the supervisor ends with the stage's status, no restart."""
    stage = tmp_path / "stage"
    stage.write_text("#!/bin/bash\ntrap 'kill $! 2>/dev/null; echo \"stage: stopped cleanly\" >&2; exit 143' TERM\n"
                     "echo started >&2\nsleep 60 & wait\n")  # its trap stops its sleep: stderr closes at once
    stage.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tau2_rl_pipeline.cluster.restarts", "--prog", "train_grpo.sh", "--max-restarts", "2",
         "--wait-timeout", "30", "--workers", "10.0.0.2", "--ssh", "false", "--head", f"127.0.0.1:{free_port()}",
         "--dashboard-port", str(free_port()), "--", str(stage)],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    assert proc.stderr.readline().strip() == "started"
    proc.terminate()
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 143 and rest.strip() == "stage: stopped cleanly"
