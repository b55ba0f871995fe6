"""attnkit._io: atomic writes leave either the old file or the complete new one."""

from __future__ import annotations

import os
import stat

import pytest

from attnkit import _io
from attnkit._io import atomic_write_bytes, atomic_write_text


def test_writes_text_and_bytes_creating_parents(tmp_path):
    p = atomic_write_text(tmp_path / "a" / "b" / "x.txt", "héllo\n")
    assert p.read_bytes() == "héllo\n".encode()
    q = atomic_write_bytes(tmp_path / "y.bin", b"\x00\xff")
    assert q.read_bytes() == b"\x00\xff"


def test_replaces_existing_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "r.txt"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert os.listdir(tmp_path) == ["r.txt"]


def test_failure_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    target = tmp_path / "keep.txt"
    target.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(_io.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_permissions_follow_umask_not_tempfile_defaults(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "perm.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644


def test_rejects_wrong_types(tmp_path):
    with pytest.raises(ValueError, match="text: expected str"):
        atomic_write_text(tmp_path / "t", b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data: expected bytes"):
        atomic_write_bytes(tmp_path / "b", "text")  # type: ignore[arg-type]
