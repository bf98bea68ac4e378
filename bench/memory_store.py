"""memory_store throughput against embedded Postgres, vs the raw engine.

Run: ``python bench/memory_store.py [--n 2000]``. Launches an embedded PostgreSQL, applies the
migrations, then measures:

- ``memory_store`` ops/s (validation, screening, the read of the key, the write and the
  outbox row, then the agent's capacity lock and count, one transaction each) at
  concurrency 1 and 16, spread over many agents (the lock is per agent) and within one agent;
- "before": the previous store, which took the agent's lock first and held it through the
  whole transaction (every store of one agent serialised end to end), rebuilt here from the
  same rules and SQL, in the same run;
- the raw ceiling: one ``INSERT`` of the same row plus one outbox ``INSERT`` in one
  transaction, no rules, at the same concurrency;
- ``memory_recall`` (keyword fallback) latency p50/p99 over an agent with 500 entries.

Prints figures and the ratio store / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Final

import asyncpg

from memstream.agents_ctx.memory import policy
from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    append_events,
    capacity_usage,
    entry_of_row,
    write_entry_if,
)
from memstream.agents_ctx.memory.store import MemoryService
from memstream.clock import SystemClock
from memstream.infra.accounts import Accounts
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.postgres import create_pool, migrate
from memstream.schemas.records import Caller

WORDS = [
    "deploy",
    "build",
    "cache",
    "postgres",
    "kafka",
    "review",
    "python",
    "rust",
    "team",
    "friday",
    "release",
    "notes",
]


def content(i: int) -> str:
    return f"fact {i}: the team " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(8))


async def run_concurrent(n: int, conc: int, op) -> float:  # type: ignore[no-untyped-def]
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            await op(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return n / (time.perf_counter() - t0)


async def raw_insert(pool: asyncpg.Pool, agent: str, i: int) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO memory_entries (account_id, agent_id, owner, key, content, category, "
            "visibility, importance, content_hash, created_at, updated_at, version) "
            "VALUES ('raw', $1, '', $2, $3, 'observation', 'shared', 0.5, 'h', now(), now(), "
            "nextval('memory_version_seq'))",
            agent,
            f"k{i}",
            content(i),
        )
        await conn.execute(
            "INSERT INTO memory_outbox (account_id, agent_id, event_id, event) "
            "VALUES ('raw', $1, $2, $3)",
            agent,
            f"e{i}",
            content(i).encode(),
        )


async def store_lock_first(pool: asyncpg.Pool, c: Caller, key: str, text: str) -> None:
    """The store before issue 15: the agent's lock first, held through every statement."""
    req = policy.check_store(
        key=key,
        content=text,
        category="observation",
        scope="shared",
        importance=None,
        user_id=c.user_id,
    )
    now = SystemClock().now()
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{c.account_id}/{c.agent_id}"
        )
        row = await conn.fetchrow(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE account_id = $1 "
            "AND agent_id = $2 AND owner = $3 AND key = $4 FOR UPDATE",
            c.account_id,
            c.agent_id,
            req.owner,
            req.key,
        )
        existing = None if row is None else entry_of_row(row)
        entry = policy.new_entry(req, c.account_id, c.agent_id, now, version=0)
        usage = await capacity_usage(conn, entry, now, without_itself=True)  # lock re-entered
        action = policy.decide_store(req, existing, usage, now)
        assert action == "create"
        written = await write_entry_if(conn, entry, None)
        assert written is not None
        await append_events(conn, "memory.stored", [written], now)


CATEGORIES: Final = ("user_profile", "project_fact", "observation")


