"""The three rebuild targets of ``memstream replay``: messages, memory, counters.

Generation names (generation 1 is what a fresh deployment starts with):

- ``messages`` (ClickHouse): the database ``<clickhouse_database>`` for generation 1, then
  ``<clickhouse_database>_v2``, ``_v3``... each holding its own ``messages`` and
  ``thread_users`` tables. The switch sets the live :class:`MessageStore`'s ``database``
  (search and the message projector share that object in ``memstream up``).
- ``memory`` (Qdrant): collections are named from ``(account, environment)``; generation N>1
  uses the environment ``<environment>.vN`` in that name, so every account's collection
  has a fresh twin. The switch sets the live :class:`MemoryIndex`'s ``environment``.
- ``counters`` (Redis): a thread's threshold counters are rebuilt into
  ``ms:{thread}:counters.gN`` by the live processor's count script (with its own count mark
  in that hash); the switch renames each rebuilt hash over the live one, counters and mark
  together (atomic per thread; a thread whose messages are all summarized has its live
  counters deleted). Messages at or below a thread's summarized watermark are not
  counted, as in the live processor; a replay never publishes ``summary.requested`` (the next
  live message of a thread past its thresholds asks for the summary).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import redis.asyncio as aioredis

from memstream.errors import InvalidRequest
from memstream.infra import redis_keys
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import COUNTERS, ThreadState
from memstream.projections.memory_index.index import MemoryIndex
from memstream.projections.memory_index.layout import collection_name
from memstream.projections.memory_index.rules import op_for_event
from memstream.projections.messages import MessageRow, MessageStore, row_of_envelope
from memstream.projections.messages.carry import carry_all, carry_missing, purge_erased
from memstream.projections.messages.rows import ParsedBatch, split_journal_batch
from memstream.projections.messages.sql import KIND_ROW
from memstream.schemas.events import Envelope, message_of
from memstream.schemas.records import ThreadRef

__all__ = [
    "CountersSink",
    "MemorySink",
    "MessagesSink",
    "database_of",
    "environment_of",
]

log = logging.getLogger(__name__)


def _dedupe_split(parsed: pa.Table, seen: set[str]) -> tuple[ParsedBatch, int]:
    """Blocking: the records of ``parsed`` whose event id is new (``seen`` gets them),
    split into the batch to write; with the duplicates skipped (copies of an event, and
    rows of a message key already in the batch)."""
    keep: list[bool] = []
    for event_id in parsed.column("event_id").to_pylist():
        keep.append(event_id not in seen)
        seen.add(event_id)
    dups = keep.count(False)
    if dups:
        parsed = parsed.filter(pa.array(keep, pa.bool_()))
    rows = int(pc.sum(pc.equal(parsed.column("kind"), KIND_ROW)).as_py() or 0)
    batch = split_journal_batch(parsed.drop_columns(["event_id"]))
    return batch, dups + rows - batch.messages.num_rows


def database_of(base: str, generation: int) -> str:
    """ClickHouse database of a ``messages`` generation."""
    return base if generation <= 1 else f"{base}_v{generation}"


def environment_of(base: str, generation: int) -> str:
    """The environment string naming a ``memory`` generation's collections."""
    return base if generation <= 1 else f"{base}.v{generation}"


