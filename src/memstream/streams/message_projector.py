"""The message projector: ``journal`` -> ClickHouse ``messages`` (transcript search).

Thin: decodes nothing itself (the runtime hands it envelopes), maps each batch with the
pure :func:`rows_of_batch`, and writes it with one :meth:`MessageStore.write`.

Guarantees:

- A batch's offsets are committed only after :meth:`handle_batch` returned, which is after
  ClickHouse committed the insert (the runtime acks only then; see
  :mod:`memstream.streams.consumer`). A crash before that re-delivers the batch.
- Idempotent: a redelivered or replayed message maps to an identical row with the same key,
  so search still returns it once (see :mod:`memstream.projections.messages.store`).
- Only user and assistant text is stored; system messages, tool results and reasoning
  never reach ClickHouse. Events other than ``message.appended`` are skipped.
- Read-your-writes watermarks are advanced by the gate that wraps processors
  (:mod:`memstream.streams.gate`) after :meth:`handle_batch` returns, i.e. after the insert.
- A ``message.appended`` whose data cannot be read fails its batch; the runtime then retries
  the batch record by record and dead-letters only the bad record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from memstream.projections.messages import MessageRow, MessageStore, row_of_envelope
from memstream.schemas.events import Envelope
from memstream.schemas.topics import JOURNAL
from memstream.streams.processor import Processor, ProcessorContext, Received

NAME: Final = "message-projector"


def rows_of_batch(envelopes: Iterable[Envelope]) -> list[MessageRow]:
    """The rows for a batch of events, one per (account, agent, thread, offset), in order.

    Raises ``DecodeError`` if any ``message.appended`` in the batch is unreadable.
    """
    out: dict[tuple[str, str, str, int], MessageRow] = {}
    for env in envelopes:
        row = row_of_envelope(env)
        if row is not None:
            out.setdefault((row.account_id, row.agent_id, row.thread_id, row.offset), row)
    return list(out.values())


class MessageProjector(Processor):
    """Writes user and assistant messages to the ClickHouse message table in batches."""

    name = NAME
    topic = JOURNAL

    def __init__(
        self,
        store: MessageStore,
        *,
        batch_max: int = 5_000,
        batch_within_s: float = 0.25,
    ) -> None:
        self.store = store
        self.batch_max = batch_max
        self.batch_within_s = batch_within_s
        self.rows_written = 0

    async def start(self, ctx: ProcessorContext) -> None:
        await self.store.ensure_schema()

    async def handle_batch(self, items: Sequence[Received]) -> None:
        envelopes = [item.envelope for item in items]
        rows = rows_of_batch(envelopes)
        self.rows_written += await self.store.write(rows)