async def store_agent_lock(
    pool: asyncpg.Pool, c: Caller, key: str, text: str, category: str
) -> None:
    """The store of before the per-category lock: the same steps as ``MemoryService.store``
    (key read, write, outbox row, then the lock and count), with the agent's lock taken
    right before the count (so every category of the agent shares one lock)."""
    req = policy.check_store(
        key=key,
        content=text,
        category=category,
        scope="shared",
        importance=None,
        user_id=c.user_id,
    )
    now = SystemClock().now()
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE account_id = $1 "
            "AND agent_id = $2 AND owner = $3 AND key = $4 FOR UPDATE",
            c.account_id,
            c.agent_id,
            req.owner,
            req.key,
        )
        assert row is None
        entry = policy.new_entry(req, c.account_id, c.agent_id, now, version=0)
        written = await write_entry_if(conn, entry, None)
        assert written is not None
        await append_events(conn, "memory.stored", [written], now)
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"{c.account_id}/{c.agent_id}"
        )
        usage = await capacity_usage(conn, written, now, without_itself=True)
        policy.check_capacity(req.category, req.user_id, usage)


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp))
        await pg.start()
        try:
            pool = await create_pool(pg.dsn, max_size=20)
            await migrate(pool)
            accounts = Accounts(pool)
            svc = MemoryService(pool, SystemClock(), binding=accounts)
            await accounts.ensure_account("b")
            agents = [f"many{c}-{j}" for c in (1, 16) for j in range(50)]
            for agent in agents + ["one1", "one16", "before1", "before16", "mixed", "mixedb"]:
                await accounts.configure_agent("b", agent, memory=True)  # the tools need it
            print(f"memory_store, {n} ops each (observation category, capacity 500 per agent)")
            for conc in (1, 16):
                raw = await run_concurrent(
                    n, conc, lambda i, c=conc: raw_insert(pool, f"raw{c}-{i % 50}", i)
                )
                many = await run_concurrent(
                    n,
                    conc,
                    lambda i, c=conc: svc.store(
                        Caller("b", f"many{c}-{i % 50}", None),
                        f"k{i}",
                        content(i),
                        "observation",
                        "shared",
                    ),
                )
                one = await run_concurrent(
                    min(n, 450),
                    conc,
                    lambda i, c=conc: svc.store(
                        Caller("b", f"one{c}", None), f"k{i}", content(i), "observation", "shared"
                    ),
                )
                before = await run_concurrent(
                    min(n, 450),
                    conc,
                    lambda i, c=conc: store_lock_first(
                        pool, Caller("b", f"before{c}", None), f"k{i}", content(i)
                    ),
                )
                print(
                    f"  concurrency {conc:>2}: raw insert+outbox {raw:8.0f}/s | "
                    f"store, many agents {many:8.0f}/s ({many / raw:.2f}x raw) | "
                    f"store, one agent: before (lock first) {before:8.0f}/s "
                    f"({before / raw:.2f}x raw), after (lock last) {one:8.0f}/s "
                    f"({one / raw:.2f}x raw)"
                )
            # One agent, its stores spread over the three categories (90 each, under every
            # limit), concurrency 16: the capacity lock per (agent, category) of now against
            # the agent-wide lock of before (same steps otherwise), interleaved.
            m = 270
            mixed_after, mixed_before = [], []
            for r in range(2):
                mixed_before.append(
                    await run_concurrent(
                        m // 2,
                        16,
                        lambda i, r=r: store_agent_lock(
                            pool,
                            Caller("b", "mixedb", None),
                            f"r{r}k{i}",
                            content(i),
                            CATEGORIES[i % 3],
                        ),
                    )
                )
                mixed_after.append(
                    await run_concurrent(
                        m // 2,
                        16,
                        lambda i, r=r: svc.store(
                            Caller("b", "mixed", None),
                            f"r{r}k{i}",
                            content(i),
                            CATEGORIES[i % 3],
                            "shared",
                        ),
                    )
                )
            raw16 = await run_concurrent(n, 16, lambda i: raw_insert(pool, f"rawm-{i % 50}", i))
            b, a = statistics.mean(mixed_before), statistics.mean(mixed_after)
            print(
                f"  one agent, 3 categories, concurrency 16: raw {raw16:8.0f}/s | agent lock "
                f"(before) {b:8.0f}/s ({b / raw16:.2f}x raw) | lock per category (now) "
                f"{a:8.0f}/s ({a / raw16:.2f}x raw)"
            )
            unchanged = await run_concurrent(
                450,
                1,
                lambda i: svc.store(
                    Caller("b", "one1", None), f"k{i}", content(i), "observation", "shared"
                ),
            )
            print(f"  same key + identical content (no-op): {unchanged:8.0f}/s")
            caller = Caller("b", "one1", None)
            lat = []
            for i in range(200):
                t0 = time.perf_counter()
                await svc.recall(caller, f"{WORDS[i % len(WORDS)]} release")
                lat.append((time.perf_counter() - t0) * 1000)
            lat.sort()
            print(
                f"memory_recall (keyword fallback, 450 entries): p50 {statistics.median(lat):.2f} ms,"
                f" p99 {lat[int(len(lat) * 0.99) - 1]:.2f} ms"
            )
            await pool.close()
        finally:
            await pg.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    asyncio.run(main(ap.parse_args().n))
