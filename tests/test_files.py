"""The one atomic write: the old file or the new one, never a torn one, and no temp file left behind."""

import pytest

from tau2_rl_pipeline.files import atomic_write_bytes


def test_atomic_write_makes_parents_and_replaces_whole_files(tmp_path):
    path = tmp_path / "a" / "b" / "state.json"
    atomic_write_bytes(path, b"first")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp_file(tmp_path):
    path = tmp_path / "state.json"
    atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # fails inside the write, after the temp file was opened
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_staging_directory_is_readable_like_any_new_folder(tmp_path) -> None:
    """Checkpoints are written into a staging folder and renamed: it gets the umask's permissions (0755 under the
    usual 022), not mkdtemp's 0700, which left checkpoints unreadable to other users and containers."""
    import os

    from tau2_rl_pipeline.files import staging_dir

    umask = os.umask(0o022)
    try:
        first, second = staging_dir(tmp_path / "ckpts" / "sft"), staging_dir(tmp_path / "ckpts" / "sft")
    finally:
        os.umask(umask)
    assert first != second and first.parent == tmp_path / "ckpts" and first.name.startswith(".sft.")
    assert (first.stat().st_mode & 0o777) == 0o755 and not any(first.iterdir())
