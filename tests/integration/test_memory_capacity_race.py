"""Capacity and key identity under truly concurrent writers (real Postgres, one connection
per writer): ``memory_store`` groups concurrent stores of one account into one transaction
(group commit, ``batch_store``) and takes the capacity lock only for the count and commit,
falling back to one transaction per store when a group would not fit; these check that no
path ever lets a category past its limit (entries expired by time not counted), never loses
or doubles a same-key write, and never deadlocks with the entries routes (import), which
take the same lock the same way."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest_asyncio

from memstream.agents_ctx.memory.entries import ImportReport
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
            status: str = (
                await svc.store(c, f"{category}{i}", f"fact {i}", category, "private")
            ).status
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
    assert isinstance(report, ImportReport)
    failures: list[Any] = [f["error"] for f in report.failed]  # each an error's to_dict()
    assert all(e["code"] == "capacity_exceeded" for e in failures), failures
    assert report.created + statuses.count("created") == 10  # 30 slots, 20 taken before
    n, _ = await rows_and_events(wide_pool, c)
    assert n == 30


# --- group commit: concurrent stores of one account share a transaction ---------------------
async def outbox_transactions(pool: asyncpg.Pool, c: Caller) -> int:
    """How many transactions wrote the agent's outbox rows (``created_at`` is the start time
    of the writing transaction, so rows of one transaction share it)."""
    n = await pool.fetchval(
        "SELECT count(DISTINCT created_at) FROM memory_outbox "
        "WHERE account_id = $1 AND agent_id = $2",
        c.account_id,
        c.agent_id,
    )
    return int(n)


async def test_concurrent_stores_of_one_agent_commit_together_each_with_its_own_answer(
    wide_pool: asyncpg.Pool,
) -> None:
    svc = svc_of(wide_pool)
    c = Caller("acc", f"group{next(_agents)}", "u1")
    await svc.store(c, "tea", "likes green tea", "user_profile", "private")
    await svc.store(c, "city", "lives in Lyon", "user_profile", "private")
    before = await outbox_transactions(wide_pool, c)
    calls = [(f"k{i}", f"fact {i}") for i in range(14)]
    calls += [("tea", "likes green tea"), ("city", "lives in Paris")]  # no-op, replace
    results = await asyncio.gather(
        *(svc.store(c, k, text, "user_profile", "private") for k, text in calls)
    )
    statuses = [r.status for r in results]
    assert statuses == ["created"] * 14 + ["unchanged", "replaced"]
    assert [r.entry.key for r in results] == [k for k, _ in calls]
    assert results[-1].entry.content == "lives in Paris"
    n, events = await rows_and_events(wide_pool, c)
    assert n == 16
    assert events[2:] and sorted(events[2:]) == sorted(
        [("memory.stored", f"k{i}") for i in range(14)] + [("memory.replaced", "city")]
    )
    versions = [r.entry.version for r in results]
    assert len(set(versions)) == 16
    # 15 writes in far fewer transactions than 15: they were grouped
    assert await outbox_transactions(wide_pool, c) - before < 8
    # what was answered is what is stored
    stored = {e.key: e for e in await svc.list_visible(c)}
    assert all(stored[r.entry.key] == r.entry for r in results)


async def test_entries_expired_by_time_leave_room_for_concurrent_stores(
    wide_pool: asyncpg.Pool,
) -> None:
    # 100 observations per user: 60 stored at T0 (they expire at T0 + 30 days), 40 at
    # T0 + 20 days; at T0 + 31 days 40 are live, so of 80 concurrent writers exactly 60 fit.
    clock = FixedClock(T0)
    svc = MemoryService(wide_pool, clock, binding=EVERY_AGENT_BOUND)
    c = Caller("acc", f"expiry{next(_agents)}", "u1")
    old = [svc.store(c, f"old{i}", f"old note {i}", "observation", "private") for i in range(60)]
    await asyncio.gather(*old)
    clock.set(T0 + timedelta(days=20))
    await asyncio.gather(
        *(svc.store(c, f"mid{i}", f"note {i}", "observation", "private") for i in range(40))
    )
    clock.set(T0 + timedelta(days=31))

    async def one(i: int) -> str:
        try:
            return (await svc.store(c, f"new{i}", f"new note {i}", "observation", "private")).status
        except CapacityExceeded:
            return "refused"

    statuses = await asyncio.gather(*(one(i) for i in range(80)))
    assert statuses.count("created") == 60 and statuses.count("refused") == 20
    live = await svc.list_visible(c, "observation")
    assert len(live) == 100


async def test_one_by_one_path_still_holds_the_limit(wide_pool: asyncpg.Pool) -> None:
    # The store of before (every store its own transaction) keeps the same guarantees.
    svc = MemoryService(wide_pool, FixedClock(T0), binding=EVERY_AGENT_BOUND, group_commit=False)
    c = Caller("acc", f"single{next(_agents)}", "u1")

    async def one(i: int) -> str:
        try:
            return (await svc.store(c, f"k{i}", f"fact {i}", "user_profile", "private")).status
        except CapacityExceeded:
            return "refused"

    statuses = await asyncio.gather(*(one(i) for i in range(WRITERS)))
    assert statuses.count("created") == 30
    n, events = await rows_and_events(wide_pool, c)
    assert n == 30 and len(events) == 30


async def test_a_full_agent_does_not_hold_back_the_group_of_another(
    wide_pool: asyncpg.Pool,
) -> None:
    # Stores of two agents of one account arrive together: one agent's category is full
    # for its user (30 user_profile entries), so its stores are refused; the other agent's
    # stores are still created together, in one transaction.
    svc = svc_of(wide_pool)
    full = Caller("acc", f"full{next(_agents)}", "u1")
    other = Caller("acc", f"other{next(_agents)}", "u1")
    for i in range(30):
        await svc.store(full, f"pre{i}", f"earlier fact {i}", "user_profile", "private")

    async def one(c: Caller, i: int) -> str:
        try:
            return (await svc.store(c, f"k{i}", f"fact {i}", "user_profile", "private")).status
        except CapacityExceeded:
            return "refused"

    calls = [one(full, i) for i in range(5)] + [one(other, i) for i in range(10)]
    statuses = await asyncio.gather(*calls)
    assert statuses == ["refused"] * 5 + ["created"] * 10
    assert (await rows_and_events(wide_pool, full))[0] == 30
    n, events = await rows_and_events(wide_pool, other)
    assert n == 10 and len(events) == 10
    assert await outbox_transactions(wide_pool, other) == 1


async def test_groups_of_two_processes_racing_on_the_same_new_keys_lose_nothing(
    wide_pool: asyncpg.Pool,
) -> None:
    # Two API processes (two services, two batchers) store the same 12 new keys at once:
    # each key is created once and replaced once, whichever group gets there first.
    a, b = svc_of(wide_pool), svc_of(wide_pool)
    c = Caller("acc", f"twoproc{next(_agents)}", None)
    for _ in range(3):
        tag = next(_agents)
        results = await asyncio.gather(
            *(
                a.store(c, f"r{tag}k{i}", f"a says {i}", "project_fact", "shared")
                for i in range(12)
            ),
            *(
                b.store(c, f"r{tag}k{i}", f"b says {i}", "project_fact", "shared")
                for i in range(12)
            ),
        )
        for i in range(12):
            pair = sorted([results[i].status, results[12 + i].status])
            assert pair == ["created", "replaced"]
            last = max(results[i], results[12 + i], key=lambda r: r.entry.version)
            [row] = [e for e in await svc_of(wide_pool).list_visible(c) if e.key == f"r{tag}k{i}"]
            assert row.content == last.entry.content
    n, events = await rows_and_events(wide_pool, c)
    assert n == 36 and len(events) == 72
