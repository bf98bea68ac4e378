"""Copy files and folders keeping their holes: only the bytes a file really holds are read
and written.

qdrant-edge preallocates its storage as sparse files: an empty shard is ~200 MB long in
~110 files and holds ~0.2 MB. ``shutil.copytree`` (``sendfile`` on Linux) reads and writes
every zero of that length, so each copy a graph build or a rewrite makes of a shard wrote
its whole apparent size to the disk. Here each data extent (``SEEK_DATA`` / ``SEEK_HOLE``)
is copied with ``copy_file_range`` (in the kernel, or a reflink where the filesystem has
them), and the copy is cut to the source's length, so the holes stay holes. A filesystem
that does not report holes reports the whole file as data: the copy is then a plain one.
The standard library has no sparse-aware copy; ``cp --sparse=always`` would be a process
per folder and, where data is not already in extents, scans for zeros.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Final

__all__ = ["copy_file", "copy_tree", "sync_tree"]

_CHUNK: Final = 8 << 20
"""At most this many bytes per ``copy_file_range`` / read call."""


def copy_file(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str:
    """Copy ``src`` to ``dst`` (file contents and mode, as ``shutil.copy2`` does, times
    included), holes kept. Returns ``dst`` (usable as ``copytree``'s ``copy_function``)."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        size = os.fstat(fi.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fi.fileno(), pos, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # nothing but a hole from pos to the end
                    break
                raise
            end = os.lseek(fi.fileno(), start, os.SEEK_HOLE)
            _copy_range(fi.fileno(), fo.fileno(), start, end - start)
            pos = end
        os.ftruncate(fo.fileno(), size)
    shutil.copystat(src, dst)
    return str(dst)


def copy_tree(src: Path, dst: Path) -> None:
    """``shutil.copytree`` of ``src`` to a new ``dst`` with :func:`copy_file`."""
    shutil.copytree(src, dst, copy_function=copy_file)


def sync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (``root`` and its parent included): what
    a copy wrote is on the disk when this returns, as a program that wrote it with fsyncs
    of its own would have left it."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _sync_dir(folder)
    _sync_dir(str(Path(root).parent))


def _sync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_range(fi: int, fo: int, offset: int, count: int) -> None:
    in_kernel = getattr(os, "copy_file_range", None)  # Linux only
    while count > 0:
        step = min(count, _CHUNK)
        try:
            if in_kernel is None:
                raise OSError(errno.ENOSYS, "no copy_file_range")
            n = in_kernel(fi, fo, step, offset, offset)
        except OSError as e:  # not here (old kernel, some filesystems): read and write
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            n = _copy_by_reads(fi, fo, offset, step)
        if n <= 0:  # the source got shorter while being copied
            return
        offset += n
        count -= n


def _copy_by_reads(fi: int, fo: int, offset: int, count: int) -> int:
    data = os.pread(fi, count, offset)
    view = memoryview(data)
    done = 0
    while done < len(data):
        done += os.pwrite(fo, view[done:], offset + done)
    return len(data)
