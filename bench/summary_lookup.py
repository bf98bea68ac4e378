"""Bench: the summary-store lookup the counters processor makes for every thread new to
Redis (``SummaryStore.get_stored``), against the two reads it made before (``summary.json``
then ``summary.v1.json``, each a raised not-found for a new thread), in the same process,
interleaved rounds, on a local object store folder (``get_stored`` lists the thread's folder
by a blocking call on a worker thread); and ``SummaryStore.stored_many`` (what the counters
call: a batch's new threads listed on one worker thread). Also a thread that has a summary
(the listing is one call more there). Prints µs per lookup (wall and this process's CPU)
and the ratio; asserts nothing. Run: ``python bench/summary_lookup.py [--threads 1000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.summary_store import SummaryStore, summary_path, version_path
from memstream.schemas.records import Summary, ThreadRef

#: a summary lookup of the store (before's or after's)
Lookup = Callable[[SummaryStore, ThreadRef], Awaitable[Summary | None]]


async def two_reads(store: SummaryStore, ref: ThreadRef) -> Summary | None:
    """The lookup before this change: read ``summary.json``, then probe the next version."""
    latest = await store._read(summary_path(ref))  # noqa: SLF001 - the old code path itself
    version = latest.version if latest is not None else 0
    newest = latest
    while True:
        nxt = await store._read(version_path(ref, version + 1))  # noqa: SLF001
        if nxt is None:
            return newest
        newest, version = nxt, nxt.version


async def timed(
    fn: Callable[[ThreadRef], Awaitable[object]], refs: list[ThreadRef], conc: int
) -> tuple[float, float]:
    """(wall µs, CPU µs) per lookup, ``conc`` lookups at once (the processor's 32)."""
    slots = asyncio.Semaphore(conc)

    async def one(ref: ThreadRef) -> None:
        async with slots:
            await fn(ref)

    w0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one(r) for r in refs))
    w1, c1 = time.perf_counter(), time.process_time()
    return (w1 - w0) / len(refs) * 1e6, (c1 - c0) / len(refs) * 1e6


async def main(threads: int, rounds: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="summary-lookup-"))
    # the writes of the summarized threads also fill the Redis cache (the reads timed here
    # bypass it): an embedded Valkey of the bench's own, stopped at the end
    server = EmbeddedRedis(root / "valkey")
    await server.start()
    try:
        redis = aioredis.Redis.from_url(server.url)
        await _run(
            SummaryStore(LocalStore(prefix=root / "objects", mkdir=True), redis), threads, rounds
        )
        await redis.aclose()
    finally:
        await server.stop()


async def _run(store: SummaryStore, threads: int, rounds: int) -> None:
    now = datetime.now(UTC)
    known = [ThreadRef("acc", "agent", f"known-{i}") for i in range(threads // 10)]
    for ref in known:
        s = Summary(
            version=1,
            timestamp=now,
            last_message_offset=49,
            last_message_id="m49",
            content="a summary",
            token_count=3,
            message_count=50,
        )
        await store.write(ref, s, 0)
    print(f"{threads} new threads, {len(known)} with a summary; load {os.getloadavg()[0]:.1f}")
    rows: dict[str, list[tuple[float, float]]] = {}

    def bound(fn: Lookup) -> Callable[[ThreadRef], Awaitable[Summary | None]]:
        return lambda ref: fn(store, ref)

    async def batched(refs: list[ThreadRef]) -> tuple[float, float]:
        """(wall µs, CPU µs) per lookup through ``stored_many``, 500 threads a call (a
        counters batch of new threads)."""
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(refs), 500):
            await store.stored_many(refs[i : i + 500])
        w1, c1 = time.perf_counter(), time.process_time()
        return (w1 - w0) / len(refs) * 1e6, (c1 - c0) / len(refs) * 1e6

    for r in range(rounds):
        new = [ThreadRef("acc", "agent", f"new-{r}-{i}") for i in range(threads)]
        order: list[tuple[str, Lookup]] = [
            ("before", two_reads),
            ("after", SummaryStore.get_stored),
        ]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            rows.setdefault(f"new, {name}", []).append(await timed(bound(fn), new, 32))
            rows.setdefault(f"summarized, {name}", []).append(await timed(bound(fn), known, 32))
        batch = [ThreadRef("acc", "agent", f"batch-{r}-{i}") for i in range(threads)]
        rows.setdefault("new, stored_many", []).append(await batched(batch))
        rows.setdefault("summarized, stored_many", []).append(await batched(known))
    med = {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in rows.items()
    }
    for k, (w, c) in med.items():
        print(f"  {k:18s} {w:8.1f} µs wall  {c:8.1f} µs CPU per lookup")
    for kind in ("new", "summarized"):
        b, a, m = med[f"{kind}, before"], med[f"{kind}, after"], med[f"{kind}, stored_many"]
        print(f"  {kind}: after/before wall {a[0] / b[0]:.2f}x, CPU {a[1] / b[1]:.2f}x")
        print(f"  {kind}: stored_many/after wall {m[0] / a[0]:.2f}x, CPU {m[1] / a[1]:.2f}x")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    asyncio.run(main(a.threads, a.rounds))
