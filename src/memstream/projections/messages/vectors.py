"""The dense side of the message projection: one vector per stored message.

The message projector writes rows at thousands per second; the offline embedder turns tens
to a few hundred texts a second into vectors on this hardware (docs/transcript-search.md).
Embedding inline would cap the projector at the embedder's rate, so this step runs *behind*
it: :meth:`MessageVectors.step` reads stored messages that have no vector of the current
model yet (an anti-join, :func:`~.sql.pending_vectors_sql`), embeds them in one batch and
inserts the vectors into ``message_vectors``. Search fuses whatever vectors exist with BM25;
a message without one yet is found by BM25 alone, never lost.

Guarantees:

- Needs no bookkeeping: rows of a table that predates the dense side, of a replay or of a
  restart are found by the same anti-join, so a rebuilt projection gets the same vectors
  (the embedder is deterministic) and so the same rankings.
- Never writes a vector for a thread erased before the insert (the store's registry of
  erased threads is checked after embedding); erasure deletes the thread's vectors with its
  messages (:meth:`~.store.MessageStore.erase_thread`).
- With a vector index (embedded chdb: :mod:`~.vector_index`), each batch is upserted there
  first, then inserted into ``message_vectors``; once enough points are in no HNSW graph,
  the step starts building them in the background (:meth:`~.vector_index.VectorIndex.build`,
  a child process); embedding and searches go on meanwhile.
- Vectors are not put in any persistent embedding cache: they are derived from message text,
  and the only copy is the row erasure deletes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

import pyarrow as pa

from memstream.infra.embeddings import Embedder
from memstream.projections.messages.sql import pending_vectors_sql
from memstream.projections.messages.store import MessageStore
from memstream.projections.messages.vector_index import DenseIndex, VectorRow

log = logging.getLogger(__name__)

BATCH: Final = 64
"""Messages embedded per step: one embedder call (the C engine uses every core per batch)."""
IDLE_S: Final = 0.5
"""How long :meth:`MessageVectors.run` waits when nothing is pending."""
QUIET_S: Final = 2.0
"""How long the messages table must hold still (no rows projected) before a batch is embedded."""
BUILD_RETRY_S: Final = 300.0
"""How long after a failed graph build the next one is tried."""
MAX_DEFER_S: Final = 30.0
"""Under sustained appends, a batch is still embedded this long after the previous one."""

VECTORS_SCHEMA: Final = pa.schema(
    [
        ("account_id", pa.string()),
        ("agent_id", pa.string()),
        ("thread_id", pa.string()),
        ("offset", pa.uint64()),
        ("model", pa.string()),
        ("vec", pa.list_(pa.float32())),
    ]
)


class MessageVectors:
    """Embeds stored messages that have no vector yet (see the module docstring)."""

    def __init__(self, store: MessageStore, embedder: Embedder, *, batch: int = BATCH) -> None:
        self.store = store
        self.embedder = embedder
        self.batch = batch
        self.embedded = 0
        self._build_retry_at = 0.0
        self._building: asyncio.Task[None] | None = None

    async def step(self) -> int:
        """Embed and store one batch of pending messages; returns how many vectors were
        written (0: caught up)."""
        rows = await self.store.engine.rows(
            pending_vectors_sql(self.store.database),
            {"model": self.embedder.model, "n": self.batch},
        )
        if not rows:
            await self._build(self.store.vector_index(self.embedder.model))  # once caught up
            return 0
        keys = [(str(r[0]), str(r[1]), str(r[2]), int(str(r[3]))) for r in rows]
        vecs = await self.embedder.embed([str(r[4]) for r in rows])
        if len(self.store.erased):
            await self.store.erased.refresh()
        kept = [(k, v) for k, v in zip(keys, vecs, strict=True) if k[:3] not in self.store.erased]
        index = self.store.vector_index(self.embedder.model)
        if kept and index is not None:
            # the index first: a crash before the row leaves a point the next step writes
            # again, never a row the index lacks (vector_index's guarantees)
            await index.upsert([VectorRow(*k, v) for k, v in kept])
        if kept:
            table = pa.table(
                [
                    [k[0] for k, _ in kept],
                    [k[1] for k, _ in kept],
                    [k[2] for k, _ in kept],
                    [k[3] for k, _ in kept],
                    [self.embedder.model] * len(kept),
                    [v for _, v in kept],
                ],
                schema=VECTORS_SCHEMA,
            )
            await self.store.engine.insert_arrow(self.store.database, "message_vectors", table)
        self.embedded += len(kept)
        await self._build(index)
        return len(kept)

    async def _build(self, index: DenseIndex | None) -> None:
        """Start building the index's HNSW graphs, once enough points are in none (a child
        process, in the background: minutes at 1M; see :meth:`VectorIndex.build`). The loop
        embeds on meanwhile (its writes reach the built shard too) and searches scan the
        points not in a graph. A failed build is logged and tried again
        :data:`BUILD_RETRY_S` later."""
        now = asyncio.get_running_loop().time()
        if index is None or not index.ready or now < self._build_retry_at:
            return
        if self._building is not None and not self._building.done():
            return
        self._building = asyncio.create_task(self._build_now(index), name="vector-index-build")

    async def _build_now(self, index: DenseIndex) -> None:
        try:
            if await index.build():
                log.info("vector index of %s: HNSW graphs built", self.store.database)
        except Exception:
            log.exception("vector index of %s: building its graphs failed", self.store.database)
            self._build_retry_at = asyncio.get_running_loop().time() + BUILD_RETRY_S

    async def built(self) -> None:
        """Wait for the graph build in progress, if any (tests, benches)."""
        if self._building is not None:
            await self._building

    async def stop_building(self) -> None:
        """Cancel the graph build in progress (its child is killed; the shard in use stays)."""
        task, self._building = self._building, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def catch_up(self) -> int:
        """Step until nothing is pending; returns the messages embedded (benches, tests,
        after a replay)."""
        before = self.embedded
        while await self.step():
            pass
        return self.embedded - before

    async def _stored(self) -> tuple[str, int]:
        """(database, rows of ``messages``): a count ClickHouse answers from its parts'
        metadata, without reading a row."""
        db = self.store.database
        rows = await self.store.engine.rows(f"SELECT count() FROM {db}.messages", {})
        return db, int(str(rows[0][0]))

    async def run(
        self, idle_s: float = IDLE_S, quiet_s: float = QUIET_S, max_defer_s: float = MAX_DEFER_S
    ) -> None:
        """Forever: embed what is pending, wait ``idle_s`` when caught up. Errors propagate
        to the supervisor, which restarts the loop (nothing half-written: one insert per
        batch).

        - Caught up, it looks for pending messages again only once the table's row count
          has moved (an insert, a merge, an erasure, a rebuilt generation): the anti-join
          reads every message key and every vector key, which an idle ``memstream up`` with
          a long history should not pay twice a second.
        - It yields to ingest: while the row count keeps moving (appends flowing through the
          projector) it embeds only once the count has held still for ``quiet_s``, or
          ``max_defer_s`` after its last batch. Embedding takes a whole core of a small
          machine for seconds per batch, whatever its priority: appends measured 0.59-0.66x
          with it embedding beside a burst, 1.25x (noise) with this rule
          (bench/up_dense_append.py, docs/transcript-search.md)."""
        try:
            await self._run(idle_s, quiet_s, max_defer_s)
        finally:
            await self.stop_building()

    async def _run(self, idle_s: float, quiet_s: float, max_defer_s: float) -> None:
        seen: tuple[str, int] | None = None  # the table when last caught up
        last: tuple[str, int] | None = None
        loop = asyncio.get_running_loop()
        still_since = last_batch = loop.time()
        while True:
            state = await self._stored()
            now = loop.time()
            if state != last:
                last, still_since = state, now
            if seen is not None and state == seen:
                await asyncio.sleep(idle_s)
                continue
            if now - still_since < quiet_s and now - last_batch < max_defer_s:
                await asyncio.sleep(idle_s)  # appends are flowing: they go first
                continue
            last_batch = now
            if await self.step():
                seen = None
            else:
                seen = state
                await asyncio.sleep(idle_s)
