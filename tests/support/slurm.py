"""A real Slurm on namespaced hosts (support/hosts.py): Debian's slurmctld, slurmd and munge, one cluster per run.

Host 0 is the login and controller host (slurmctld, munged; jobs are submitted there and the user simulator may run
there), hosts 1..N-1 are the compute nodes (slurmd, munged), each with fake GPUs: character devices in its own /run
that gres.conf lists (`AutoDetect=off`, `File=`), so Slurm's GRES bookkeeping and CUDA_VISIBLE_DEVICES are real while
no GPU is. What a namespaced host needs that a machine has (docs: /work/shared/notes/slurm-on-namespaces.md):

- its own hostname (Slurm keys nodes by `gethostname()`) and an /etc/hosts naming every node, bind-mounted over the
  machine's only in the host's mount namespace;
- its own cgroup v1 freezer hierarchy: the host starts in `freezer/<host>` with a cgroup namespace of its own and
  mounts `freezer` at /sys/fs/cgroup/freezer, so `proctrack/cgroup` tracks every process of a job step, Ray's
  daemonised helpers included, and Slurm's own cleanup is what ends them (`CgroupPlugin=cgroup/v1`: slurmd 22.05
  loads a cgroup plugin always, and autodetection fails on a namespace's fresh /sys);
- munged as the munge user with its key, socket, seed and log of its own (/run/munge is the host's);
- `SlurmdParameters=config_overrides`: four CPUs a node on a two-core machine.

Faults are fast: `SlurmdTimeout` (a silent node DOWN) and `AuthInfo=cred_expire` (how long a requeued job is held)
are parameters, `ReturnToService=2` brings a node back when its slurmd registers again. Teardown is the hosts' (every
process of each namespace killed) plus the host's freezer cgroups removed from the bottom up.

    python -m support.slurm up --shared /data/run1      # prints how to submit
    python -m support.slurm down t2h1234s
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import subprocess
import sys
import time
from pathlib import Path

from support import hosts as hosts_mod

FREEZER = Path("/sys/fs/cgroup/freezer")
PACKAGES = {"/usr/sbin/slurmctld": "slurmctld", "/usr/sbin/slurmd": "slurmd", "/usr/bin/sbatch": "slurm-client",
            "/usr/sbin/munged": "munge"}
DAEMONS = ("sshd", "munged", "slurmd", "slurmctld")  # what a host holds when no job runs (and slurmscriptd)


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here (one line), or None."""
    if why := hosts_mod.unavailable():
        return why
    missing = sorted({pkg for path, pkg in PACKAGES.items() if not os.access(path, os.X_OK)})
    if missing:
        return f"Slurm on namespaced hosts needs {', '.join(missing)} (apt-get install slurm-wlm munge)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "Slurm on namespaced hosts needs the munge user (apt-get install munge)"
    if not (FREEZER / "cgroup.procs").exists():
        return f"Slurm on namespaced hosts needs a cgroup v1 freezer at {FREEZER} (proctrack/cgroup)"
    return None


