"""Separate hosts on one machine: the multi-node path run as on a cluster, without one.

Each host is a set of Linux namespaces: its own network namespace with one interface, `eth0`, holding its own address
(198.18.0.1, .2, ... of 198.18.0.0/15, the range RFC 2544 reserves for benchmarking: never this machine's own, never
routed), its own PID namespace (so `ray stop` on a host stops that host's Ray only), its own hostname, and its own
mount namespace in which /tmp, /dev/shm and /run are its own and the run's shared directory (checkpoints, data,
models) is bind-mounted at the same path, as on nodes that mount shared storage. The code the hosts run (this
repository, its Python environment and interpreter, the pinned sources beside it) is seen at the same path too, as
on a cluster's image: where any of it lies under a host's own /tmp, /dev/shm or /run (a clone under /tmp), it is
bind-mounted there like the shared directory. Each host runs its own sshd on its
own address, with a host key and a client key made for the run; ssh from one host to another lands in the other's
namespaces. The hosts' interfaces are veth pairs into one bridge that lives in a namespace of its own: nothing is
added to this machine's own network namespace, no address, no route, no interface.

    python -m support.hosts up --hosts 3 --shared /data/run1   # prints how to use them
    python -m support.hosts exec t2h1234 0 -- bash             # a shell on host 0 (the head)
    python -m support.hosts down t2h1234

Everything of a run is named after it (`t2h<pid>`, namespaces `t2h<pid>-h0`..., `t2h<pid>-sw`, files under
/var/tmp/t2h<pid>), so concurrent runs never meet. Teardown kills every process in each host's network namespace,
deletes the namespaces (their veths and the bridge go with them) and the run's files; a run whose owner died without
tearing down is swept by the next `up`. Needs root (namespaces), iproute2, util-linux (unshare, nsenter) and
openssh-server; `unavailable()` says in one line what is missing.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

COVERED = ("/tmp", "/dev/shm", "/run")  # each host's own (mount_script): what lies under them is not seen there
SUBNET = "198.18.0"  # hosts are SUBNET.1, .2, ...: each run has its own bridge, so runs never see each other
RUNS_DIR = Path("/var/tmp")
SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen")


def unavailable() -> str | None:
    """Why hosts cannot be made here (one line), or None."""
    if os.geteuid() != 0:
        return "namespaced hosts need root (network, mount and PID namespaces)"
    missing = [t for t in TOOLS if shutil.which(t) is None] + ([SSHD] if not os.access(SSHD, os.X_OK) else [])
    if missing:
        return f"namespaced hosts need {', '.join(missing)} (iproute2, util-linux, openssh-server)"
    probe = f"t2hprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"cannot make a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _sh(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)}: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def code_paths() -> list[Path]:
    """What the hosts run, by path: this repository (its scripts and package), the Python environment and the
    interpreter it runs on, and the pinned upstream sources (tests/third_party.py)."""
    from third_party import REPO_ROOT, third_party_path

    return [REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent,
            third_party_path()]


def under_covered(paths: list[Path]) -> list[Path]:
    """Those of `paths` (resolved) that a host would not see (they lie under a directory each host has its own of),
    each once and none inside another, outer first: what a host must have bind-mounted to see them."""
    covered = sorted({p.resolve() for p in paths if p.exists()
                      and any(p.resolve().is_relative_to(c) and p.resolve() != Path(c) for c in COVERED)},
                     key=lambda p: len(p.parts))
    return [p for i, p in enumerate(covered) if not any(p.is_relative_to(q) for q in covered[:i])]


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def netns_pids(name: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


@dataclass
class Host:
    index: int
    address: str
    netns: str
    init_pid: int  # the host's PID 1 (its sshd), as this machine's PID namespace numbers it

    def command(self, argv: list[str]) -> list[str]:
        """argv run inside this host: its network, mount, hostname and PID namespaces."""
        return ["nsenter", "-t", str(self.init_pid), "-n", "-m", "-u", "-p", "--", *argv]

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(argv), check=kwargs.pop("check", False), **kwargs)

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(argv), **kwargs)

    def pids(self) -> list[int]:
        """Every process in this host (its network namespace), as this machine numbers them."""
        return netns_pids(self.netns)


class Hosts:
    """N namespaced hosts; host 0 is the one a stage script would run on (the head). `down()` is idempotent."""

    def __init__(self, n: int, shared: str | Path, *, session_env: dict[str, str] | None = None,
                 run_id: str | None = None, owned: bool = True) -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"hosts: 1 to 250, not {n}")
        self.run_id = run_id or f"t2h{os.getpid()}"
        self.base = RUNS_DIR / self.run_id
        self.shared = Path(shared).resolve()
        # the shared directory always (it may lie under /tmp, and it is the one path a fault hides), then the code
        self.visible = [self.shared] + [p for p in under_covered(code_paths()) if not self.shared.is_relative_to(p)
                                        and not p.is_relative_to(self.shared)]
        self.switch = f"{self.run_id}-sw"
        # Ray's memory monitor reads the whole machine's memory, which every host shares: under other jobs' load it
        # killed a host's workers for memory the run did not use. Off in every session on the hosts.
        self.session_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "RAY_memory_monitor_refresh_ms": "0",
                            **(session_env or {})}
        self.hosts: list[Host] = []
        self._procs: list[subprocess.Popen] = []
        self._n = n
        self._owned = owned

    # ---- paths and names ---------------------------------------------------------------------------------------
    @property
    def ssh_config(self) -> Path:
        return self.base / "ssh" / "config"

    @property
    def ray_ssh(self) -> str:
        """RAY_SSH for the stage scripts: their ssh, with this run's keys."""
        return f"ssh -F {self.ssh_config} -o BatchMode=yes -o ConnectTimeout=10"

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    def host_of(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    # ---- up -------------------------------------------------------------------------------------------------------
    def up(self) -> Hosts:
        sweep()
        if self.base.exists():
            raise RuntimeError(f"{self.base} exists: hosts {self.run_id} are up already (down them first)")
        try:
            self._files()
            self._network()
            for i in range(self._n):
                self.hosts.append(self._start(i))
            self._save()
            self._wait_sshd()
        except BaseException:
            self.down()
            raise
        if self._owned:
            atexit.register(self.down)
        return self

    def _files(self) -> None:
        ssh = self.base / "ssh"
        ssh.mkdir(parents=True)
        self.base.chmod(0o755)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.run_id, "-f", str(ssh / "host_key"))
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.run_id, "-f", str(ssh / "id_ed25519"))
        host_key = (ssh / "host_key.pub").read_text().split()[:2]
        (ssh / "known_hosts").write_text("".join(f"{SUBNET}.{i + 1} {' '.join(host_key)}\n" for i in range(self._n)))
        self.ssh_config.write_text(
            f"Host {SUBNET}.*\n  User root\n  IdentityFile {ssh / 'id_ed25519'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {ssh / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
        setenv = " ".join('"{}"'.format(f"{k}={v}".replace("\\", "\\\\").replace('"', '\\"'))
                          for k, v in self.session_env.items())
        for i in range(self._n):
            d = self.base / f"h{i}"
            for sub in ("tmp", *(f"stage{k}" for k in range(len(self.visible)))):
                (d / sub).mkdir(parents=True)
            (d / "tmp").chmod(0o1777)
            (d / "authorized_keys").write_text((ssh / "id_ed25519.pub").read_text())  # its own: refuse_ssh
            (d / "sshd_config").write_text(
                f"ListenAddress {SUBNET}.{i + 1}\nPort 22\nHostKey {ssh / 'host_key'}\nPidFile none\n"
                f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                f"PrintMotd no\nSubsystem sftp internal-sftp\nSetEnv {setenv}\n")

    def _network(self) -> None:
        _sh("ip", "netns", "add", self.switch)
        _sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i in range(self._n):
            ns = f"{self.run_id}-h{i}"
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", self.switch, "link", "add", f"h{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "-n", self.switch, "link", "set", f"h{i}", "master", "br0", "up")
            _sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

    def mount_script(self, i: int) -> str:
        """What host i's mount namespace gets before its sshd starts: its own /tmp, /dev/shm and /run; the shared
        directory and the code under those at their own paths (staged first: each may lie under what they cover)."""
        d = self.base / f"h{i}"
        paths = [(shlex.quote(str(path)), d / f"stage{k}") for k, path in enumerate(self.visible)]
        return "; ".join([
            "set -e",
            *(f"mount --bind {path} {stage}" for path, stage in paths),
            f"mount --bind {d / 'tmp'} /tmp",
            "mount -t tmpfs -o size=2g tmpfs /dev/shm",
            "mount -t tmpfs -o size=64m tmpfs /run",
            "mkdir -p /run/sshd",
            *(f"mkdir -p {path}; mount --bind {stage} {path}; umount {stage}" for path, stage in paths),
            *self.host_setup(i),
            f"hostname {self.run_id}-h{i}",
            f"exec {SSHD} -D -e -f {d / 'sshd_config'}",
        ])

    def host_setup(self, i: int) -> list[str]:
        """More shell lines for host i's mount namespace, before its sshd starts (a subclass's: support/slurm.py)."""
        return []

    def holder(self, i: int) -> list[str]:
        """What `ip netns exec` runs for host i: the namespaces' first process, which becomes its sshd."""
        return ["unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc", "--propagation", "private",
                "sh", "-c", self.mount_script(i)]

    def _start(self, i: int) -> Host:
        ns = f"{self.run_id}-h{i}"
        log = open(self.base / f"h{i}" / "sshd.log", "wb")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *self.holder(i)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self._procs.append(proc)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            kids = children.read_text().split() if children.exists() else []
            if init := next((int(k) for k in kids if _pid_ns(int(k)) not in (None, _pid_ns(proc.pid))), None):
                return Host(i, f"{SUBNET}.{i + 1}", ns, init)  # the child in a PID namespace of its own
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"host {i} did not start: {(self.base / f'h{i}' / 'sshd.log').read_text()[-500:]}")

    def _wait_sshd(self) -> None:
        """Every host answers ssh from the head (its own sshd, in its own namespaces)."""
        deadline = time.monotonic() + 60
        for host in self.hosts:
            while True:
                proc = self.hosts[0].run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", host.address,
                                          "hostname"], capture_output=True, text=True, check=False)
                if proc.returncode == 0 and proc.stdout.strip() == f"{self.run_id}-h{host.index}":
                    break
                if time.monotonic() > deadline:
                    log = (self.base / f"h{host.index}" / "sshd.log").read_text()[-500:]
                    raise RuntimeError(f"host {host.address}: no ssh ({proc.stderr.strip()}; sshd: {log})")
                time.sleep(0.2)

    def _save(self) -> None:
        state = {"owner": os.getpid() if self._owned else None, "shared": str(self.shared),
                 "hosts": [[h.index, h.address, h.netns, h.init_pid] for h in self.hosts]}
        (self.base / "state.json").write_text(json.dumps(state))

    @classmethod
    def attach(cls, run_id: str) -> Hosts:
        """The hosts of a run started elsewhere (the CLI's `up`)."""
        state = json.loads((RUNS_DIR / run_id / "state.json").read_text())
        hosts = cls(len(state["hosts"]), state["shared"], run_id=run_id, owned=False)
        hosts.hosts = [Host(*row) for row in state["hosts"]]
        return hosts

    # ---- faults, as they happen to one machine of a cluster ----------------------------------------------------
    def set_link(self, i: int, up: bool, interface: str = "eth0") -> None:
        """Host i's network link down (a cut cable, a dead switch port: packets vanish, nothing is refused) or up.
        Up, every host forgets the neighbours it failed to find meanwhile (else the kernel answers "No route to host"
        for a while after, until its failed ARP entries expire), as a repaired link is reached at once."""
        _sh("ip", "-n", self.hosts[i].netns, "link", "set", interface, "up" if up else "down")
        if up:
            for host in self.hosts:
                _sh("ip", "-n", host.netns, "neigh", "flush", "all")

    def rename_interface(self, i: int, old: str, new: str) -> None:
        """Host i's interface under another name (its address and route stay), as machines of two images differ."""
        ns = self.hosts[i].netns
        _sh("ip", "-n", ns, "link", "set", old, "down")
        _sh("ip", "-n", ns, "link", "set", old, "name", new)
        _sh("ip", "-n", ns, "link", "set", new, "up")

    def hide_shared(self, i: int, hidden: bool) -> None:
        """Host i without the shared storage: an empty directory of its own at the shared path (a tmpfs over it), as
        on a node whose mount failed; `hidden=False` takes it away again."""
        path = str(self.shared)
        argv = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", path] if hidden else ["umount", path]
        proc = self.hosts[i].run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"host {i}: {shlex.join(argv)}: {proc.stderr.strip()}")

    def refuse_ssh(self, i: int, refused: bool) -> None:
        """Host i's sshd refuses the run's key (an authorized_keys without it) or takes it again."""
        key = "" if refused else (self.base / "ssh" / "id_ed25519.pub").read_text()
        (self.base / f"h{i}" / "authorized_keys").write_text(key)

    def kill(self, i: int, *names: str) -> list[str]:
        """SIGKILL host i's processes of these exact names (e.g. raylet): what was killed, as `PID NAME` lines."""
        found = self.hosts[i].run(["ps", "-eo", "pid=,comm="], capture_output=True, text=True).stdout.split("\n")
        killed = [line.strip() for line in found if line.split()[1:] and line.split()[1] in names]
        pids = [line.split()[0] for line in killed]
        if pids:
            self.hosts[i].run(["kill", "-9", *pids], check=False)
        return killed

    def processes(self, i: int) -> list[str]:
        """Host i's processes but its PID 1 (sshd) and the `ps` that lists them, as `NAME ARGS` lines."""
        out = self.hosts[i].run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
        rows = [line.strip().split(None, 1) for line in out.splitlines() if line.strip()]
        return [args for pid, args in rows if pid != "1" and not args.startswith("ps -ww -eo")]

    # ---- down -----------------------------------------------------------------------------------------------------
    def leftovers(self) -> dict[str, list[int]]:
        """The processes still in each host, by namespace (empty lists after down())."""
        return {f"{self.run_id}-h{i}": netns_pids(f"{self.run_id}-h{i}") for i in range(self._n)}

    def down(self) -> None:
        _teardown(self.run_id, self._n)
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()


