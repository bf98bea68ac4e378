"""memory_store throughput against embedded Postgres, vs the raw engine, before vs after.

Run: ``python bench/memory_store.py [--rounds 10] [--n1 60] [--n4 100] [--n16 160]``. Launches an
embedded PostgreSQL (fsync on), applies the migrations, then, for each round and at
concurrency 1, 4 and 16, runs these paths one after another in an order that rotates by round
(so before and after see the same machine, interleaved):

- ``raw``: one ``INSERT`` of an entry row plus one outbox ``INSERT`` in one transaction,
  no rules (the engine's ceiling for what a store writes);
- ``before, one agent`` / ``after, one agent``: ``memory_store`` of one agent into ONE
  category (``observation``; a fresh agent per round, under its 500 limit);
- ``before, 50 agents`` / ``after, 50 agents``: the same spread over 50 agents.

"before" is main's code path (``MemoryService(group_commit=False)``: every store its own
transaction, the capacity lock held for the count and the commit); "after" is the default
(group commit: concurrent stores of one account share a transaction). Prints ops/s per round,
the ratio to that round's raw, and the median ratio over the rounds. At concurrency 1 the
rounds also time the no-op store (same key, identical content, before and after). Last,
recall latency (keyword fallback).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

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

Op = Callable[[int], Awaitable[object]]

ORDER = [
    "raw",
    "before, one agent",
    "after, one agent",
    "before, 50 agents",
    "after, 50 agents",
    "before, no-op",
    "after, no-op",
]


def content(i: int) -> str:
    return f"fact {i}: the team " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(8))


async def run_concurrent(n: int, conc: int, op: Op) -> float:
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


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


async def main(rounds: int, n1: int, n4: int, n16: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp))
        await pg.start()
        try:
            pool = await create_pool(pg.dsn, max_size=20)
            await migrate(pool)
            accounts = Accounts(pool)
            svcs = {
                "before": MemoryService(pool, SystemClock(), binding=accounts, group_commit=False),
                "after": MemoryService(pool, SystemClock(), binding=accounts),
            }
            await accounts.ensure_account("b")
            for path in svcs:
                for conc in (1, 4, 16):
                    for r in range(rounds):
                        for agent in [f"{path}-one{conc}-{r}"] + [
                            f"{path}-many{conc}-{r}-{j}" for j in range(50)
                        ]:
                            await accounts.configure_agent("b", agent, memory=True)
            await accounts.configure_agent("b", "noop", memory=True)
            for i in range(n1):  # the keys the no-op paths store again, unchanged
                await svcs["before"].store(
                    Caller("b", "noop", None), f"k{i}", content(i), "observation", "shared"
                )
            print(
                f"memory_store ops/s, {rounds} rounds, {n1} ops per path at concurrency 1, "
                f"{n4} at 4, {n16} at 16; load average at start {load()}"
            )

            def store(path: str, agent: Callable[[int], str]) -> Op:
                svc = svcs[path]
                return lambda i: svc.store(
                    Caller("b", agent(i), None), f"k{i}", content(i), "observation", "shared"
                )

            def raw_op(prefix: str) -> Op:
                return lambda i: raw_insert(pool, f"{prefix}-{i % 50}", i)

            def one(name: str) -> Callable[[int], str]:
                return lambda i: name

            def many(prefix: str) -> Callable[[int], str]:
                return lambda i: f"{prefix}-{i % 50}"

            ratios: dict[tuple[int, str], list[float]] = {}
            figures: dict[tuple[int, str], list[float]] = {}
            for conc, n in ((1, n1), (4, n4), (16, n16)):
                for r in range(rounds):
                    paths: dict[str, Op] = {
                        "raw": raw_op(f"raw{conc}-{r}"),
                        "before, one agent": store("before", one(f"before-one{conc}-{r}")),
                        "after, one agent": store("after", one(f"after-one{conc}-{r}")),
                        "before, 50 agents": store("before", many(f"before-many{conc}-{r}")),
                        "after, 50 agents": store("after", many(f"after-many{conc}-{r}")),
                    }
                    if conc == 1:  # same key, identical content: the no-op, on n1 keys
                        paths["before, no-op"] = store("before", one("noop"))
                        paths["after, no-op"] = store("after", one("noop"))
                    names = list(paths)
                    shift = r % len(names)
                    got: dict[str, float] = {}
                    for name in names[shift:] + names[:shift]:
                        got[name] = await run_concurrent(n, conc, paths[name])
                    raw = got["raw"]
                    line = " | ".join(
                        f"{name} {ops:6.0f}/s" + ("" if name == "raw" else f" ({ops / raw:.2f}x)")
                        for name, ops in got.items()
                    )
                    print(f"  c={conc:>2} round {r + 1}: {line}")
                    for name, ops in got.items():
                        figures.setdefault((conc, name), []).append(ops)
                        ratios.setdefault((conc, name), []).append(ops / raw)
            print(f"median over rounds (ops/s, ratio to the same round's raw); load {load()}")
            for conc in (1, 4, 16):
                cells = []
                for name in sorted({n for c, n in figures if c == conc}, key=ORDER.index):
                    ops = statistics.median(figures[(conc, name)])
                    rt = statistics.median(ratios[(conc, name)])
                    cells.append(f"{name} {ops:6.0f}/s" + ("" if name == "raw" else f" {rt:.2f}x"))
                print(f"  c={conc:>2}: " + " | ".join(cells))
            caller = Caller("b", "after-one1-0", None)
            lat = []
            for i in range(200):
                t0 = time.perf_counter()
                await svcs["after"].recall(caller, f"{WORDS[i % len(WORDS)]} release")
                lat.append((time.perf_counter() - t0) * 1000)
            lat.sort()
            print(
                f"memory_recall (keyword fallback, {n1} entries): "
                f"p50 {statistics.median(lat):.2f} ms, p99 {lat[int(len(lat) * 0.99) - 1]:.2f} ms"
            )
            await pool.close()
        finally:
            await pg.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n1", type=int, default=60, help="ops per path at concurrency 1")
    ap.add_argument("--n4", type=int, default=100, help="ops per path at concurrency 4")
    ap.add_argument("--n16", type=int, default=160, help="ops per path at concurrency 16 (<= 500)")
    a = ap.parse_args()
    asyncio.run(main(a.rounds, a.n1, a.n4, a.n16))
