"""A pooled connection is handed back without asyncpg's reset statement unless it kept
session state (``infra/postgres``: ``PooledConnection``, ``keeps_session_state``).

What a user would notice if this were wrong: a lock, a ``LISTEN`` or a setting left on a
connection the next request then gets (a relay that never again takes its lock, a route
running under another's ``lock_timeout``), or a transaction left open across requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from memstream.infra.postgres import PooledConnection, create_pool, keeps_session_state
from tests.fixtures.stores import fresh_database

pytestmark = pytest.mark.asyncio(loop_scope="session")

LOCK = 0x74657374  # "test"


@pytest_asyncio.fixture(loop_scope="session")
async def db(pg_dsn: str) -> str:
    return await fresh_database(pg_dsn)


@pytest_asyncio.fixture(loop_scope="session")
async def one_conn_pool(db: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of one connection: every acquire gets the connection the last one released."""
    pool = await create_pool(db, min_size=1, max_size=1)
    yield pool
    await pool.close()


async def _lock_free(dsn: str) -> bool:
    """Whether another session can take ``LOCK`` now (and gives it back)."""
    other = await asyncpg.connect(dsn)
    try:
        got = bool(await other.fetchval("SELECT pg_try_advisory_lock($1)", LOCK))
        if got:
            await other.execute("SELECT pg_advisory_unlock($1)", LOCK)
        return got
    finally:
        await other.close()


async def test_a_plain_connection_is_released_without_a_reset_statement(
    one_conn_pool: asyncpg.Pool,
) -> None:
    async with one_conn_pool.acquire() as conn:
        assert isinstance(conn, PooledConnection)
        assert conn.get_reset_query() == ""
        backend = await conn.fetchval("SELECT pg_backend_pid()")
    async with one_conn_pool.acquire() as conn:
        assert await conn.fetchval("SELECT pg_backend_pid()") == backend  # the same session
        assert conn.get_reset_query() == ""


async def test_a_lock_left_by_a_marked_connection_is_released_with_it(
    one_conn_pool: asyncpg.Pool, db: str
) -> None:
    async with one_conn_pool.acquire() as conn:
        keeps_session_state(conn)
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK)
        await conn.execute("SET lock_timeout = '1234ms'")
        assert not await _lock_free(db)
        # released without the unlock nor the RESET: a cancelled finally block, say
    assert await _lock_free(db)
    async with one_conn_pool.acquire() as conn:
        assert await conn.fetchval("SHOW lock_timeout") == "0"
        assert conn.get_reset_query() == ""  # fully reset once, then plain again


def _ignore(*_: object) -> None:
    pass


@pytest.mark.filterwarnings("ignore:.*active notification listener")
async def test_a_listen_marks_its_connection_itself(one_conn_pool: asyncpg.Pool) -> None:
    async with one_conn_pool.acquire() as conn:
        await conn.add_listener("memstream_test", _ignore)
        assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 1
    async with one_conn_pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0


async def test_an_open_transaction_is_rolled_back_on_release(
    one_conn_pool: asyncpg.Pool,
) -> None:
    async with one_conn_pool.acquire() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS left_open (v int)")
        await conn.execute("BEGIN")
        await conn.execute("INSERT INTO left_open VALUES (1)")
    async with one_conn_pool.acquire() as conn:
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT count(*) FROM left_open") == 0