class MessagesSink:
    """Rebuilds the ClickHouse message tables into a fresh database."""

    name = "messages"
    preferred_batch: Final = 10_000
    """Records per replay batch: each ClickHouse insert has a fixed cost (~8 ms on chdb), so
    larger batches are cheaper per record (docs/operations.md)."""

    def __init__(self, live: MessageStore, base_database: str) -> None:
        self.live = live
        self.base = base_database
        # generation -> its store, kept across batches: a store holds each agent's thread
        # owners once read (a new store per batch read them again from ClickHouse for every
        # agent of every batch, on the one chdb thread the inserts use)
        self._stores: dict[int, MessageStore] = {}

    def restore(self, extra: dict[str, list[str]]) -> None:
        return None

    def bookkeeping(self) -> dict[str, list[str]]:
        return {}

    def store(self, generation: int) -> MessageStore:
        """The store of ``generation``'s database (the live one's engine, erasure registry,
        parse and indexes), the same one for every batch of a replay."""
        kept = self._stores.get(generation)
        if kept is not None and kept.engine is self.live.engine:
            return kept
        store = MessageStore(
            self.live.engine,
            database_of(self.base, generation),
            erased=self.live.erased,
            bulk_parse=self.live.bulk_parse,
            index_root=self.live.index_root,
            vector_root=self.live.vector_root,
            vector_process=self.live.vector_process,
        )
        self._stores = {generation: store}  # one replay at a time: the last generation
        return store

    async def prepare(self, generation: int, *, fresh: bool) -> None:
        """A fresh database whose posting lists wait for :meth:`seal` (the bulk load's
        inserts skip the view that fills them: 0.3x the cost per insert, measured); a resumed
        replay keeps the target as it was left."""
        if fresh:  # nothing a store of an earlier attempt read holds any more
            self._stores.pop(generation, None)
        target = self.store(generation)
        if target.database == self.live.database:
            raise InvalidRequest("cannot rebuild into the current generation", field="generation")
        if fresh:
            await target.engine.command(f"DROP DATABASE IF EXISTS {target.database}")
            await target.drop_index(target.database)
        await target.ensure_schema(defer_postings=True)

    async def seal(self, generation: int) -> None:
        """The posting lists of every row loaded so far, in one ``INSERT ... SELECT``, and the
        view that fills them at every later insert (the hand-over's and the live
        projector's), before the switch makes the table searchable. Then the bulk of the
        vectors: the old generation's carried over, and (with an embedder) the new
        generation's vector index filled from them, so that the switch, under the gate,
        carries only what came since (:mod:`~memstream.projections.messages.carry`).

        Threads erased since the load copied them are erased from the target first
        (:func:`~memstream.projections.messages.carry.purge_erased`: erasure deletes from
        the current generation only). Idempotent: a resumed replay's seal carries only what
        is missing; an index whose fill was interrupted (its ``filling`` marker) is filled
        again, one already filled gets the missing vectors only."""
        target = self.store(generation)
        await target.seal_postings()
        if target.database == self.live.database:
            return
        started = time.perf_counter()
        purged = await purge_erased(target)
        model = self.live.embedder.model if self.live.embedder is not None else None
        index = target.vector_index(model) if model is not None else None
        if index is not None and not index.filling and await index.count():
            # an earlier seal of this replay filled the index: the rest through it
            carried = await carry_missing(target, self.live.database, model)
            how = f"{carried} vectors carried since the last seal, into the index too"
        else:
            await carry_all(target, self.live.database)
            how = "vectors carried"
            if model is not None:  # dense search on: the index filled from them
                await target.ensure_vectors(model)
                how += ", the vector index filled" if index is not None else " (no vector index)"
        log.warning(
            "replay seal of %s: %s in %.1f s%s",
            target.database,
            how,
            time.perf_counter() - started,
            f" ({purged} erased threads purged)" if purged else "",
        )

    async def apply(self, generation: int, events: Sequence[Envelope]) -> tuple[int, int]:
        rows: dict[tuple[str, str, str, int], MessageRow] = {}
        dups = 0
        for env in events:
            row = row_of_envelope(env)
            if row is None:
                continue
            key = (row.account_id, row.agent_id, row.thread_id, row.offset)
            if key in rows:
                dups += 1
                continue
            rows[key] = row
        written = await self.store(generation).write(list(rows.values())) if rows else 0
        return written, dups

    async def parse_values(self, generation: int, values: Sequence[bytes]) -> pa.Table | None:
        """The live projector's bulk parse (:meth:`MessageStore.parse_journal_batch`: pyarrow
        parses the records, the same rules as :func:`row_of_envelope`; erased threads'
        records dropped), with the envelopes' ids; None when it cannot vouch for the batch
        (the replay decodes it in Python instead). Writes nothing."""
        return await self.store(generation).parse_journal_batch(values, event_id=True)

    async def write_values(
        self, generation: int, parsed: pa.Table, seen: set[str]
    ) -> tuple[int, int]:
        """A parsed batch written, with the replay's dedupe on event id (the first copy of
        an event counts, in this batch or an earlier one). The dedupe and the split run off
        the event loop, which reads the next batches from Kafka meanwhile."""
        batch, dups = await asyncio.to_thread(_dedupe_split, parsed, seen)
        written = await self.store(generation).write_parsed(batch)
        return written, dups

    async def switch(self, generation: int) -> None:
        """Under the gate: the vectors the old generation gained since the seal (the vector
        loop's, the hand-over's messages'), carried into the new one and its vector index
        (only those: the seal carried and indexed the bulk), threads erased meanwhile
        purged from it; then the live store and the readers point at it."""
        target = self.store(generation)
        if target.database != self.live.database:
            started = time.perf_counter()
            erased = len(self.live.erased)  # before the look: a later one is seen below
            purged = await purge_erased(target)
            model = self.live.embedder.model if self.live.embedder is not None else None
            carried = await carry_missing(target, self.live.database, model)
            index = target.vector_index(model) if model is not None else None
            if model is not None and index is not None and index.filling:
                await target.ensure_vectors(model)  # a fill the seal left unfinished
            # a thread this process registered as erased meanwhile may have had its rows
            # deleted from the old generation only: purged again, until the registry held
            # still, and no await between that look and the move below
            while len(self.live.erased) != erased:
                erased = len(self.live.erased)
                purged += await purge_erased(target)
            log.warning(
                "replay switch to %s: %d vectors carried since the seal in %.2f s%s",
                target.database,
                carried,
                time.perf_counter() - started,
                f" ({purged} erased threads purged)" if purged else "",
            )
        self.live.database = target.database

    async def drop(self, generation: int) -> None:
        db = database_of(self.base, generation)
        if db != self.live.database:
            self._stores.pop(generation, None)
            await self.live.engine.command(f"DROP DATABASE IF EXISTS {db}")
            await self.live.drop_index(db)


