"""Capacity and key identity under truly concurrent writers (real Postgres, one connection
per writer): ``memory_store`` takes the agent's capacity lock only for its count and commit
(``outbox.capacity_usage``), so these check that overlapping everything else never lets a
category past its limit, never loses or doubles a same-key write, and never deadlocks with
the entries routes (import), which take the same lock the same way."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import orjson
import pytest_asyncio

from memstream.agents_ctx.memory.store import MemoryService
from memstream.clock import FixedClock
from memstream.errors import CapacityExceeded
from memstream.schemas.events import decode, entry_of
from memstream.schemas.records import Caller
from tests.fixtures.binding import EVERY_AGENT_BOUND
from tests.fixtures.stores import fresh_database

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WRITERS = 40
_agents = itertools.count(1)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def wide_pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool with a connection for every writer, so all 40 transactions overlap."""
    from memstream.infra.postgres import create_pool, migrate

    pool = await create_pool(await fresh_database(pg_dsn), min_size=WRITERS, max_size=WRITERS)
    await migrate(pool)
    yield pool
    await pool.close()


def svc_of(pool: asyncpg.Pool) -> MemoryService:
    return MemoryService(pool, FixedClock(T0), binding=EVERY_AGENT_BOUND)


async def rows_and_events(pool: asyncpg.Pool, c: Caller) -> tuple[int, list[tuple[str, str]]]:
    n = await pool.fetchval(
        "SELECT count(*) FROM memory_entries WHERE account_id = $1 AND agent_id = $2",
        c.account_id,
        c.agent_id,
    )
    rows = await pool.fetch(
        "SELECT event FROM memory_outbox WHERE account_id = $1 AND agent_id = $2 ORDER BY id",
        c.account_id,
        c.agent_id,
    )
    envs = [decode(bytes(r["event"])) for r in rows]
    return int(n), [(e.type, entry_of(e).key) for e in envs]


async def test_40_concurrent_writers_for_30_slots_never_exceed_capacity(
    wide_pool: asyncpg.Pool,
) -> None:
    svc = svc_of(wide_pool)
    for _ in range(5):  # several rounds: each interleaves differently
        c = Caller("acc", f"race{next(_agents)}", "u1")
        start = asyncio.Event()

        async def one(i: int, c: Caller = c, start: asyncio.Event = start) -> str:
            await start.wait()
            try:
                return (await svc.store(c, f"k{i}", f"fact {i}", "user_profile", "private")).status
            except CapacityExceeded:
                return "refused"

        tasks = [asyncio.create_task(one(i)) for i in range(WRITERS)]
        await asyncio.sleep(0)
        start.set()
        statuses = await asyncio.gather(*tasks)
        assert statuses.count("created") == 30
        assert statuses.count("refused") == WRITERS - 30
        n, events = await rows_and_events(wide_pool, c)
        assert n == 30
        # one event per committed entry; a refused store left no event behind
        assert len(events) == 30 and {t for t, _ in events} == {"memory.stored"}


async def test_two_categories_filled_at_once_each_stop_at_their_own_limit(
    wide_pool: asyncpg.Pool,
) -> None:
    # The capacity lock is per category: writers of two categories of one user run at the
    # same time, and each category still stops exactly at its limit (30 and 50 per user).
    svc = svc_of(wide_pool)
    c = Caller("acc", f"two{next(_agents)}", "u1")
    start = asyncio.Event()
    plan = [("user_profile", i) for i in range(40)] + [("project_fact", i) for i in range(60)]

    async def one(category: str, i: int) -> tuple[str, str]:
        await start.wait()
        try:
            status = (await svc.store(c, f"{category}{i}", f"fact {i}", category, "private")).status
        except CapacityExceeded:
            status = "refused"
        return category, status

    tasks = [asyncio.create_task(one(cat, i)) for cat, i in plan]
    await asyncio.sleep(0)
    start.set()
    results = await asyncio.gather(*tasks)
    created = [cat for cat, status in results if status == "created"]
    assert created.count("user_profile") == 30 and created.count("project_fact") == 50
    assert len(results) - len(created) == 10 + 10  # the others refused
    n, events = await rows_and_events(wide_pool, c)
    assert n == 80 and len(events) == 80


async def test_concurrent_stores_of_one_new_key_are_neither_lost_nor_doubled(
    wide_pool: asyncpg.Pool,
) -> None:
    svc = svc_of(wide_pool)
    c = Caller("acc", f"samekey{next(_agents)}", None)
    results = await asyncio.gather(
        *(svc.store(c, "k", f"version {i}", "project_fact", "shared") for i in range(20))
    )
    statuses = [r.status for r in results]
    assert statuses.count("created") == 1 and statuses.count("replaced") == 19
    n, events = await rows_and_events(wide_pool, c)
    assert n == 1
    assert [t for t, _ in events].count("memory.stored") == 1
    assert [t for t, _ in events].count("memory.replaced") == 19
    # the last write in version order is the row that stays
    last = max(results, key=lambda r: r.entry.version)
    [entry] = await svc.list_visible(c)
    assert entry.content == last.entry.content and entry.version == last.entry.version


async def test_stores_racing_an_import_of_the_same_agent_keep_capacity_and_finish(
    wide_pool: asyncpg.Pool,
) -> None:
    """Import lines and stores compete for the last slots of one category; both take the
    capacity lock last, so nobody deadlocks and the limit holds."""
    svc = svc_of(wide_pool)
    c = Caller("acc", f"mixed{next(_agents)}", "u1")
    for i in range(20):
        await svc.store(c, f"pre{i}", f"earlier fact {i}", "user_profile", "private")

    async def lines() -> AsyncIterator[bytes]:
        for i in range(15):
            yield orjson.dumps(
                {
                    "key": f"imp{i}",
                    "content": f"imported fact {i}",
                    "category": "user_profile",
                    "visibility": "private",
                    "user_id": "u1",
                }
            )

    async def store(i: int) -> str:
        try:
            return (
                await svc.store(c, f"st{i}", f"stored fact {i}", "user_profile", "private")
            ).status
        except CapacityExceeded:
            return "refused"

    report, *statuses = await asyncio.wait_for(
        asyncio.gather(svc.entries.import_lines(c, lines()), *(store(i) for i in range(15))),
        timeout=60,
    )
    failures = [f["error"] for f in report.failed]  # type: ignore[index]
    assert all(e["code"] == "capacity_exceeded" for e in failures), failures
    assert report.created + statuses.count("created") == 10  # 30 slots, 20 taken before
    n, _ = await rows_and_events(wide_pool, c)
    assert n == 30
