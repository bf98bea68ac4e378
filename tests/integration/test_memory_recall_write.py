"""Recall's Postgres side against a real embedded Postgres: the candidate fetch and the
one-statement recall-counter bump (``MemoryService._fetch_hits`` / ``_mark_recalled``).

- concurrent recalls of the same entries lose no bump, and every ``memory.recalled`` event
  carries exactly the row it produced (versions strictly increasing);
- an entry changed between the fetch and the bump is bumped on its new version (the
  locking path), never written back over it;
- the plans hold without planner statistics (a freshly bulk-loaded table): one primary-key
  seek per candidate, a TID scan for the bump — not a scan of the agent's entries.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

import asyncpg
import pytest

from memstream.agents_ctx.memory import store as store_mod
from memstream.agents_ctx.memory.store import MemoryService, _Fetched
from memstream.clock import FixedClock
from memstream.infra.postgres import keeps_session_state
from memstream.schemas.events import decode, entry_of
from memstream.schemas.records import Caller, MemoryEntry
from tests.fixtures.binding import EVERY_AGENT_BOUND

pytestmark = pytest.mark.asyncio(loop_scope="session")

T0 = datetime(2026, 3, 1, tzinfo=UTC)
_agents = itertools.count(1)


def fresh_agent() -> Caller:
    return Caller("acc", f"rw{next(_agents)}", "u1")


async def recalled_events(pool: asyncpg.Pool, c: Caller) -> list[MemoryEntry]:
    rows = await pool.fetch(
        "SELECT event FROM memory_outbox WHERE account_id = $1 AND agent_id = $2 ORDER BY id",
        c.account_id,
        c.agent_id,
    )
    envs = [decode(bytes(r["event"])) for r in rows]
    return [entry_of(e) for e in envs if e.type == "memory.recalled"]


async def seed(svc: MemoryService, c: Caller, n: int) -> list[MemoryEntry]:
    out = []
    for i in range(n):
        r = await svc.store(
            c, f"fact{i}", f"the deploy window {i} is on Tuesday", "project_fact", "shared"
        )
        out.append(r.entry)
    return out


async def test_concurrent_recalls_lose_no_bump(pg_pool: asyncpg.Pool) -> None:
    svc = MemoryService(pg_pool, FixedClock(T0), binding=EVERY_AGENT_BOUND)
    c = fresh_agent()
    entries = await seed(svc, c, 3)
    hits = [((e.owner, e.key), 1.0) for e in entries]

    async def one_recall() -> None:
        fetched: dict[tuple[str, str], _Fetched] = {}
        scored = await svc._fetch_hits(c, hits, None, T0, fetched)
        await svc._mark_recalled(c, [e for e, _ in scored], T0, fetched)

    await asyncio.gather(*(one_recall() for _ in range(8)))
    rows = {e.key: e for e in await svc.list_visible(c)}
    assert {k: e.recall_count for k, e in rows.items()} == {"fact0": 8, "fact1": 8, "fact2": 8}
    events = await recalled_events(pg_pool, c)
    assert len(events) == 24
    for key, row in rows.items():
        mine = [e for e in events if e.key == key]
        assert sorted(e.recall_count for e in mine) == list(range(1, 9))
        last = max(mine, key=lambda e: e.version)
        assert last == row  # the event with the highest version is the row as it is
        assert len({e.version for e in mine}) == 8


async def test_an_entry_changed_after_the_fetch_is_bumped_on_its_new_version(
    pg_pool: asyncpg.Pool,
) -> None:
    svc = MemoryService(pg_pool, FixedClock(T0), binding=EVERY_AGENT_BOUND)
    c = fresh_agent()
    (old,) = await seed(svc, c, 1)
    fetched: dict[tuple[str, str], _Fetched] = {}
    scored = await svc._fetch_hits(c, [((old.owner, old.key), 1.0)], None, T0, fetched)
    replaced = await svc.store(
        c, old.key, "the deploy window moved to Thursday", "project_fact", "shared"
    )
    touched = await svc._mark_recalled(c, [e for e, _ in scored], T0, fetched)
    (row,) = await svc.list_visible(c)
    assert row.content == "the deploy window moved to Thursday"  # not written back
    assert row.recall_count == 1 and row.version > replaced.entry.version
    assert touched[(row.owner, row.key)] == row
    (event,) = await recalled_events(pg_pool, c)
    assert event == row


async def test_a_forgotten_entry_is_not_bumped(pg_pool: asyncpg.Pool) -> None:
    svc = MemoryService(pg_pool, FixedClock(T0), binding=EVERY_AGENT_BOUND)
    c = fresh_agent()
    (old,) = await seed(svc, c, 1)
    fetched: dict[tuple[str, str], _Fetched] = {}
    scored = await svc._fetch_hits(c, [((old.owner, old.key), 1.0)], None, T0, fetched)
    assert await svc.forget(c, old.key)
    assert await svc._mark_recalled(c, [e for e, _ in scored], T0, fetched) == {}
    assert await recalled_events(pg_pool, c) == []


async def test_plans_hold_without_statistics(pg_pool: asyncpg.Pool) -> None:
    c = fresh_agent()
    await pg_pool.execute(
        "INSERT INTO memory_entries (account_id, agent_id, owner, key, content, category, "
        "visibility, importance, content_hash, created_at, updated_at, version) "
        "SELECT $1, $2, '', 'k' || i, 'fact ' || i, 'project_fact', 'shared', 0.5, 'h', "
        "now(), now(), nextval('memory_version_seq') FROM generate_series(1, 3000) AS i",
        c.account_id,
        c.agent_id,
    )
    async with pg_pool.acquire() as conn:
        keeps_session_state(conn)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        try:
            fetch_plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN " + store_mod._FETCH_BY_REFS,
                    c.account_id,
                    c.agent_id,
                    None,
                    T0,
                    None,
                    ["", ""],
                    ["k1", "k2"],
                )
            )
            bump_plan = "\n".join(
                r[0]
                for r in await conn.fetch(
                    "EXPLAIN " + store_mod._BUMP_UNCHANGED,
                    [(0, 1)],
                    [1],
                    [2],
                    ["id"],
                    [b"{}"],
                    T0,
                    c.account_id,
                    c.agent_id,
                    "chan",
                )
            )
        finally:
            await conn.execute("RESET plan_cache_mode")
    assert "memory_entries_pkey" in fetch_plan, fetch_plan
    assert "Tid Scan on memory_entries" in bump_plan, bump_plan
    for plan in (fetch_plan, bump_plan):
        assert "Seq Scan on memory_entries" not in plan, plan
        assert "memory_entries_user" not in plan and "memory_entries_category" not in plan
