"""What ships: the wheel installs the one package `tau2_rl_pipeline` (a top-level `eval` would collide with any other
project's), the original cookbook's `python3 eval/eval_passk.py` still runs, and git holds no binary by mistake."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Tracked files allowed over MAX_TRACKED_BYTES: pictures the README shows, and the lock files.
MAX_TRACKED_BYTES = 1 << 20
ALLOWED_LARGE = ("public/", "requirements.lock", "requirements-contract.lock")


def test_the_wheel_installs_only_tau2_rl_pipeline(tmp_path):
    """Built from a copy of the tracked files (an in-tree build would leave build/ in the checkout)."""
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(source)], check=True, capture_output=True, timeout=300)
    [wheel] = tmp_path.glob("tau2_rl_pipeline-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"tau2_rl_pipeline"}, top
    assert "tau2_rl_pipeline/eval/eval_passk.py" in names
    assert "tau2_rl_pipeline/benchmark/refusal_model.json" in names  # the detector's learned half, package data
    assert rigs_in(names) == [], rigs_in(names)  # the rigs live in tests/support, out of the product
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "tau2-rl-eval = tau2_rl_pipeline.eval.eval_passk:main" in scripts, scripts


# What only tests and benchmarks need: namespaced hosts (root, sshd), the loopback SGLang server.
TEST_RIGS = ("hosts.py", "loopback_server.py", "/testing/", "/support/")


def rigs_in(names: list[str]) -> list[str]:
    """The wheel's files that are test rigs, by name."""
    return sorted(n for n in names if n.endswith(TEST_RIGS[:2]) or any(part in n for part in TEST_RIGS[2:]))


def test_the_rig_check_catches_a_rig_in_the_wheel():
    assert rigs_in(["tau2_rl_pipeline/testing/hosts.py", "tau2_rl_pipeline/eval/runner.py",
                      "tau2_rl_pipeline/support/loopback_server.py"]) == [
        "tau2_rl_pipeline/support/loopback_server.py", "tau2_rl_pipeline/testing/hosts.py"]


def test_the_original_cookbook_command_line_runs_the_packaged_evaluator():
    """`python3 eval/eval_passk.py --help` (the original cookbook's command) and `tau2-rl-eval --help` print the same
    evaluator's help."""
    script = subprocess.run([sys.executable, "eval/eval_passk.py", "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert script.returncode == 0, script.stderr
    console = Path(sys.executable).with_name("tau2-rl-eval")
    packaged = subprocess.run([str(console), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert packaged.returncode == 0, packaged.stderr
    assert "--sglang-url" in script.stdout and "--hf-checkpoint" in script.stdout
    assert script.stdout == packaged.stdout  # the same parser (it names itself tau2-rl-eval either way)


def test_the_thin_script_says_what_to_do_without_the_package(tmp_path):
    """Run with an interpreter that lacks the package (a bare `python3 -I`, no venv): one line naming the fix."""
    proc = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "eval" / "eval_passk.py"), "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "scripts/setup.sh" in proc.stderr, proc.stderr


def oversized(files: dict[str, int]) -> list[str]:
    return sorted(f"{name} ({size / 2**20:.1f} MiB)" for name, size in files.items()
                  if size > MAX_TRACKED_BYTES and not name.startswith(ALLOWED_LARGE))


def test_git_tracks_no_large_file_outside_the_allowed_list():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    sizes = {n: (ROOT / n).stat().st_size for n in names.decode().split("\0") if n and (ROOT / n).is_file()}
    assert len(sizes) > 100  # the listing worked
    assert oversized(sizes) == []


def test_the_size_check_catches_a_committed_wheel():
    found = oversized({"ruff-0.17.6-py3-none-manylinux_2_17_x86_64.whl": 10_500_000, "public/bench.png": 2_000_000,
                       "requirements.lock": 3_000_000, "tests/small.py": 1000})
    assert found == ["ruff-0.17.6-py3-none-manylinux_2_17_x86_64.whl (10.0 MiB)"]
