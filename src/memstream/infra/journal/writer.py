"""``Journal``: the single fenced SlateDB writer of the journal, with group commit.

Guarantees:

- **Durable before acknowledged.** ``append`` returns only after SlateDB reports the write
  batch holding its messages durable (WAL flushed to the object store). Reads (here and in
  :class:`~memstream.infra.journal.reader.JournalReader`) only see durable data.
- **Group commit.** One committer task owns all writes. Appends that arrive while a batch is
  being made durable queue up and are committed together: one ``WriteBatch``, one WAL flush,
  one durable wait for all of them (``stats.batches`` counts them). All messages of one
  ``append`` call are in one batch, so they become durable together or not at all.
- **Pipelining.** While batch k is being made durable, batch k+1 is staged on top of k's
  staged state (``stats.pipelined`` counts such batches); k+1 is written only once k is
  durable, batches are acknowledged in order, and if k fails, k+1 fails with it.
- **Offsets.** Per thread, dense and monotonic from 0, assigned by the committer alone, so
  concurrency can neither duplicate nor skip one. A thread's next offset is recovered from
  its last stored key (a descending scan) the first time the writer touches it, so it
  survives restarts; the global ``seq`` (from 1, no gaps) is recovered the same way on open.
- **Every message, and every ``thread.*`` event, gets a seq** written in the same batch:
  each group commit writes one sequence block (keyed by its first seq) holding the encoded
  ``Envelope`` of each of its seqs, which the relay publishes.
- **Fencing.** When a newer writer opens the same database, this writer's next operation
  raises :class:`~memstream.errors.JournalFenced`, and every later ``append`` raises it too.
  A write that failed is never acknowledged. After *any* failed commit the writer stops
  (``JournalFenced`` or ``JournalUnavailable``): the batch may or may not have reached the
  store, so only a re-opened writer, which recovers offsets from the store, may write again.
  A caller that got an error may therefore retry on a new writer and, rarely, find its
  message stored once more (at-least-once, never lost-but-acknowledged).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final, Literal, cast

import orjson
from slatedb.uniffi import (
    Admin,
    AdminBuilder,
    Db,
    DbBuilder,
    FlushOptions,
    FlushType,
    GarbageCollectorDirectoryOptions,
    GarbageCollectorOptions,
    ObjectStore,
    WriteBatch,
)
from slatedb.uniffi import Settings as SlateSettings

from memstream.clock import Clock, SystemClock, epoch_ms
from memstream.errors import InvalidRequest, JournalError, JournalFenced, JournalUnavailable
from memstream.infra.journal import fastpath, keys
from memstream.infra.journal.codec import ToolCallRecord, encode_seq_block, encode_tool_call
from memstream.infra.journal.erase import ErasedJournal, erase_threads
from memstream.infra.journal.failures import SLATE_FAILURES, translate
from memstream.infra.journal.reads import JournalReads
from memstream.infra.metrics import Metrics
from memstream.infra.tokenizer import count_message_tokens
from memstream.schemas.events import Envelope, encode, encode_message_appended, message_tenancy
from memstream.schemas.limits import MAX_BUS_RECORD_BYTES, MAX_MESSAGES_PER_APPEND
from memstream.schemas.records import ROLES, Message, NewMessage, ThreadRef, message_unchecked

log = logging.getLogger(__name__)

TokenCounter = Callable[[NewMessage], int]
_JOURNAL_EVENTS = frozenset({"thread.created", "thread.configured", "thread.deleted"})
_ROLES = frozenset(ROLES)
#: Room left in a journal record for everything but content, reasoning and tool calls
#: (ids, tenancy, timestamps, the envelope around the message).
_RECORD_OVERHEAD = 4_096
#: Below this many characters of content + reasoning a message cannot reach the bus limit
#: (JSON escapes a character to at most 6 bytes), so its size is not computed.
_SURELY_FITS_CHARS = (MAX_BUS_RECORD_BYTES - _RECORD_OVERHEAD) // 6


def check_fits_the_bus(m: NewMessage, field: str) -> None:
    """Refuse a message whose journal record would exceed what the bus carries
    (``InvalidRequest`` naming ``field``), and NUL characters (Postgres and ClickHouse
    refuse them downstream). Pure."""
    if "\x00" in m.content:
        raise InvalidRequest("content must not contain NUL characters", field=field)
    if m.reasoning is not None and "\x00" in m.reasoning:
        raise InvalidRequest(
            "reasoning must not contain NUL characters",
            field=field.removesuffix("content") + "reasoning",
        )
    chars = len(m.content) + len(m.reasoning or "")
    if chars <= _SURELY_FITS_CHARS and not m.tool_calls:
        return
    size = _RECORD_OVERHEAD + len(orjson.dumps(m.content)) + len(orjson.dumps(m.reasoning))
    for tc in m.tool_calls:
        size += len(orjson.dumps(tc.arguments)) + len(tc.id) + len(tc.name)
    if size > MAX_BUS_RECORD_BYTES:
        raise InvalidRequest(
            f"this message encodes to about {size} bytes; at most {MAX_BUS_RECORD_BYTES} "
            "travel on the bus (store large payloads by reference)",
            field=field,
        )


_WAL_FLUSH = FlushOptions(flush_type=FlushType.WAL)


@dataclass(slots=True)
class JournalStats:
    """Counters of the writer since it opened (exported as metrics by the composition root)."""

    batches: int = 0
    """Write batches committed; each had exactly one durable wait."""
    appends: int = 0
    """``append`` calls acknowledged."""
    messages: int = 0
    events: int = 0
    failed_batches: int = 0
    pipelined: int = 0
    """Batches staged while the batch before them was still being made durable."""


@dataclass(slots=True, eq=False)
class _Request:
    kind: Literal["messages", "event", "watermark"]
    future: asyncio.Future[object]
    ref: ThreadRef | None = None
    messages: Sequence[NewMessage] = ()
    tokens: Sequence[int] = ()
    env: Envelope | None = None
    watermark: int = 0
    weight: int = 1
    result: object = field(default=None)


@dataclass(slots=True)
class _Staged:
    """What a batch will make true once durable."""

    seq: int
    watermark: int
    offsets: dict[ThreadRef, int] = field(default_factory=dict)
    """each thread's next offset once durable (filled when the batch is sealed)"""
    tools: dict[bytes, ToolCallRecord] = field(default_factory=dict)
    prior_offsets: dict[ThreadRef, int] = field(default_factory=dict)
    prior_tools: dict[bytes, ToolCallRecord] = field(default_factory=dict)
    """the offsets and tool-call records of the batch in flight when this one was started"""
    puts: int = 0
    first_seq: int = 0
    block: list[bytes] = field(default_factory=list)
    """envelopes of seqs first_seq .. seq, written as one value when sealed"""
    cursors: dict[ThreadRef, _Cursor] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class _Cursor:
    """One thread within a batch being staged: its encoded key prefix and envelope tenancy,
    and the offset its next message gets."""

    ref: ThreadRef
    prefix: bytes
    tenancy: bytes
    next_offset: int


