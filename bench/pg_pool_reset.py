"""Pooled Postgres statements with and without asyncpg's reset on release.

Run: ``python bench/pg_pool_reset.py [--rounds 3] [--queries 4000]``. Launches an embedded
PostgreSQL and times, at concurrency 1 and 16, the statements memstream's routes make most
(a point read of a thread record, ``Accounts.get_thread``; a one-row ``UPDATE``, each its
own transaction) through two pools of the same size on the same server, interleaved by
round:

- ``before``: asyncpg's own ``Connection``, which sends ``pg_advisory_unlock_all(); CLOSE
  ALL; UNLISTEN *; RESET ALL`` every time a connection goes back to the pool;
- ``now``: memstream's :func:`~memstream.infra.postgres.create_pool`
  (``PooledConnection``: that statement only for a connection marked as keeping session
  state, which none of these are).

Prints statements/s and this process's CPU per statement (the server's is not counted), the
medians over the rounds, and now / before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.postgres import create_pool

Statement = Callable[[asyncpg.Pool, int], Awaitable[object]]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _read(pool: asyncpg.Pool, i: int) -> object:
    return await pool.fetchrow(
        "SELECT metadata, deleted, owner_user FROM t WHERE account_id=$1 AND thread_id=$2",
        "acct",
        f"t{i % 100}",
    )


async def _update(pool: asyncpg.Pool, i: int) -> object:
    return await pool.execute(
        "UPDATE t SET deleted = NOT deleted WHERE account_id=$1 AND thread_id=$2",
        "acct",
        f"t{i % 100}",
    )


async def _time(pool: asyncpg.Pool, stmt: Statement, conc: int, n: int) -> tuple[float, float]:
    """(statements/s, µs of this process's CPU a statement) of ``n`` over ``conc`` tasks."""
    per = max(1, n // conc)

    async def one(c: int) -> None:
        for i in range(per):
            await stmt(pool, c * per + i)

    c0, t0 = _cpu(), time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(conc)))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return conc * per / wall, cpu / (conc * per) * 1e6


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp))
        await pg.start()
        try:
            now = await create_pool(pg.dsn, max_size=16)
            before = await asyncpg.create_pool(pg.dsn, min_size=1, max_size=16)
            await now.execute(
                "CREATE TABLE t (account_id text, thread_id text, metadata jsonb,"
                " deleted bool NOT NULL DEFAULT false, owner_user text,"
                " PRIMARY KEY (account_id, thread_id))"
            )
            await now.execute(
                "INSERT INTO t SELECT 'acct', 't' || i, '{}'::jsonb, false, NULL"
                " FROM generate_series(0, 99) AS i"
            )
            pools = {"before": before, "now": now}
            results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
            for r in range(args.rounds + 1):  # round 0 warms up (connections, plans)
                for stmt_name, stmt in (("point read", _read), ("one-row update", _update)):
                    for conc in (1, 16):
                        order = list(pools) if r % 2 else list(reversed(pools))
                        for name in order:
                            got = await _time(pools[name], stmt, conc, args.queries)
                            if r:
                                results.setdefault((stmt_name, name, conc), []).append(got)
            load1, load5, _ = os.getloadavg()
            print(
                f"{args.queries} statements per path, {args.rounds} rounds (medians);"
                f" load average {load1:.1f} / {load5:.1f}"
            )
            print(f"{'statement':16s} {'conc':>4s} {'path':7s} {'stmts/s':>9s} {'µs CPU':>7s}")
            for stmt_name in ("point read", "one-row update"):
                for conc in (1, 16):
                    med = {}
                    for name in pools:
                        rows = results[(stmt_name, name, conc)]
                        med[name] = (
                            statistics.median(x[0] for x in rows),
                            statistics.median(x[1] for x in rows),
                        )
                        print(
                            f"{stmt_name:16s} {conc:4d} {name:7s} {med[name][0]:9.0f}"
                            f" {med[name][1]:7.1f}"
                        )
                    print(
                        f"{'':16s} {'':4s} now / before: {med['now'][0] / med['before'][0]:.2f}x"
                        f" the statements, {med['now'][1] / med['before'][1]:.2f}x the CPU"
                    )
            await before.close()
            await now.close()
        finally:
            await pg.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--queries", type=int, default=4000)
    asyncio.run(main(ap.parse_args()))
