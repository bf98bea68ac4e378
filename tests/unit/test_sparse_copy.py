"""``infra/sparse_copy``: a copy holds the same bytes as its source and keeps its holes
(qdrant-edge preallocates ~200 MB of sparse files per shard; a plain copy wrote them all)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from memstream.infra.sparse_copy import copy_file, copy_tree

MB = 1 << 20


def sparse(path: Path, length: int, writes: dict[int, bytes]) -> Path:
    with path.open("wb") as f:
        f.truncate(length)
        for at, data in writes.items():
            f.seek(at)
            f.write(data)
    return path


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_a_copy_has_the_same_bytes_and_keeps_the_holes(tmp_path: Path) -> None:
    src = sparse(tmp_path / "a", 64 * MB, {5 * MB: b"x" * 10_000, 60 * MB: b"tail"})
    copy_file(src, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == src.read_bytes()
    assert allocated(tmp_path / "b") < 1 * MB  # not the 64 MB a plain copy writes
    assert (tmp_path / "b").stat().st_mode == src.stat().st_mode


@pytest.mark.parametrize(
    "writes",
    [{}, {0: b"head"}, {4 * MB - 3: b"end"}, {0: os.urandom(3 * MB)}],
    ids=["all-hole", "data-first", "data-last", "all-data"],
)
def test_edges_of_files(tmp_path: Path, writes: dict[int, bytes]) -> None:
    src = sparse(tmp_path / "a", 4 * MB, writes)
    copy_file(src, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == src.read_bytes()


def test_without_copy_file_range_it_reads_and_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*_: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refused)  # sparse_copy looks it up per call
    src = sparse(tmp_path / "a", 40 * MB, {1: os.urandom(9 * MB), 30 * MB: b"z"})
    copy_file(src, tmp_path / "b")
    assert (tmp_path / "b").read_bytes() == src.read_bytes()
    assert allocated(tmp_path / "b") < 12 * MB


def test_a_tree_is_copied_whole(tmp_path: Path) -> None:
    (tmp_path / "s" / "sub").mkdir(parents=True)
    sparse(tmp_path / "s" / "big", 32 * MB, {MB: b"data"})
    (tmp_path / "s" / "sub" / "small").write_bytes(b"hello")
    (tmp_path / "s" / "empty").write_bytes(b"")
    copy_tree(tmp_path / "s", tmp_path / "t")
    for name in ("big", "sub/small", "empty"):
        assert (tmp_path / "t" / name).read_bytes() == (tmp_path / "s" / name).read_bytes()
    with pytest.raises(FileExistsError):  # a new folder, as shutil.copytree
        copy_tree(tmp_path / "s", tmp_path / "t")
