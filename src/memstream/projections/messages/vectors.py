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
- Vectors are not put in any persistent embedding cache: they are derived from message text,
  and the only copy is the row erasure deletes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import pyarrow as pa

from memstream.infra.embeddings import Embedder
from memstream.projections.messages.sql import pending_vectors_sql
from memstream.projections.messages.store import MessageStore

log = logging.getLogger(__name__)

BATCH: Final = 64
"""Messages embedded per step: one embedder call (the C engine uses every core per batch)."""
IDLE_S: Final = 0.5
"""How long :meth:`MessageVectors.run` waits when nothing is pending."""

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

    async def step(self) -> int:
        """Embed and store one batch of pending messages; returns how many vectors were
        written (0: caught up)."""
        rows = await self.store.engine.rows(
            pending_vectors_sql(self.store.database),
            {"model": self.embedder.model, "n": self.batch},
        )
        if not rows:
            return 0
        keys = [(str(r[0]), str(r[1]), str(r[2]), int(str(r[3]))) for r in rows]
        vecs = await self.embedder.embed([str(r[4]) for r in rows])
        if len(self.store.erased):
            await self.store.erased.refresh()
        kept = [(k, v) for k, v in zip(keys, vecs, strict=True) if k[:3] not in self.store.erased]
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
        return len(kept)

    async def catch_up(self) -> int:
        """Step until nothing is pending; returns the messages embedded (benches, tests,
        after a replay)."""
        before = self.embedded
        while await self.step():
            pass
        return self.embedded - before

    async def run(self, idle_s: float = IDLE_S) -> None:
        """Forever: embed what is pending, wait ``idle_s`` when caught up. Errors propagate
        to the supervisor, which restarts the loop (nothing half-written: one insert per
        batch)."""
        while True:
            if not await self.step():
                await asyncio.sleep(idle_s)