class SlurmHosts(hosts_mod.Hosts):
    """N namespaced hosts with Slurm: host 0 the controller, the others compute nodes with `gpus` fake GPUs each."""

    def __init__(self, n: int, shared: str | Path, *, gpus: int = 2, cpus: int = 4, slurmd_timeout: int = 20,
                 cred_expire: int = 30, run_id: str | None = None, session_env: dict[str, str] | None = None) -> None:
        if n < 2:
            raise ValueError("a Slurm cluster here needs the controller host and at least one compute node")
        super().__init__(n, shared, run_id=run_id or f"t2h{os.getpid()}s", session_env=session_env)
        self.gpus, self.cpus = gpus, cpus
        self.slurmd_timeout, self.cred_expire = slurmd_timeout, cred_expire

    # ---- names and files --------------------------------------------------------------------------------------
    def node_name(self, i: int) -> str:
        return f"{self.run_id}-h{i}"

    @property
    def compute(self) -> list[str]:
        return [self.node_name(i) for i in range(1, self._n)]

    @property
    def conf(self) -> Path:
        return self.base / "slurm" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's commands need, on any host."""
        return {"SLURM_CONF": str(self.conf)}

    def freezer(self, i: int) -> Path:
        return FREEZER / self.node_name(i)

    def host_setup(self, i: int) -> list[str]:
        """The host's /etc/hosts, its cgroup v1 freezer (the cgroup namespace's root), munge's socket directory, and
        on compute nodes the fake GPUs."""
        lines = [f"mount --bind {self.base / 'etc_hosts'} /etc/hosts",
                 "mount -t tmpfs -o size=1m cgroups /sys/fs/cgroup", "mkdir /sys/fs/cgroup/freezer",
                 "mount -t cgroup -o freezer freezer /sys/fs/cgroup/freezer",
                 "mkdir -p /run/munge", "chown munge:munge /run/munge"]
        if i > 0:
            lines += ["mkdir -p /run/fakegpu"] + [f"mknod /run/fakegpu/nvidia{g} c 195 {g}" for g in range(self.gpus)]
        return lines

    def holder(self, i: int) -> list[str]:
        """Into the host's own freezer cgroup first, then the namespaces, a cgroup namespace among them."""
        inner, cg = super().holder(i), self.base / f"h{i}" / "freezer"
        # `ip netns exec` remounted /sys: the freezer is mounted again here, in its private mount namespace
        move = (f"mkdir -p {cg} && mount -t cgroup -o freezer freezer {cg} && "
                f"echo $$ > {cg}/{self.node_name(i)}/cgroup.procs && umount {cg}")
        return ["sh", "-c", f'{move} && exec unshare --cgroup "$@"', "sh", *inner[1:]]

    def _files(self) -> None:
        super()._files()
        names = "".join(f"{hosts_mod.SUBNET}.{i + 1} {self.node_name(i)}\n" for i in range(self._n))
        (self.base / "etc_hosts").write_text(f"127.0.0.1 localhost\n{names}")
        munge = pwd.getpwnam("munge")
        key_dir = self.base / "munge"
        key_dir.mkdir(mode=0o700)
        (key_dir / "munge.key").write_bytes(os.urandom(1024))
        (key_dir / "munge.key").chmod(0o400)
        for i in range(self._n):
            for sub in ("munge", "munge/log"):
                (self.base / f"h{i}" / sub).mkdir(mode=0o700)
        for path in [key_dir, key_dir / "munge.key",
                     *(self.base / f"h{i}" / sub for i in range(self._n) for sub in ("munge", "munge/log"))]:
            os.chown(path, munge.pw_uid, munge.pw_gid)
        conf_dir = self.base / "slurm"
        (conf_dir / "state").mkdir(parents=True)
        conf_dir.chmod(0o755)
        conf_dir.joinpath("slurm.conf").write_text(self.slurm_conf())
        conf_dir.joinpath("cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
        gpus = f"nvidia[0-{self.gpus - 1}]" if self.gpus > 1 else "nvidia0"
        conf_dir.joinpath("gres.conf").write_text(
            f"AutoDetect=off\nNodeName={self.run_id}-h[1-{self._n - 1}] Name=gpu File=/run/fakegpu/{gpus}\n")
        for i in range(self._n):
            self.freezer(i).mkdir()

    def slurm_conf(self) -> str:
        base, ctl = self.base / "slurm", self.node_name(0)
        nodes = "".join(
            f"NodeName={self.node_name(i)} NodeAddr={hosts_mod.SUBNET}.{i + 1} CPUs={self.cpus} RealMemory=2000 "
            f"Gres=gpu:{self.gpus} State=UNKNOWN\n" for i in range(1, self._n))
        return (
            f"ClusterName={self.run_id.lower()}\nSlurmctldHost={ctl}({hosts_mod.SUBNET}.1)\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=cred_expire={self.cred_expire}\n"
            "SlurmUser=root\nSlurmdUser=root\nMpiDefault=none\nProctrackType=proctrack/cgroup\nTaskPlugin=task/none\n"
            "SwitchType=switch/none\nJobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "JobCompType=jobcomp/none\nSchedulerType=sched/backfill\nSchedulerParameters=sched_interval=5,bf_interval=5\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nGresTypes=gpu\nReturnToService=2\n"
            f"SlurmdTimeout={self.slurmd_timeout}\nKillWait=10\nMinJobAge=3600\nMailProg=/bin/true\n"
            "SlurmdParameters=config_overrides\nPropagateResourceLimits=NONE\n"
            f"StateSaveLocation={base / 'state'}\nSlurmdSpoolDir={base}/spool-%n\n"
            f"SlurmctldPidFile={base}/slurmctld.pid\nSlurmdPidFile={base}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={base}/slurmctld.log\nSlurmdLogFile={base}/slurmd-%n.log\n"
            f"{nodes}PartitionName=gpu Nodes={self.run_id}-h[1-{self._n - 1}] Default=YES MaxTime=INFINITE State=UP\n")

    # ---- daemons ------------------------------------------------------------------------------------------------
    def daemon_command(self, i: int, argv: list[str]) -> list[str]:
        """argv in host i as its own daemons run: its namespaces, its cgroup namespace, and its freezer cgroup."""
        host = self.hosts[i]
        return ["nsenter", "-t", str(host.init_pid), "-n", "-m", "-u", "-p", "-C", "--", "sh", "-c",
                'echo $$ > /sys/fs/cgroup/freezer/cgroup.procs && exec "$@"', "sh", *argv]

    def start_daemon(self, i: int, argv: list[str], log: str) -> None:
        out = open(self.base / f"h{i}" / log, "wb")  # noqa: SIM115 - the daemon keeps it
        proc = subprocess.Popen(self.daemon_command(i, argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True)
        out.close()
        self._procs.append(proc)  # waited for by the hosts' down()

    def start_slurmd(self, i: int) -> None:
        self.start_daemon(i, ["slurmd", "-D", "-f", str(self.conf)], "slurmd.out")

    def up(self) -> SlurmHosts:
        sweep_cgroups()
        super().up()
        try:
            for i in range(self._n):
                d = self.base / f"h{i}" / "munge"
                self.start_daemon(i, ["setpriv", "--reuid=munge", "--regid=munge", "--clear-groups", "munged",
                                      "--foreground", f"--key-file={self.base / 'munge' / 'munge.key'}",
                                      f"--seed-file={d / 'seed'}", f"--log-file={d / 'log' / 'munged.log'}",
                                      f"--pid-file={d / 'munged.pid'}", "--socket=/run/munge/munge.socket.2"],
                                  "munged.out")
            self._wait(lambda: all((self.hosts[i].run(["test", "-S", "/run/munge/munge.socket.2"]).returncode == 0)
                                   for i in range(self._n)), 30, "munged did not start")
            self.start_daemon(0, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
            for i in range(1, self._n):
                self.start_slurmd(i)
            self._wait(lambda: self.states() == dict.fromkeys(self.compute, "idle"), 60,
                       "the nodes did not come up idle")
        except BaseException:
            self.down()
            raise
        return self

    def _wait(self, ready, limit_s: float, what: str) -> None:
        deadline = time.monotonic() + limit_s
        while not ready():
            if time.monotonic() > deadline:
                logs = self.base / "slurm"
                tail = "".join(p.read_text()[-600:] for p in sorted(logs.glob("*.log")))
                raise RuntimeError(f"{what} within {limit_s} s: states {self.states()}; logs: {tail}")
            time.sleep(0.5)

    # ---- Slurm's commands, from the controller host --------------------------------------------------------------
    def slurm(self, *argv: str, check: bool = True) -> str:
        proc = self.hosts[0].run(list(argv), env={**os.environ, **self.env}, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def states(self) -> dict[str, str]:
        """Each compute node's state as sinfo shows it (idle, alloc, down*, ...)."""
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %T", check=False)
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as KEY -> VALUE (JobState, Restarts, NodeList, ...)."""
        out = self.slurm("scontrol", "-o", "show", "job", job_id, check=False)
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def leftovers_of_jobs(self) -> dict[str, list[str]]:
        """What each host holds beyond its daemons (and, on host 0, what the caller started: see `keep`)."""
        out = {}
        for i in range(self._n):
            rows = self.processes(i)
            out[self.node_name(i)] = [p for p in rows if p.split()[0].rsplit("/", 1)[-1] not in DAEMONS
                                      and "slurmscriptd" not in p]
        return out

    def job_cgroups(self) -> list[str]:
        """Job and step cgroups slurmd made under the hosts' freezers that are still there."""
        return [str(p) for i in range(1, self._n) for p in self.freezer(i).rglob("job_*") if p.is_dir()]

    # ---- down ---------------------------------------------------------------------------------------------------
    def down(self) -> None:
        super().down()
        for i in range(self._n):
            remove_cgroup(self.freezer(i))


def remove_cgroup(path: Path) -> None:
    """A cgroup v1 directory and the ones under it, bottom up (rmdir: their processes are gone)."""
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        os.rmdir(sub)
    os.rmdir(path)


def sweep_cgroups() -> None:
    """The freezer cgroups of runs whose hosts are gone (a run killed before its teardown)."""
    for path in FREEZER.glob("t2h*-h*"):
        run = path.name.rsplit("-h", 1)[0]
        if not (hosts_mod.RUNS_DIR / run).exists():
            try:
                remove_cgroup(path)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.slurm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the controller host and N compute nodes")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--gpus", type=int, default=2)
    up.add_argument("--shared", required=True)
    down = sub.add_parser("down")
    down.add_argument("run_id")
    args = parser.parse_args(argv)
    if (why := unavailable()) is not None:
        print(f"error: {why}", file=sys.stderr)
        return 1
    if args.cmd == "down":
        hosts_mod._teardown(args.run_id)
        for path in FREEZER.glob(f"{args.run_id}-h*"):
            remove_cgroup(path)
        return 0
    Path(args.shared).mkdir(parents=True, exist_ok=True)
    cluster = SlurmHosts(args.nodes + 1, args.shared, gpus=args.gpus)
    cluster._owned = False
    cluster.up()
    print(f"slurm {cluster.run_id} up: controller {cluster.node_name(0)}, nodes {', '.join(cluster.compute)}\n"
          f"submit: python -m support.hosts exec {cluster.run_id} 0 -- env SLURM_CONF={cluster.conf} sbatch ...\n"
          f"down:   python -m support.slurm down {cluster.run_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
