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
