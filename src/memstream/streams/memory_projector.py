"""The memory projector: ``memory`` topic -> Qdrant memory index (hybrid recall).

Thin: the runtime hands it decoded envelopes in batches; the pure step
:func:`ops_of_batch` (built on ``projections.memory_index.rules.op_for_event``) maps them to
index operations, and :meth:`MemoryIndex.apply` embeds (through the embedding cache) and
writes them.

- ``memory.stored`` / ``memory.replaced`` / ``memory.decayed`` upsert the entry's point;
  ``memory.forgotten`` / ``memory.expired`` delete it; ``memory.recalled`` changes nothing.

Guarantees:

- A batch's offsets are committed only after :meth:`handle_batch` returned, i.e. after every
  write reached Qdrant (qdrant-edge: its WAL; server: ``wait=True``). A crash before that
  re-delivers the batch.
- Idempotent under redelivery and replay: point ids are deterministic (uuid5 of the entry
  identity) and every write carries the entry version, which Qdrant checks on the write;
  an event older than the stored point is a no-op. Replaying the topic from the start
  rebuilds the same points; the embedding cache makes the replay cheap.
- An unreadable ``memory.*`` event fails its batch; the runtime retries record by record and
  dead-letters only the bad one. Index failures (``RetryableInfraError``) are retried.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from memstream.projections.memory_index import IndexOp, MemoryIndex, op_for_event
from memstream.schemas.events import Envelope
from memstream.schemas.topics import MEMORY
from memstream.streams.processor import Processor, Received

NAME: Final = "memory-projector"


def ops_of_batch(envelopes: Iterable[Envelope]) -> list[IndexOp]:
    """Index operations for a batch, in event order. Raises ``DecodeError`` on a bad event."""
    return [op for op in (op_for_event(env) for env in envelopes) if op is not None]


class MemoryProjector(Processor):
    """Projects memory entries into the Qdrant index, in batches."""

    name = NAME
    topic = MEMORY

    def __init__(
        self, index: MemoryIndex, *, batch_max: int = 256, batch_within_s: float = 0.2
    ) -> None:
        self.index = index
        self.batch_max = batch_max
        self.batch_within_s = batch_within_s
        self.ops_applied = 0

    async def handle_batch(self, items: Sequence[Received]) -> None:
        ops = ops_of_batch(item.envelope for item in items)
        if ops:
            self.ops_applied += await self.index.apply(ops)
