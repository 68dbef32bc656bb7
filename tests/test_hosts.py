"""The namespaced hosts of tests/support/hosts.py: separate as machines are, and gone after teardown.

Each host has only its own address (a foreign one does not bind: errno 99, as on another machine), reaches the others
over the bridge, answers ssh with the run's key and lands the session in its own namespaces (hostname, process
table, /tmp), and sees the shared directory at the same path. This machine's own network is untouched, and teardown
leaves no process, namespace or file. Skipped in one line where namespaces cannot be made (not root).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from support import hosts as hosts_mod

WHY_NOT = hosts_mod.unavailable()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"namespaced hosts skipped: {WHY_NOT}")

BIND = "import socket, sys; socket.socket().bind((sys.argv[1], 0))"
ROOT = Path(__file__).resolve().parents[1]


def test_what_lies_under_a_hosts_own_directories_is_bound_there_once_outer_first(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / ".venv/bin").mkdir(parents=True)
    assert hosts_mod.under_covered([clone / ".venv", Path("/usr"), clone, Path("/tmp"), tmp_path / "absent"]) == \
        ([clone.resolve()] if clone.resolve().is_relative_to("/tmp") else [])
    assert hosts_mod.under_covered([Path("/dev/shm")]) == []  # the covered directory itself is the host's own


def own_network() -> str:
    return subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout + \
        subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout


@needs_namespaces
def test_hosts_are_separate_and_leave_nothing_behind(tmp_path: Path) -> None:
    import sys

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("same on every host")
    before = own_network()
    hosts = hosts_mod.Hosts(3, shared, run_id=f"t2h{__import__('os').getpid()}t")
    hosts.up()
    try:
        a, b, c = hosts.hosts
        assert hosts.addresses == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
        assert own_network() == before  # no address, route or interface added here
        assert "198.18" not in before
        for host in hosts.hosts:
            out = host.run(["sh", "-c", "hostname -I; cat " + str(shared / "data.txt") + "; echo; ls /tmp"],
                           capture_output=True, text=True, check=True).stdout.split("\n")
            assert out[0].split() == [host.address] and out[1] == "same on every host"
            # its own /tmp: empty but for the ways to the mount points of the shared directory and of the code the
            # hosts run (this repository, its venv: a clone under /tmp), where those lie under /tmp
            ways = {path.relative_to("/tmp").parts[0] for path in hosts.visible if path.is_relative_to("/tmp")}
            assert sorted(" ".join(out[2:]).split()) == sorted(ways)  # ls: one a line
        # the code the hosts run, at its own path on every host, wherever this checkout and its venv lie (/tmp too)
        for host in hosts.hosts:
            ran = host.run([sys.executable, "-c", "import support.hosts, sys; print(support.hosts.__file__)"],
                           capture_output=True, text=True, check=False, env={"PYTHONPATH": str(ROOT / "tests")})
            assert ran.returncode == 0 and ran.stdout.strip() == str(ROOT / "tests/support/hosts.py"), ran.stderr
        bound = a.run([sys.executable, "-c", BIND, b.address], capture_output=True, text=True, check=False)
        assert bound.returncode != 0 and "[Errno 99] Cannot assign requested address" in bound.stderr
        assert a.run([sys.executable, "-c", BIND, a.address], check=False).returncode == 0
        # ssh from host 0 lands in host 2's namespaces: its hostname, address and process table (sshd is its PID 1)
        seen = a.run(["ssh", "-F", str(hosts.ssh_config), "-o", "BatchMode=yes", c.address,
                      "hostname; hostname -I; ps -o comm= -p 1; echo $PATH"], capture_output=True, text=True,
                     check=True).stdout.split("\n")
        assert seen[0] == f"{hosts.run_id}-h2" and seen[1].split() == [c.address] and seen[2] == "sshd"
        stranger = a.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
                          "UserKnownHostsFile=/dev/null", "-i", "/dev/null", c.address, "true"], capture_output=True,
                         text=True, check=False)
        assert stranger.returncode == 255  # without the run's key: refused
        sleeper = b.popen(["sleep", "600"])
        assert len(hosts.leftovers()[b.netns]) >= 2  # its sshd and the sleeper
    finally:
        hosts.down()
    sleeper.wait(timeout=30)
    assert hosts.leftovers() == {h.netns: [] for h in hosts.hosts}
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert hosts.run_id not in names and not hosts.base.exists() and own_network() == before
    assert (shared / "data.txt").read_text() == "same on every host"  # the shared directory itself is kept


@needs_namespaces
def test_a_run_whose_owner_died_is_swept(tmp_path: Path) -> None:
    import sys

    script = ("import sys, os; from support.hosts import Hosts; "
              "h = Hosts(1, sys.argv[1]).up(); print(h.run_id, flush=True); os._exit(0)")  # no teardown
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    run_id = proc.stdout.strip()
    assert (hosts_mod.RUNS_DIR / run_id).exists()
    assert run_id in hosts_mod.sweep()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert run_id not in names and not (hosts_mod.RUNS_DIR / run_id).exists()


def test_the_loopback_server_binds_only_loopback_or_a_namespaced_hosts_address(capsys) -> None:
    """It has no authentication: a test host's address (198.18.0.0/15, reachable only between the namespaced hosts)
    is allowed besides loopback; any other address is refused in one line before anything loads."""
    from support.loopback_server import main, serves_only_tests

    assert serves_only_tests("127.0.0.1") and serves_only_tests("198.18.0.3") and serves_only_tests("198.19.255.1")
    assert not serves_only_tests("10.0.0.1") and not serves_only_tests("0.0.0.0") and not serves_only_tests("host")
    with pytest.raises(SystemExit) as stopped:
        main(["--model", "/nonexistent", "--host", "0.0.0.0"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith("error: --host 0.0.0.0: only loopback or a namespaced test host's")


@needs_namespaces
def test_the_documented_commands_start_use_and_remove_hosts(tmp_path: Path) -> None:
    """docs/multi-node.md's `up`, `exec` and `down`, as typed there."""
    import sys

    cli = [sys.executable, "-m", "support.hosts"]
    up = subprocess.run([*cli, "up", "--hosts", "2", "--shared", str(tmp_path)], capture_output=True, text=True,
                        check=True, timeout=120)
    run_id = up.stdout.split()[1]
    try:
        assert f"exec {run_id} 0 -- bash" in up.stdout and "RAY_SSH='ssh -F /var/tmp/" in up.stdout
        seen = subprocess.run([*cli, "exec", run_id, "1", "--", "hostname", "-I"], capture_output=True, text=True,
                              check=True, timeout=60)
        assert seen.stdout.split() == ["198.18.0.2"]
    finally:
        subprocess.run([*cli, "down", run_id], check=True, timeout=120)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert run_id not in names and not (hosts_mod.RUNS_DIR / run_id).exists()


