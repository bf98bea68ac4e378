"""Every Postgres wait for a free connection is bounded: with the pool's every connection
held (a stalled request, a stuck loop), another route's store answers 503 with
``Retry-After`` after ``postgres_acquire_timeout_s`` instead of waiting for ever, and works
again once a connection comes free."""

from __future__ import annotations

import asyncio

import pytest

from memstream.errors import StoreBusy
from memstream.infra.postgres import close_pool, create_pool

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_full_pool_answers_store_unavailable_then_recovers(pg_dsn: str) -> None:
    pool = await create_pool(pg_dsn, min_size=1, max_size=2, acquire_timeout_s=0.5)
    try:
        held = [await pool.acquire() for _ in range(2)]  # a stalled request holds them all
        with pytest.raises(StoreBusy, match="no Postgres connection came free"):
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT 1")
        with pytest.raises(StoreBusy):
            await pool.fetchval("SELECT 1")  # the pool's own shortcuts are bounded too
        with pytest.raises(StoreBusy):
            await pool.acquire()
        await pool.release(held.pop())
        assert await pool.fetchval("SELECT 41 + 1") == 42  # one came free: served again
        async with pool.acquire(timeout=5) as conn:  # an explicit timeout still wins
            assert await conn.fetchval("SELECT 1") == 1
        await pool.release(held.pop())
    finally:
        await close_pool(pool, grace_s=5)


async def test_a_stopping_process_terminates_connections_still_held(pg_dsn: str) -> None:
    pool = await create_pool(pg_dsn, min_size=1, max_size=2)
    conn = await pool.acquire()  # never released: Pool.close alone waits for ever
    await asyncio.wait_for(close_pool(pool, grace_s=0.5), 10)
    assert pool.is_closing()
    with pytest.raises(Exception, match="released back to the pool"):
        await conn.fetchval("SELECT 1")  # the held connection was taken away