@dataclass(slots=True, eq=False)
class _Flight:
    """A staged batch: its requests, what it makes true, its WriteBatch, and (once written)
    the task making it durable. ``task`` stays None for a batch with nothing to write."""

    batch: list[_Request]
    staged: _Staged
    wb: WriteBatch
    weight: int = 0
    task: asyncio.Task[None] | None = field(default=None)


class _MessageIds:
    """Strictly increasing ULID-layout ids within this writer (time first, then entropy)."""

    def __init__(self) -> None:
        self._ms = -1
        self._entropy = 0
        self._prefix = ""

    def next(self, ms: int) -> str:
        if ms > self._ms:
            self._ms, self._entropy = ms, secrets.randbits(79)
            self._prefix = keys.message_id(ms, 0)[:12]
        else:
            self._entropy += 1
            if self._entropy > keys.ENTROPY_MAX:
                self._ms, self._entropy = self._ms + 1, secrets.randbits(79)
                self._prefix = keys.message_id(self._ms, 0)[:12]
        # same layout as keys.message_id, without re-formatting the time part every call
        return f"{self._prefix}{self._entropy:020x}"


_COLLECT_WAL_NOW: Final = GarbageCollectorOptions(
    wal_options=GarbageCollectorDirectoryOptions(min_age_ms=0, dry_run=False),
    manifest_options=None,  # None: that task does not run
    wal_fence_options=None,
    compacted_options=None,
    compactions_options=None,
    detach_options=None,
)
"""One garbage-collector pass over the WAL files only, whatever their age (the collector
still keeps those at or above the manifest's replay point and any a reader needs)."""


