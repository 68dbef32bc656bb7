"""The shared storage full (ENOSPC) under a GRPO run's checkpoint directory, on a real filesystem that fills up (a
1 MiB tmpfs): the two writes a run makes there, each failing as it fails in the job, and what the rerun finds.

- the curriculum state, written after every rollout (slime_plugins/adapter.py `reward_post_process`): the first
  write to meet a full disk; it fails naming its file, and the state of the rollout before is left whole;
- the checkpoint save, as Megatron's `save_checkpoint` does it (megatron_save.py `iteration`: Megatron's own
  `dist_checkpointing.save`, then the tracker, last): it fails before the tracker is touched, so the tracker names
  the last good save, which Megatron's reader, the cluster check and slime's start rule all take; once space is
  freed, the rerun's save of the same iteration goes over the torn directory.

Each failure's traceback gives the stage script's one line (cluster/job_failure.py). The same fault on separate hosts,
through train_grpo.sh: tests/contract/test_hosts_faults.py.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from contract_tier import MEGATRON_DIR
from support.full_storage import fill, small_filesystem

from tau2_rl_pipeline.cluster.inputs import checkpoint_missing, read_checkpoint
from tau2_rl_pipeline.cluster.job_failure import why_failed
from tau2_rl_pipeline.config import Tau2Config
from tau2_rl_pipeline.learning.curriculum import STATE_FILE, CurriculumTracker

HERE = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a small filesystem to fill needs root (mount -t tmpfs)")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: the shared storage, small enough to fill."""
    with small_filesystem(tmp_path / "shared", "1m") as fs:
        yield fs


def megatron_save(save: Path, iteration: int, numel: int) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(MEGATRON_DIR), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(HERE / "megatron_save.py"), "iteration", str(port), str(save),
                           str(iteration), str(numel)], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def resumes_at(save: Path) -> int:
    """The rollout slime's train.py starts at: the iteration Megatron's reader reads from the tracker, + 1."""
    from megatron.training.checkpointing import get_checkpoint_tracker_filename, read_metadata

    iteration, _release = read_metadata(get_checkpoint_tracker_filename(str(save)))
    return iteration + 1


def tracker_of(cfg: Tau2Config, *outcomes: bool) -> CurriculumTracker:
    tracker = CurriculumTracker(cfg)
    for success in outcomes:
        tracker.record("create_task_1", success)
    return tracker


def test_the_curriculum_state_on_full_storage_fails_naming_its_file_and_stays_whole(small_fs: Path) -> None:
    cfg = Tau2Config()
    path = small_fs / "checkpoints/grpo" / STATE_FILE
    tracker_of(cfg, True, False).save(path)  # rollout 1's state
    before = path.read_bytes()
    fill(small_fs)
    with pytest.raises(OSError) as failed:
        tracker_of(cfg, True, False, True, True).save(path)  # rollout 2's
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(path)
    assert path.read_bytes() == before and sorted(os.listdir(path.parent)) == [STATE_FILE]  # no temp file left
    restored = CurriculumTracker.restore(cfg, path)
    assert (restored.attempts, restored.successes) == ({"create_task_1": 2}, {"create_task_1": 1})
    line = why_failed(f"Traceback (most recent call last):\nOSError: {failed.value}\n", 1).line
    assert line.startswith(f"the job could not write {path}: no space left on its device (ENOSPC); free space")


def test_a_checkpoint_save_on_full_storage_leaves_the_last_good_one_and_the_rerun_resumes_from_it(
        small_fs: Path) -> None:
    save = small_fs / "checkpoints/grpo"
    first = megatron_save(save, 1, 8)
    assert first.returncode == 0, first.stderr[-3000:]
    CurriculumTracker(Tau2Config()).save(save / STATE_FILE)
    state = (save / STATE_FILE).read_bytes()
    filler = fill(small_fs)

    failed = megatron_save(save, 2, 8)
    # torch.save's zip writer (Megatron's common.pt) says no more than this of a full disk
    assert failed.returncode != 0 and "RuntimeError: basic_ios::clear: iostream error" in failed.stderr, \
        failed.stderr[-3000:]
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert (save / "iter_0000002").exists()  # torn: what Megatron wrote before the disk was full
    assert checkpoint_missing(read_checkpoint(str(save))) is None and resumes_at(save) == 2
    assert (save / STATE_FILE).read_bytes() == state
    assert why_failed(failed.stderr, failed.returncode).line.startswith(  # the stage script's one line
        "a checkpoint save could not write its files (torch.save: basic_ios::clear: iostream error, which is what a "
        "full disk gives it); free space on the storage the checkpoints go to (--save), then run the same command")

    filler.unlink()  # space freed: the rerun saves the same iteration over the torn directory
    rerun = megatron_save(save, 2, 8)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert checkpoint_missing(read_checkpoint(str(save))) is None and resumes_at(save) == 3