def _teardown(run_id: str, n: int | None = None) -> None:
    """Kill every process in each of the run's namespaces, delete them (the veths and the bridge go with them), and
    remove the run's files."""
    names = [line.split()[0] for line in _sh("ip", "netns", "list").splitlines() if line.strip()]
    mine = [name for name in names if name.startswith(f"{run_id}-")]
    for name in mine:
        deadline = time.monotonic() + 20
        while (pids := netns_pids(name)) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
    for name in mine:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    shutil.rmtree(RUNS_DIR / run_id, ignore_errors=True)


def sweep() -> list[str]:
    """Tear down the runs whose owner process is gone (a test run killed before its teardown)."""
    swept = []
    for state in RUNS_DIR.glob("t2h*/state.json"):
        try:
            owner = json.loads(state.read_text()).get("owner")
        except (OSError, ValueError):
            continue
        if owner is not None and not _alive(owner):
            _teardown(state.parent.name)
            swept.append(state.parent.name)
    return swept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.hosts", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start N hosts")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--shared", required=True, help="the directory every host mounts at the same path")
    down = sub.add_parser("down", help="stop a run's hosts and remove them")
    down.add_argument("run_id")
    ex = sub.add_parser("exec", help="run a command in one host")
    ex.add_argument("run_id")
    ex.add_argument("host", type=int)
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if (why := unavailable()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    if args.cmd == "up":
        Path(args.shared).mkdir(parents=True, exist_ok=True)
        try:
            hosts = Hosts(args.hosts, args.shared, run_id=f"t2h{os.getpid()}", owned=False).up()
        except (RuntimeError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        first = hosts.hosts[0].address
        hostfile = hosts.base / "hostfile"
        hostfile.write_text("".join(f"{a} slots=8\n" for a in hosts.addresses))
        me = "python -m support.hosts"
        print(f"hosts {hosts.run_id} up: {', '.join(hosts.addresses)} (shared: {hosts.shared})\n"
              f"a shell on the head:   {me} exec {hosts.run_id} 0 -- bash\n"
              f"then, on the head:     export HOSTFILE={hostfile} MASTER_ADDR={first} SLIME_HOST_IP={first} "
              f"GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 RAY_SSH='{hosts.ray_ssh}'\n"
              f"when done:             {me} down {hosts.run_id}")
        return 0
    if args.cmd == "down":
        _teardown(args.run_id)
        return 0
    if not (RUNS_DIR / args.run_id / "state.json").exists():
        print(f"error: no hosts {args.run_id} are up (python -m support.hosts up ...)", file=sys.stderr)
        return 1
    hosts = Hosts.attach(args.run_id)
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return hosts.hosts[args.host].run(command or ["bash"], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
