"""The cluster check's checkpoint verdict (cluster/inputs.py) over a checkpoint Megatron itself wrote
(megatron_save.py: `dist_checkpointing.save`, then the tracker and `release/` as slime's converter leaves them), and
Megatron's own readers of the same directory agreeing: complete, then with what its loader needs taken away."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from contract_tier import MEGATRON_DIR

from tau2_rl_pipeline.cluster.inputs import checkpoint_missing, read_checkpoint

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("megatron")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(MEGATRON_DIR), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "megatron_save.py"), str(port), str(base / "ckpt")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "ckpt"


def copy(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / "ckpt"))


def megatron_reads(path: Path) -> tuple[tuple[int, bool], bool]:
    """Megatron's tracker reader and its test of a distributed checkpoint, on the directory the tracker names."""
    from megatron.core.dist_checkpointing.core import check_is_distributed_checkpoint
    from megatron.training.checkpointing import get_checkpoint_name, read_metadata

    iteration, release = read_metadata(str(path / "latest_checkpointed_iteration.txt"))
    return (iteration, release), check_is_distributed_checkpoint(
        get_checkpoint_name(str(path), iteration, release, return_base_dir=True))


def test_a_checkpoint_megatron_wrote_is_complete(saved: Path) -> None:
    assert sorted(os.listdir(saved / "release")) == [".metadata", "__0_0.distcp", "common.pt", "metadata.json"]
    assert megatron_reads(saved) == ((0, True), True)
    assert checkpoint_missing(read_checkpoint(str(saved))) is None


def test_an_unfinished_save_is_refused_as_megatron_refuses_it(saved: Path, tmp_path: Path) -> None:
    ckpt = copy(saved, tmp_path)
    (ckpt / "release/metadata.json").unlink()  # Megatron writes it last
    assert megatron_reads(ckpt) == ((0, True), False)
    assert checkpoint_missing(read_checkpoint(str(ckpt))) == "has no release/metadata.json (a save that did not finish)"


@pytest.mark.parametrize("name, says", [(".metadata", "has no release/.metadata"),
                                        ("__0_0.distcp", "has no release/*.distcp shards"),
                                        ("common.pt", "has no release/common.pt")])
def test_a_save_missing_what_megatrons_loader_reads_is_refused(saved: Path, tmp_path: Path, name: str,
                                                               says: str) -> None:
    ckpt = copy(saved, tmp_path)
    (ckpt / "release" / name).unlink()
    assert checkpoint_missing(read_checkpoint(str(ckpt))) == says


def test_a_tracker_naming_an_iteration_that_is_not_there_is_refused(saved: Path, tmp_path: Path) -> None:
    ckpt = copy(saved, tmp_path)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("40")
    assert megatron_reads(ckpt) == ((40, False), False)
    assert checkpoint_missing(read_checkpoint(str(ckpt))) == ("has no iter_0000040, which its "
                                                              "latest_checkpointed_iteration.txt names")
    (ckpt / "release").rename(ckpt / "iter_0000040")
    assert megatron_reads(ckpt) == ((40, False), True)
    assert checkpoint_missing(read_checkpoint(str(ckpt))) is None