class Journal(JournalReads):
    """The journal's single writer. Build it with :meth:`open`; share one per process."""

    def __init__(
        self,
        db: Db,
        *,
        clock: Clock,
        count_tokens: TokenCounter,
        max_batch: int,
        eager_flush: bool,
        last_seq: int,
        watermark: int,
        offset_cache_size: int,
        events_indexed_from: int | None = None,
        metrics: Metrics | None = None,
        admin: Admin | None = None,
    ) -> None:
        self._db = db
        self._admin = admin
        self._metrics = metrics
        self._wdb = db
        self._clock = clock
        self._count_tokens = count_tokens
        self._max_batch = max(1, max_batch)
        self._eager_flush = eager_flush
        self._seq = last_seq
        self._watermark = watermark
        self._events_indexed_from = events_indexed_from
        self._offsets: OrderedDict[ThreadRef, int] = OrderedDict()
        self._offset_cache_size = offset_cache_size
        self._refs: dict[ThreadRef, tuple[bytes, bytes]] = {}
        self._ids = _MessageIds()
        self._queue: deque[_Request] = deque()
        self._wakeup = asyncio.Event()
        self._broken: JournalError | None = None
        self._closing = False
        self.stats = JournalStats()
        self._on_durable: list[Callable[[], None]] = []
        self._erase_lock = asyncio.Lock()
        self._task = asyncio.create_task(self._run(), name="journal-committer")

    @classmethod
    async def open(
        cls,
        object_store: ObjectStore,
        path: str,
        *,
        flush_interval_ms: int = 5,
        clock: Clock | None = None,
        count_tokens: TokenCounter = count_message_tokens,
        max_batch: int = 512,
        eager_flush: bool = True,
        offset_cache_size: int = 100_000,
        metrics: Metrics | None = None,
        fast_binding: bool = True,
    ) -> Journal:
        """Open (or create) the journal at ``path`` in ``object_store`` and fence any older
        writer. ``flush_interval_ms`` is SlateDB's background WAL flush; with ``eager_flush``
        each batch also flushes the WAL at once (a group commit is one object-store PUT), so
        a lone append does not wait for the next tick. ``max_batch`` caps messages per batch.
        ``metrics``, when given, records append latency and group-commit batch sizes.
        ``fast_binding`` installs :mod:`~memstream.infra.journal.fastpath` (a self-checked
        fix of the binding's byte-by-byte copy; ~6x less CPU per 1 KB put).
        """
        if fast_binding:
            fastpath.install()
        settings = SlateSettings.default()
        try:
            settings.set("flush_interval", f'"{int(flush_interval_ms)}ms"')
            builder = DbBuilder(path, object_store)
            builder.with_settings(settings)
            db = await builder.build()
        except SLATE_FAILURES as e:
            raise translate(e, f"opening the journal at {path!r}") from e
        probe = _Probe(db)
        last_seq = await probe.last_seq()
        watermark = await probe.relay_watermark()
        indexed_from = await probe.events_indexed_from()
        if indexed_from is None:  # new, or written before thread events were indexed
            indexed_from = last_seq + 1
            marker = WriteBatch()
            marker.put(keys.EVENTS_INDEXED_FROM, keys.u64(indexed_from))
            try:
                await _write_durably(db, marker, flush_wal=True)
            except SLATE_FAILURES as e:
                raise translate(e, f"opening the journal at {path!r}") from e
        log.info("journal opened at %r: last seq %d, relay watermark %d", path, last_seq, watermark)
        return cls(
            db,
            clock=clock or SystemClock(),
            count_tokens=count_tokens,
            max_batch=max_batch,
            eager_flush=eager_flush,
            last_seq=last_seq,
            watermark=watermark,
            events_indexed_from=indexed_from,
            offset_cache_size=offset_cache_size,
            metrics=metrics,
            admin=AdminBuilder(path, object_store).build(),
        )

    # --- state ---------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return isinstance(self._broken, JournalFenced)

    def problem(self) -> str | None:
        """``None`` while the writer accepts appends; else why it does not (readiness)."""
        if self.fenced:
            return (
                "the journal writer is fenced: another writer opened the journal and took "
                "over; this process accepts no appends until it is restarted"
            )
        if self._broken is not None:
            return f"the journal writer is broken: {self._broken.message}"
        if self._closing:
            return "the journal writer is closed"
        if self._task.done():
            return "the journal committer task stopped"
        return None

    def _on_failure(self, err: JournalError) -> None:
        if isinstance(err, JournalFenced) and self._broken is None:
            log.error("journal writer fenced by a newer writer; it accepts no more appends")
            self._broken = err

    def _check_open(self) -> None:
        if self._broken is not None:
            raise type(self._broken)(self._broken.message)
        if self._closing:
            raise JournalUnavailable("the journal writer is closed")

    async def last_seq(self) -> int:
        """The highest durable seq: the writer's own count (it assigned every seq, and
        moves the count only once a batch is durable), with no read of the log. The relay
        asks after every pass it is woken for; the scan it replaced was ~1.6% of a busy
        ``memstream up``'s event loop. A writer that failed (fenced included) or is closing
        reads the log as before (a fenced writer's read raises ``JournalFenced``); one fenced
        but not yet told (no write since) answers its own count until its next write or
        read of the log finds out, which the relay's next pass does."""
        if self._broken is not None or self._closing:
            return await super().last_seq()
        return self._seq

    # --- writes --------------------------------------------------------------------------------
    async def append(self, ref: ThreadRef, messages: Sequence[NewMessage]) -> list[Message]:
        """Append messages to a thread; returns them with offset, id, seq, created_at and
        token count, once durable. All or none of them are stored."""
        if self._broken is not None or self._closing:
            self._check_open()
        n = len(messages)
        if not n:
            raise InvalidRequest("at least one message is required", field="messages")
        if n > MAX_MESSAGES_PER_APPEND:
            raise InvalidRequest(
                f"at most {MAX_MESSAGES_PER_APPEND} messages per append", field="messages"
            )
        count = self._count_tokens
        tokens: list[int] = []
        for i, m in enumerate(messages):
            if m.role not in _ROLES:
                raise InvalidRequest(
                    f"role must be one of {', '.join(ROLES)}", field=f"messages[{i}].role"
                )
            if not isinstance(m.content, str):
                raise InvalidRequest("content must be a string", field=f"messages[{i}].content")
            check_fits_the_bus(m, f"messages[{i}].content")
            tokens.append(count(m))
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request("messages", future, ref, messages, tokens, None, 0, n))
        self._wakeup.set()
        # A cancelled caller cancels only its future: the committer skips done futures, and
        # the request, already queued, is still committed (the caller just never hears).
        if self._metrics is None:
            out = await future
        else:
            t0 = time.perf_counter()
            out = await future
            self._metrics.journal_append_latency.observe(time.perf_counter() - t0)
        return cast(list[Message], out)

    async def append_event(self, env: Envelope) -> int:
        """Put a ``thread.*`` event in the global sequence (the relay publishes it); returns
        its seq once durable."""
        self._check_open()
        if env.type not in _JOURNAL_EVENTS:
            raise InvalidRequest(
                f"only {', '.join(sorted(_JOURNAL_EVENTS))} go through the journal", field="type"
            )
        req = _Request(kind="event", future=asyncio.get_running_loop().create_future(), env=env)
        seq = await self._submit(req)
        assert isinstance(seq, int)
        return seq

    async def erase_threads(self, refs: Sequence[ThreadRef]) -> ErasedJournal:
        """Remove the messages, tool calls and sequence-log envelopes of ``refs`` (erasure;
        see ``journal/erase.py``). Durable on return, idempotent; erasures run one at a
        time (they rewrite sequence blocks), appends go on meanwhile."""
        self._check_open()
        async with self._erase_lock:
            try:
                return await erase_threads(
                    self._wdb,
                    refs,
                    self._make_durable,
                    events_indexed_from=self._events_indexed_from,
                    last_seq=self._seq,
                )
            except SLATE_FAILURES as e:
                err = translate(e, "erasing threads")
                self._on_failure(err)
                raise err from e

    async def drop_erased_copies(self) -> None:
        """After :meth:`erase_threads`: the write-ahead log's copies of the erased appends
        leave the object store. SlateDB keeps every write in a WAL file until the memtable
        holding it is flushed to an L0 table and its garbage collector, minutes later,
        deletes the WAL files below the manifest's replay point. Here the memtable is
        flushed now (the L0 table holds what is left: the deletes, the rewritten blocks) and
        those WAL files collected at once (the collector deletes none a reader still needs).
        Copies already in older tables stay until SlateDB's compactor merges them
        (docs/owning-memory.md)."""
        self._check_open()
        if self._admin is None:
            return
        try:
            await self._wdb.flush_with_options(FlushOptions(flush_type=FlushType.MEM_TABLE))
            await self._admin.run_gc_once(_COLLECT_WAL_NOW)
        except SLATE_FAILURES as e:
            raise translate(e, "dropping the erased threads' WAL copies") from e

    async def set_relay_watermark(self, seq: int) -> None:
        """Record that the relay published everything up to ``seq`` (never moves backwards)."""
        self._check_open()
        keys.u64(seq, field="seq")
        req = _Request(
            kind="watermark", future=asyncio.get_running_loop().create_future(), watermark=seq
        )
        await self._submit(req)

    async def _submit(self, req: _Request) -> object:
        self._queue.append(req)
        self._wakeup.set()
        # A cancelled caller cancels only its future: the committer skips done futures, and
        # the request, already queued, is still committed (the caller just never hears).
        return await req.future

    # --- the committer -------------------------------------------------------------------------
    # Pipelining: while batch k is being made durable (write, WAL flush, durable wait: I/O in
    # SlateDB's threads), the committer already stages batch k+1 (the Python work: messages,
    # serialization, puts into its WriteBatch) against k's *staged* state. Batch k+1 is written
    # only once k is durable, and batches are acknowledged strictly in order, so offsets and
    # seqs stay dense: if k fails, the writer stops and k+1, never written, fails too.
    async def _run(self) -> None:
        flight: _Flight | None = None  # written, being made durable
        ready: _Flight | None = None  # staged on top of ``flight``, not yet written
        wakeup = self._wakeup
        while True:
            if flight is not None and flight.task is not None and flight.task.done():
                if self._finish(flight):
                    self._acknowledge(flight.batch)
                    self._notify_durable()
                flight = None
            if ready is not None and flight is None:
                self._seal(ready)
                if self._broken is not None:
                    self._fail_all(ready.batch, self._broken)
                elif not ready.staged.puts:  # nothing to write (e.g. a stale watermark)
                    self._apply(ready)
                else:
                    ready.task = asyncio.create_task(self._make_durable(ready.wb))
                    ready.task.add_done_callback(self._wake)
                    flight = ready
                ready = None
                continue
            if self._queue and (ready is None or ready.weight < self._max_batch):
                # start the next batch, or keep adding to it while the one before is in
                # flight: arrivals during a flight still share one batch, and its Python
                # work is done while SlateDB does the I/O
                if ready is None:
                    if flight is not None:
                        self.stats.pipelined += 1
                    base = flight.staged if flight is not None else None
                    ready = _Flight([], self._new_staged(base), WriteBatch())
                batch = self._take(self._max_batch - ready.weight, first=not ready.batch)
                if batch:
                    if not await self._stage_into(ready, batch):
                        ready = None
                    continue
            if self._closing and flight is None and ready is None and not self._queue:
                return
            await wakeup.wait()
            wakeup.clear()

    def _wake(self, _: object) -> None:
        self._wakeup.set()

    def _take(self, room: int, *, first: bool) -> list[_Request]:
        """Queued requests that fit in ``room`` messages; with ``first``, at least one (a
        request heavier than the batch limit is a batch of its own)."""
        queue = self._queue
        batch: list[_Request] = []
        weight = 0
        if first:
            batch.append(queue.popleft())
            weight = batch[0].weight
        while queue and weight + queue[0].weight <= room:
            req = queue.popleft()
            weight += req.weight
            batch.append(req)
        return batch

    @staticmethod
    def _fail_all(batch: Sequence[_Request], err: JournalError) -> None:
        for req in batch:
            if not req.future.done():
                req.future.set_exception(type(err)(err.message))

    async def _stage_into(self, ready: _Flight, batch: list[_Request]) -> bool:
        """Add ``batch`` to the batch being prepared. False when that failed: a read while
        staging failed (or a bug), so the whole prepared batch, never written, fails with it
        and is dropped; the writer stays usable unless the read said it was fenced."""
        if self._broken is not None:
            self._fail_all(batch, self._broken)
            return True
        try:
            await self._stage(batch, ready.wb, ready.staged)
        except JournalError as e:
            self._fail_all(ready.batch + batch, e)
            return False
        except Exception as e:  # a bug, not a store failure: fail the batch loudly
            log.exception("journal committer failed")
            err = JournalUnavailable(f"journal commit failed: {e!r}")
            self._fail_all(ready.batch + batch, err)
            return False
        ready.batch.extend(batch)
        ready.weight += sum(r.weight for r in batch)
        return True

    def _new_staged(self, base: _Staged | None) -> _Staged:
        """The state a new batch starts from: the batch in flight's, else the committed one."""
        if base is None:
            st = _Staged(seq=self._seq, watermark=self._watermark)
        else:
            st = _Staged(
                seq=base.seq,
                watermark=base.watermark,
                prior_offsets=base.offsets,
                prior_tools=base.tools,
            )
        st.first_seq = st.seq + 1
        return st

    @staticmethod
    def _seal(ready: _Flight) -> None:
        """Close a prepared batch: its sequence block goes in, its offsets are final."""
        st = ready.staged
        if st.block:
            ready.wb.put(keys.seq_key(st.first_seq), encode_seq_block(st.block))
            st.puts += 1
            st.block = []
        st.offsets = {ref: c.next_offset for ref, c in st.cursors.items()}
        st.cursors = {}

    async def _make_durable(self, wb: WriteBatch) -> None:
        await _write_durably(self._wdb, wb, flush_wal=self._eager_flush)

    def _finish(self, flight: _Flight) -> bool:
        """The flight's durable wait ended: commit its state (True; the caller acknowledges
        its requests), or stop the writer and fail them (False)."""
        assert flight.task is not None
        exc: BaseException | None
        if flight.task.cancelled():
            exc = RuntimeError("the durable wait was cancelled")
        else:
            exc = flight.task.exception()
        if exc is None:
            self.stats.batches += 1
            if self._metrics is not None:
                self._metrics.journal_batch_size.observe(sum(r.weight for r in flight.batch))
            self._commit_state(flight.staged)
            return True
        if isinstance(exc, SLATE_FAILURES):
            err = translate(exc, "committing appends")
        else:  # a bug: still, the batch may or may not be stored
            log.error("journal commit failed", exc_info=exc)
            err = JournalUnavailable(f"journal commit failed: {exc!r}")
        if not isinstance(err, JournalFenced):
            err = JournalUnavailable(f"{err.message}; the writer stopped and must be reopened")
        log.error("journal commit of %d requests failed: %s", len(flight.batch), err.message)
        self._broken = err
        self.stats.failed_batches += 1
        self._fail_all(flight.batch, err)
        return False

    def _apply(self, flight: _Flight) -> None:
        self._commit_state(flight.staged)
        self._acknowledge(flight.batch)
        self._notify_durable()

    def _commit_state(self, staged: _Staged) -> None:
        """Durable: only now does the committed state move forward."""
        self._seq = staged.seq
        self._watermark = staged.watermark
        for ref, nxt in staged.offsets.items():
            self._remember_offset(ref, nxt)

    def _notify_durable(self) -> None:
        for callback in self._on_durable:
            try:
                callback()
            except Exception:  # a listener's bug must not stop the committer
                log.exception("journal on_durable callback failed")

    def _acknowledge(self, batch: Sequence[_Request]) -> None:
        """Callers of a durable batch hear (after ``_commit_state``)."""
        stats = self.stats
        for req in batch:
            if req.kind == "messages":
                stats.appends += 1
                stats.messages += len(req.messages)
            elif req.kind == "event":
                stats.events += 1
            if not req.future.done():
                req.future.set_result(req.result)

    def on_durable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (synchronously, cheaply) after every durable batch: the relay
        uses it to publish at once instead of waiting for its next poll."""
        self._on_durable.append(callback)

    async def _stage(self, batch: list[_Request], wb: WriteBatch, st: _Staged) -> None:
        """Put every request of ``batch`` into ``wb``, continuing ``st`` (the batch being
        prepared: its seqs, thread cursors, tool-call records, sequence block). Committed
        state is not touched."""
        now = self._clock.now()
        ts = epoch_ms(now)
        block = st.block
        cursors = st.cursors
        for req in batch:
            if req.kind == "messages":
                assert req.ref is not None
                cursor = cursors.get(req.ref)
                if cursor is None:
                    cursor = cursors[req.ref] = await self._cursor(req.ref, st.prior_offsets)
                for msg in self._stage_messages(req, wb, st, cursor, now, ts, block):
                    st.puts += await self._stage_tool_calls(wb, msg, st.tools, st.prior_tools)
            elif req.kind == "event":
                assert req.env is not None
                st.seq += 1
                block.append(encode(req.env))
                req.result = st.seq
                env = req.env
                if env.thread_id is not None:  # where erasure finds it (keys.THREAD_EVENTS)
                    ref = ThreadRef(env.account_id, env.agent_id, env.thread_id)
                    wb.put(keys.thread_event_key(ref, st.seq), b"")
                    st.puts += 1
            elif req.watermark > st.watermark:
                st.watermark = req.watermark
                wb.put(keys.RELAY_WATERMARK, keys.u64(st.watermark))
                st.puts += 1

    async def _cursor(self, ref: ThreadRef, prior: dict[ThreadRef, int]) -> _Cursor:
        """Where the thread's next message goes: after the batch in flight (``prior``), else
        the committed cache, else the store (a descending scan, first touch only)."""
        offset = prior.get(ref)
        if offset is None:
            offset = self._offsets.get(ref)  # its recency is refreshed once durable
        if offset is None:
            offset = await self.next_offset(ref)
        prefix, tenancy = self._encoded_ref(ref)
        return _Cursor(ref, prefix, tenancy, offset)

    def _stage_messages(
        self,
        req: _Request,
        wb: WriteBatch,
        st: _Staged,
        cursor: _Cursor,
        now: datetime,
        ts: int,
        block: list[bytes],
    ) -> list[Message]:
        """Stage one ``append``'s messages at the thread cursor's offsets. Returns those that
        carry tool calls or a tool result: the caller stages their tool-call records next
        (seen through this batch, then the batch in flight, then the store)."""
        ref = cursor.ref
        prefix, tenancy = cursor.prefix, cursor.tenancy
        account_id, agent_id, thread_id = ref.account_id, ref.agent_id, ref.thread_id
        offset = cursor.next_offset
        next_id = self._ids.next
        put = wb.put
        msgs: list[Message] = []
        tooling: list[Message] = []
        for nm, tok in zip(req.messages, req.tokens, strict=True):
            st.seq += 1
            msg = message_unchecked(
                account_id,
                agent_id,
                thread_id,
                offset,
                next_id(ts),
                nm.role,
                nm.content,
                now,
                tok,
                st.seq,
                nm.reasoning,
                nm.tool_calls,
                nm.tool_call_id,
                nm.user_id,
            )
            # the stored message and the published one are the same bytes: serialized once,
            # spliced into the message.appended envelope of the sequence block
            data = orjson.dumps(msg.to_dict())
            put(prefix + keys.u64(offset), data)
            block.append(encode_message_appended(msg, ts, data, tenancy))
            st.puts += 1
            if msg.tool_calls or msg.tool_call_id:
                tooling.append(msg)
            msgs.append(msg)
            offset += 1
        cursor.next_offset = offset
        req.result = msgs
        return tooling

    def _encoded_ref(self, ref: ThreadRef) -> tuple[bytes, bytes]:
        """``keys.thread_prefix(ref)`` and the envelope's ``message_tenancy`` of the thread,
        memoized (bounded: cleared when it grows past the offset cache's size)."""
        enc = self._refs.get(ref)
        if enc is None:
            if len(self._refs) >= self._offset_cache_size:
                self._refs.clear()
            enc = self._refs[ref] = (
                keys.thread_prefix(ref),
                message_tenancy(ref.account_id, ref.agent_id, ref.thread_id),
            )
        return enc

    def _remember_offset(self, ref: ThreadRef, nxt: int) -> None:
        self._offsets[ref] = nxt
        self._offsets.move_to_end(ref)
        while len(self._offsets) > self._offset_cache_size:
            self._offsets.popitem(last=False)

    async def _stage_tool_calls(
        self,
        wb: WriteBatch,
        msg: Message,
        staged: dict[bytes, ToolCallRecord],
        prior: dict[bytes, ToolCallRecord],
    ) -> int:
        """Store the payload of each tool call an assistant message makes, and the result a
        ``tool`` message carries. Returns the number of puts added."""
        puts = 0
        for call in msg.tool_calls if msg.role == "assistant" else ():
            key = keys.tool_call_key(msg.account_id, msg.agent_id, call.id, msg.thread_id)
            prior_rec = await self._staged_or_stored(key, staged, prior)
            # a result that arrived before its call is kept; an earlier call that reused the
            # id in this thread is replaced whole (its result is not the new call's)
            early = prior_rec is not None and prior_rec.name is None
            rec = ToolCallRecord(
                name=call.name,
                arguments=call.arguments,
                result=prior_rec.result if early and prior_rec else None,
                thread_id=msg.thread_id,
                offset=msg.offset,
            )
            staged[key] = rec
            wb.put(key, encode_tool_call(rec))
            puts += 1
        if msg.role == "tool" and msg.tool_call_id:
            key = keys.tool_call_key(msg.account_id, msg.agent_id, msg.tool_call_id, msg.thread_id)
            prior_rec = await self._staged_or_stored(key, staged, prior)
            rec = (
                replace(prior_rec, result=msg.content)
                if prior_rec
                else ToolCallRecord(
                    name=None, result=msg.content, thread_id=msg.thread_id, offset=msg.offset
                )
            )
            staged[key] = rec
            wb.put(key, encode_tool_call(rec))
            puts += 1
        return puts

    async def _staged_or_stored(
        self, key: bytes, staged: dict[bytes, ToolCallRecord], prior: dict[bytes, ToolCallRecord]
    ) -> ToolCallRecord | None:
        """The record as this batch, else the batch in flight, else the store has it."""
        if key in staged:
            return staged[key]
        if key in prior:
            return prior[key]
        account, agent, call_id, thread = keys.decode_tool_call_key(key)
        assert thread is not None  # the writer only writes keys with a thread
        return await self.tool_call(account, agent, call_id, thread)

    # --- lifecycle -----------------------------------------------------------------------------
    async def close(self) -> None:
        """Commit what is queued, stop the committer and shut SlateDB down. Idempotent."""
        if self._closing:
            await self._task
            return
        self._closing = True
        self._wakeup.set()
        await self._task
        try:
            await self._wdb.shutdown()
        except SLATE_FAILURES as e:
            # a fenced or broken writer cannot shut down cleanly; nothing is left to save
            log.warning("journal shutdown: %s", e)


async def _write_durably(db: Db, wb: WriteBatch, *, flush_wal: bool) -> None:
    """Write ``wb`` and wait until it is durable (``flush_wal``: flush the WAL at once rather
    than at SlateDB's next tick)."""
    handle = await db.write(wb)
    if flush_wal:
        await db.flush_with_options(_WAL_FLUSH)
    await handle.await_durable()


class _Probe(JournalReads):
    """Reads on a freshly built Db, before the writer exists (recovery on open)."""

    def __init__(self, db: Db) -> None:
        self._db = db