class MemorySink:
    """Rebuilds every account's memory collection into a fresh twin."""

    name = "memory"

    def __init__(self, live: MemoryIndex, base_environment: str) -> None:
        self.live = live
        self.base = base_environment
        self.accounts: set[str] = set()
        self._target: tuple[int, MemoryIndex] | None = None

    def restore(self, extra: dict[str, list[str]]) -> None:
        self.accounts.update(extra.get("accounts", []))

    def bookkeeping(self) -> dict[str, list[str]]:
        return {"accounts": sorted(self.accounts)}

    def index(self, generation: int) -> MemoryIndex:
        """The index writing ``generation``'s collections (shares the live backend and the
        embedding cache, so a replay embeds only texts the cache has never seen)."""
        if self._target is None or self._target[0] != generation:
            env = environment_of(self.base, generation)
            index = MemoryIndex(self.live.backend, self.live.embedder, environment=env)
            index.erased = self.live.erased
            self._target = (generation, index)
        return self._target[1]

    async def prepare(self, generation: int, *, fresh: bool) -> None:
        if environment_of(self.base, generation) == self.live.environment:
            raise InvalidRequest("cannot rebuild into the current generation", field="generation")
        if fresh:
            for account in self.accounts:
                await self.live.backend.drop_collection(
                    collection_name(account, environment_of(self.base, generation))
                )

    async def apply(self, generation: int, events: Sequence[Envelope]) -> tuple[int, int]:
        ops = []
        for env in events:
            op = op_for_event(env)
            if op is not None:
                self.accounts.add(env.account_id)
                ops.append(op)
        return (await self.index(generation).apply(ops) if ops else 0), 0

    async def switch(self, generation: int) -> None:
        self.live.environment = environment_of(self.base, generation)

    async def drop(self, generation: int) -> None:
        env = environment_of(self.base, generation)
        if env == self.live.environment:
            return
        for account in sorted(self.accounts):
            await self.live.backend.drop_collection(collection_name(account, env))


