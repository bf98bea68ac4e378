"""The message projector: ``journal`` -> ClickHouse ``messages`` (transcript search).

A ``raw`` processor: the runtime hands it undecoded records, and each large batch
(``bulk_min`` records or more) is parsed in bulk by pyarrow's C++ JSON reader and mapped with
Arrow compute kernels (:meth:`MessageStore.write_journal_batch`,
:mod:`memstream.projections.messages.arrow_batch`), which removes the Python decode and row
mapping that dominated a backlog's cost; a small batch is decoded in Python. When the bulk
path cannot vouch for a batch (a record
that does not parse strictly or is not in canonical form), the batch is decoded in Python
and mapped with the pure :func:`rows_of_batch`, the rules the bulk SQL mirrors; a bad record
then fails the batch and the runtime isolates it (one record at a time, Python path).

Guarantees:

- A batch's offsets are committed only after :meth:`handle_batch` returned, which is after
  ClickHouse committed the insert (the runtime acks only then; see
  :mod:`memstream.streams.consumer`). A crash before that re-delivers the batch.
- Idempotent: a redelivered or replayed message maps to an identical row with the same key,
  so search still returns it once (see :mod:`memstream.projections.messages.store`).
- Only user and assistant text is stored; system messages, tool results and reasoning
  never reach ClickHouse. Events other than ``message.appended`` are skipped.
- Read-your-writes watermarks are advanced by the gate that wraps processors
  (:mod:`memstream.streams.gate`) after :meth:`handle_raw` returns, i.e. after the insert,
  from :meth:`applied_positions` (the highest journal seq per thread of the batch's
  ``message.appended`` events, of any role).
- A ``message.appended`` whose data cannot be read fails its batch; the runtime then retries
  the batch record by record and dead-letters only the bad record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from memstream.projections.messages import MessageRow, MessageStore, row_of_envelope
from memstream.schemas.events import Envelope, decode
from memstream.schemas.records import ThreadRef
from memstream.schemas.topics import JOURNAL
from memstream.streams.processor import Processor, ProcessorContext, RawRecord, Received

NAME: Final = "message-projector"
BULK_MIN_RECORDS: Final = 1_000
"""Batches smaller than this take the Python path. Chosen when the bulk parse was one more
ClickHouse statement with a fixed cost (~9 ms on chdb, query analysis): below about a
thousand records decoding in Python was cheaper (docs/transcript-search.md). A backlog comes
in full batches of ``batch_max`` and goes in bulk."""
BATCH_WITHIN_S: Final = 0.1
"""How long a batch that is not full waits for more records: the largest part of append ->
searchable when the projector is caught up (bench/append_searchable.py)."""


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


def thread_positions(envelopes: Iterable[Envelope]) -> dict[str, int]:
    """Per thread key, the highest journal seq among ``message.appended`` events (any role)."""
    best: dict[str, int] = {}
    for env in envelopes:
        if env.type != "message.appended" or not env.thread_id:
            continue
        seq = env.data.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool):
            key = ThreadRef(env.account_id, env.agent_id, env.thread_id).key
            best[key] = max(best.get(key, 0), seq)
    return best


class MessageProjector(Processor):
    """Writes user and assistant messages to the ClickHouse message table in batches."""

    name = NAME
    topic = JOURNAL
    raw = True

    def __init__(
        self,
        store: MessageStore,
        *,
        batch_max: int = 5_000,
        batch_within_s: float = BATCH_WITHIN_S,
        bulk_min: int = BULK_MIN_RECORDS,
    ) -> None:
        self.store = store
        self.batch_max = batch_max
        self.batch_within_s = batch_within_s
        self.bulk_min = max(2, bulk_min)
        self.rows_written = 0
        self.bulk_batches = 0
        self.python_batches = 0
        self._positions: dict[str, int] = {}

    async def start(self, ctx: ProcessorContext) -> None:
        await self.store.ensure_schema()

    def applied_positions(self) -> Mapping[str, int]:
        """What the last successful :meth:`handle_raw` (or :meth:`handle_batch`) applied:
        thread key -> highest journal seq (read-your-writes positions)."""
        return self._positions

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        self._positions = {}
        if len(records) >= self.bulk_min:
            batch = await self.store.write_journal_batch([r.value for r in records])
            if batch is not None:
                self.bulk_batches += 1
                self.rows_written += batch.messages.num_rows
                self._positions = batch.positions
                return
        self.python_batches += 1
        envelopes = [decode(r.value) for r in records]  # DecodeError: the runtime isolates
        await self._write(envelopes)

    async def handle_batch(self, items: Sequence[Received]) -> None:
        self._positions = {}
        await self._write([item.envelope for item in items])

    async def _write(self, envelopes: Sequence[Envelope]) -> None:
        rows = rows_of_batch(envelopes)
        self.rows_written += await self.store.write(rows)
        self._positions = thread_positions(envelopes)