@needs_namespaces
def test_the_faults_one_machine_of_a_cluster_meets(tmp_path: Path) -> None:
    """What tests/contract/test_hosts_faults.py does to a host, each seen from the others and undone."""
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("shared")
    hosts = hosts_mod.Hosts(2, shared, run_id=f"t2h{os.getpid()}f")
    hosts.up()
    try:
        a, b = hosts.hosts

        def ssh(*argv: str) -> subprocess.CompletedProcess:
            return a.run(["ssh", "-F", str(hosts.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=3",
                          b.address, *argv], capture_output=True, text=True, check=False)

        hosts.set_link(1, up=False)
        cut = ssh("true")
        # nothing answers: no refusal; the connect times out, or the failed neighbour lookup says no route
        assert cut.returncode == 255 and ("timed out" in cut.stderr or "No route to host" in cut.stderr), cut.stderr
        hosts.set_link(1, up=True)
        assert ssh("true").returncode == 0  # at once: no "No route to host" left from the failed lookups
        hosts.refuse_ssh(1, refused=True)
        refused = ssh("true")
        assert refused.returncode == 255 and "Permission denied" in refused.stderr
        hosts.refuse_ssh(1, refused=False)
        hosts.hide_shared(1, hidden=True)
        assert ssh("ls", "-A", str(shared)).stdout == "" and "data.txt" in a.run(
            ["ls", str(shared)], capture_output=True, text=True).stdout
        hosts.hide_shared(1, hidden=False)
        assert ssh("cat", str(shared / "data.txt")).stdout == "shared"
        hosts.rename_interface(1, "eth0", "ens5")
        renamed = ssh("ls /sys/class/net; hostname -I")
        assert renamed.stdout.split() == ["ens5", "lo", b.address]  # its address stays, on the new name
        hosts.rename_interface(1, "ens5", "eth0")
        long_name = "a-long-argument-" + "x" * 200  # listed whole, as ps lists it without a terminal only with -ww
        sleeper = b.popen(["sh", "-c", f"sleep 600; : {long_name}"])
        deadline = time.monotonic() + 30
        while not any(p == "sleep 600" for p in hosts.processes(1)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"sh -c sleep 600; : {long_name}" in hosts.processes(1), hosts.processes(1)
        assert [line.split()[1] for line in hosts.kill(1, "sleep")] == ["sleep"]
        sleeper.wait(timeout=30)
        assert not [p for p in hosts.processes(1) if p.startswith("sleep")]
    finally:
        hosts.down()
    assert hosts.leftovers() == {h.netns: [] for h in hosts.hosts}