# KEYS rebuilt hash, live hash. The rebuilt counters replace the live ones (or none remain).
_SWITCH: Final = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  return 1
end
redis.call('DEL', KEYS[2])
return 0
"""


class CountersSink:
    """Rebuilds the per-thread threshold counters beside the live ones, then swaps them."""

    name = "counters"

    def __init__(self, redis: aioredis.Redis, summaries: SummaryStore) -> None:
        self.redis = redis
        self.summaries = summaries
        self.state = ThreadState(redis)
        self._switch = redis.register_script(_SWITCH)

    @staticmethod
    def rebuilt_key(ref: ThreadRef, generation: int) -> str:
        return redis_keys.thread_base(ref) + _rebuilt_name(generation)

    def _threads_key(self, generation: int) -> str:
        return f"{redis_keys.PREFIX}:replay:counters.g{generation}:threads"

    def restore(self, extra: dict[str, list[str]]) -> None:
        return None  # the thread set lives in Redis beside the counters

    def bookkeeping(self) -> dict[str, list[str]]:
        return {}

    async def prepare(self, generation: int, *, fresh: bool) -> None:
        if not fresh:
            return
        threads = await self.redis.smembers(self._threads_key(generation))
        for raw in threads:
            ref = _ref_of(raw)
            await self.redis.delete(self.rebuilt_key(ref, generation))
        await self.redis.delete(self._threads_key(generation))

    async def apply(self, generation: int, events: Sequence[Envelope]) -> tuple[int, int]:
        groups: dict[ThreadRef, list[tuple[int, int]]] = {}
        for env in events:
            if env.type != "message.appended":
                continue
            msg = message_of(env)
            ref = ThreadRef(msg.account_id, msg.agent_id, msg.thread_id)
            groups.setdefault(ref, []).append((msg.offset, msg.token_count))
        if not groups:
            return 0, 0
        # The live processor's count, into the rebuilt hash: its count mark comes with it
        # (and replaces the live one at the switch, so what the live processor meets again
        # after the hand-over is a duplicate); a redelivered batch after a resume is a no-op.
        name, suffix = _rebuilt_name(generation), f".g{generation}"
        counts = await self.state.count_threads(
            groups, counters_name=name, legacy_claim_suffix=suffix
        )
        lost = [ref for ref, c in zip(groups, counts, strict=True) if not c.known]
        if lost:
            marks = {}
            for ref in lost:
                current = await self.summaries.get_stored(ref)
                marks[ref] = current.last_message_offset if current is not None else -1
            await self.state.init_watermarks(marks)
            again = await self.state.count_threads(
                {ref: groups[ref] for ref in lost}, counters_name=name, legacy_claim_suffix=suffix
            )
            redone = dict(zip(lost, again, strict=True))
            counts = [redone.get(ref, c) for ref, c in zip(groups, counts, strict=True)]
        await self.redis.sadd(self._threads_key(generation), *(ref.key for ref in groups))
        written = sum(c.statuses.count("c") for c in counts)
        dups = sum(c.statuses.count("d") for c in counts)
        return written, dups

    async def switch(self, generation: int) -> None:
        threads = await self.redis.smembers(self._threads_key(generation))
        for raw in threads:
            ref = _ref_of(raw)
            await self._switch(
                keys=[self.rebuilt_key(ref, generation), redis_keys.counters(ref)], args=[]
            )
        await self.redis.delete(self._threads_key(generation))

    async def drop(self, generation: int) -> None:
        return None  # the switch renamed the rebuilt counters over the old ones


def _rebuilt_name(generation: int) -> str:
    """The rebuilt counters hash's name under a thread's key base (``counters.gN``)."""
    return f"{COUNTERS}.g{generation}"


def _ref_of(raw: bytes | str) -> ThreadRef:
    key = raw.decode() if isinstance(raw, bytes) else raw
    account, agent, thread = key.split("/", 2)
    return ThreadRef(account, agent, thread)
