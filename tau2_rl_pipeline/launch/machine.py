"""What the planner asks of the machine it runs on: the only I/O of the plan.

A plan refuses what cannot run before anything starts: an input that is missing, a busy port, too few GPUs, a
server that does not answer, a network interface this node lacks, a worker address that is this machine. Those are
questions about the machine's present state; they live here so the rest of the planner is pure and a test can hand
it a machine of its own (`Machine` is the real one).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

from tau2_rl_pipeline.cluster.net import interface_problem, read_interfaces


class Machine:
    """This machine, as the stage scripts find it."""

    def is_file(self, path: str) -> bool:
        return Path(path).is_file()

    def is_dir(self, path: str) -> bool:
        return Path(path).is_dir()

    def exists(self, path: str) -> bool:
        return Path(path).exists()

    def has_text(self, path: str, needle: str | None = None) -> bool:
        """Whether the file holds a non-blank character (or `needle`)."""
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            return False
        return needle in text if needle is not None else bool(text.strip())

    def port_in_use(self, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def own_addresses(self) -> list[str] | None:
        """This machine's addresses as `hostname -I` lists them; None where it cannot."""
        try:
            out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        return out.split() or None

    def gpu_count(self) -> int | None:
        """GPUs `nvidia-smi -L` lists; None without nvidia-smi."""
        if shutil.which("nvidia-smi") is None:
            return None
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False).stdout
        return sum(line.startswith("GPU ") for line in out.splitlines())

    def has_tool(self, name: str) -> bool:
        return shutil.which(name) is not None

    def answers(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5):  # noqa: S310 (the user's own server)
                return True
        except (OSError, ValueError):
            return False

    def interface_problem(self, setting: str) -> str | None:
        variable, _, value = setting.partition("=")
        return interface_problem(variable, value, read_interfaces(), "on this node")

    def mem_total(self) -> int:
        """MemTotal of /proc/meminfo in bytes; 0 when it cannot be read."""
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def ssh_answers(self, ssh: list[str], host: str) -> tuple[bool, str]:
        """Whether `ssh host true` succeeds; else the last line ssh printed."""
        ok, out = self.run_quietly([*ssh, host, "true"], dict(os.environ))
        return ok, (out.strip().splitlines() or [""])[-1]

    def run_quietly(self, cmd: list[str], env: dict[str, str]) -> tuple[bool, str]:
        """Run a check program in environment `env`: (whether it passed, its stdout and stderr together)."""
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600,
                                  check=False)
        except OSError as exc:
            return False, str(exc)
        return proc.returncode == 0, proc.stdout + proc.stderr
