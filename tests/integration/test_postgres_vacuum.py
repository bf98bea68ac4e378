"""The vacuum an erasure runs after its deletes, on a real Postgres: a plain ``VACUUM`` drops
the dead rows but can leave their bytes in the data file; the rewrite takes them off; a
table someone holds is not waited on past the lock timeout (a plain vacuum instead, said in
a warning), and the holder is not disturbed."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from memstream.infra import postgres
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.postgres import vacuum
from tests.fixtures.stores import tables_holding

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def _table_with_a_deleted_secret(pool: asyncpg.Pool) -> tuple[str, bytes]:
    table = f"v_{uuid.uuid4().hex[:10]}"
    secret = f"zq{uuid.uuid4().hex[:12]}".encode()
    await pool.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, content text)")
    await pool.execute(
        f"INSERT INTO {table} SELECT g, 'kept row ' || g FROM generate_series(1, 20) g"
    )
    await pool.execute(f"INSERT INTO {table} VALUES (100, $1)", f"the secret {secret.decode()}")
    await pool.execute(f"DELETE FROM {table} WHERE id = 100")
    return table, secret


async def test_a_plain_vacuum_can_leave_the_bytes_and_the_rewrite_takes_them(
    pg_pool: asyncpg.Pool, pg_server: EmbeddedPostgres
) -> None:
    table, secret = await _table_with_a_deleted_secret(pg_pool)
    assert await vacuum(pg_pool, table, rewrite=False) is False
    # the row is gone from every query, its bytes not from the file (the finding)
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {table} WHERE id = 100") == 0
    assert table in await tables_holding(pg_pool, pg_server.pgdata, secret)
    assert await vacuum(pg_pool, table, rewrite=True) is True
    assert table not in await tables_holding(pg_pool, pg_server.pgdata, secret)
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {table}") == 20


async def test_a_held_table_is_vacuumed_without_a_rewrite_after_the_lock_timeout(
    pg_pool: asyncpg.Pool,
    pg_server: EmbeddedPostgres,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(postgres, "REWRITE_LOCK_TIMEOUT_S", 0.2)
    table, secret = await _table_with_a_deleted_secret(pg_pool)
    async with pg_pool.acquire() as holder, holder.transaction():
        assert await holder.fetchval(f"SELECT count(*) FROM {table}") == 20  # holds its lock
        assert await vacuum(pg_pool, table, rewrite=True) is False
        assert await holder.fetchval(f"SELECT count(*) FROM {table}") == 20  # undisturbed
    assert any(
        table in r.getMessage() and "without a rewrite" in r.getMessage() for r in caplog.records
    )
    # the lock timeout is the vacuum's own: the pool's connections do not keep it
    async with pg_pool.acquire() as conn:
        assert await conn.fetchval("SHOW lock_timeout") == "0"
    assert await vacuum(pg_pool, table, rewrite=True) is True  # released: rewritten
    assert table not in await tables_holding(pg_pool, pg_server.pgdata, secret)
