"""cni.node.atomicfile: the one atomic writer (state file, registry records, the IPAM store)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from cni.node.atomicfile import write_atomic


def _temp_files(d: Path) -> list[str]:
    return [n for n in os.listdir(d) if n.startswith(".")]


def test_replaces_the_content_with_the_mode_asked_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    old = os.umask(0o077)
    try:
        write_atomic(str(path), b"new" * 100_000, mode=0o644)
    finally:
        os.umask(old)
    assert path.read_bytes() == b"new" * 100_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert _temp_files(tmp_path) == []


def test_a_symlink_planted_at_the_path_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    (tmp_path / "f").symlink_to(target)
    write_atomic(str(tmp_path / "f"), b"data")
    assert not (tmp_path / "f").is_symlink() and (tmp_path / "f").read_bytes() == b"data"
    assert target.read_bytes() == b"precious"


def test_a_failed_write_leaves_the_old_content_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomic(str(path), "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old" and _temp_files(tmp_path) == []


def test_names_relative_to_a_directory_descriptor(tmp_path: Path) -> None:
    """With ``dir_fd`` the name is resolved against the open directory, never through its path
    again: a directory moved meanwhile still gets the file (cni.ipam.store holds its directories so)."""
    (tmp_path / "store").mkdir()
    fd = os.open(tmp_path / "store", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(tmp_path / "store", tmp_path / "moved")
        write_atomic("record", b"x", dir_fd=fd)
    finally:
        os.close(fd)
    assert (tmp_path / "moved" / "record").read_bytes() == b"x"
    assert _temp_files(tmp_path / "moved") == []


def test_a_fixed_temp_name_left_by_a_dead_writer_is_reused_and_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    (tmp_path / ".journal.tmp").symlink_to(target)  # a leftover, or something planted there
    write_atomic(str(tmp_path / "journal"), b"entry", tmp_name=".journal.tmp")
    assert (tmp_path / "journal").read_bytes() == b"entry" and target.read_bytes() == b"precious"
    assert _temp_files(tmp_path) == []


@pytest.mark.parametrize(("kwargs", "expect"), [
    ({}, ["file", "dir"]),
    ({"sync": False}, []),
    ({"sync_dir": False}, ["file"]),  # the IPAM store: one directory fsync after several files
    ({"sync": False, "sync_dir": True}, ["dir"]),
])
@pytest.mark.parametrize("relative", [False, True])
def test_what_is_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any],
                         expect: list[str], relative: bool) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    if relative:
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            write_atomic("f", b"x", dir_fd=fd, **kwargs)
        finally:
            os.close(fd)
    else:
        write_atomic(str(tmp_path / "f"), b"x", **kwargs)
    assert synced == expect and (tmp_path / "f").read_bytes() == b"x"
