"""``memstream up --data-dir`` with a long path: embedded Postgres used to put its Unix
socket under the data dir, and a socket path over 107 bytes stopped it from starting
("could not create any Unix-domain sockets"). It listens on TCP only now."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from memstream.infra.embedded.postgres import EmbeddedPostgres

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_postgres_starts_under_a_data_dir_longer_than_a_socket_path(
    traversable_tmp: Path,
) -> None:
    deep = traversable_tmp / ("a-rather-long-folder-name-" * 5) / "postgres"
    assert len(str(deep / "pgdata" / ".s.PGSQL.65535")) > 107
    server = EmbeddedPostgres(deep)
    await server.start()
    try:
        conn = await asyncpg.connect(server.dsn)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()
    finally:
        await server.stop()
