"""The data-dir process lock: one process of this machine writes a data dir at a time.

``memstream up`` and ``memstream api`` (anything that opens the journal writer) take an
exclusive ``flock`` on ``<data_dir>/memstream.lock`` *before* touching anything else: no
embedded server launched, no journal opened (opening it would fence the live writer), no
``memstream.json`` rewritten. A second process on a data dir in use refuses at once with
"already running (pid N, URL)". The kernel drops the lock when the holder dies, even on
``kill -9``: no stale lock to clean up. Between machines, the journal's fencing stays the
rule (a lock file on shared storage is not trusted).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from memstream.errors import MemstreamError
from memstream.infra.cli.state import read_state

__all__ = ["LOCK_FILE", "AlreadyRunning", "DataDirLock"]

LOCK_FILE = "memstream.lock"


class AlreadyRunning(MemstreamError):
    code = "already_running"
    status = 409


class DataDirLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process ends)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`AlreadyRunning` naming the holder's pid and URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(self._message(holder)) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the flock

    def _message(self, pid: int | None) -> str:
        state = read_state(self.data_dir) or {}
        url = state.get("api_url") if state.get("running") else None
        who = f"pid {pid}" if pid is not None else "another process"
        where = f", {url}" if isinstance(url, str) and url else ""
        return (
            f"memstream is already running on {self.data_dir} ({who}{where}); "
            "stop it first or use another --data-dir"
        )


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip())
    return None
