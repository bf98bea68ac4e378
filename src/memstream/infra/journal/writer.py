"""``Journal``: the single fenced SlateDB writer of the journal, with group commit.

Guarantees:

- **Durable before acknowledged.** ``append`` returns only after SlateDB reports the write
  batch holding its messages durable (WAL flushed to the object store). Reads (here and in
  :class:`~memstream.infra.journal.reader.JournalReader`) only see durable data.
- **Group commit.** One committer task owns all writes. Appends that arrive while a batch is
  being made durable queue up and are committed together: one ``WriteBatch``, one WAL flush,
  one durable wait for all of them (``stats.batches`` counts them). All messages of one
  ``append`` call are in one batch, so they become durable together or not at all.
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
from typing import Literal

import orjson
from slatedb.uniffi import (
    Db,
    DbBuilder,
    FlushOptions,
    FlushType,
    ObjectStore,
    WriteBatch,
)
from slatedb.uniffi import Settings as SlateSettings

from memstream.clock import Clock, SystemClock, epoch_ms
from memstream.errors import InvalidRequest, JournalError, JournalFenced, JournalUnavailable
from memstream.infra.journal import fastpath, keys
from memstream.infra.journal.codec import ToolCallRecord, encode_seq_block, encode_tool_call
from memstream.infra.journal.failures import SLATE_FAILURES, translate
from memstream.infra.journal.reads import JournalReads
from memstream.infra.metrics import Metrics
from memstream.infra.tokenizer import count_message_tokens
from memstream.schemas.events import Envelope, encode, message_appended
from memstream.schemas.limits import MAX_MESSAGES_PER_APPEND
from memstream.schemas.records import ROLES, Message, NewMessage, ThreadRef

log = logging.getLogger(__name__)

TokenCounter = Callable[[NewMessage], int]
_JOURNAL_EVENTS = frozenset({"thread.created", "thread.configured", "thread.deleted"})
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
    puts: int = 0


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
        metrics: Metrics | None = None,
    ) -> None:
        self._db = db
        self._metrics = metrics
        self._wdb = db
        self._clock = clock
        self._count_tokens = count_tokens
        self._max_batch = max(1, max_batch)
        self._eager_flush = eager_flush
        self._seq = last_seq
        self._watermark = watermark
        self._offsets: OrderedDict[ThreadRef, int] = OrderedDict()
        self._offset_cache_size = offset_cache_size
        self._ids = _MessageIds()
        self._queue: deque[_Request] = deque()
        self._wakeup = asyncio.Event()
        self._broken: JournalError | None = None
        self._closing = False
        self.stats = JournalStats()
        self._on_durable: list[Callable[[], None]] = []
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
        log.info("journal opened at %r: last seq %d, relay watermark %d", path, last_seq, watermark)
        return cls(
            db,
            clock=clock or SystemClock(),
            count_tokens=count_tokens,
            max_batch=max_batch,
            eager_flush=eager_flush,
            last_seq=last_seq,
            watermark=watermark,
            offset_cache_size=offset_cache_size,
            metrics=metrics,
        )

    # --- state ---------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return isinstance(self._broken, JournalFenced)

    def _on_failure(self, err: JournalError) -> None:
        if isinstance(err, JournalFenced) and self._broken is None:
            log.error("journal writer fenced by a newer writer; it accepts no more appends")
            self._broken = err

    def _check_open(self) -> None:
        if self._broken is not None:
            raise type(self._broken)(self._broken.message)
        if self._closing:
            raise JournalUnavailable("the journal writer is closed")

    # --- writes --------------------------------------------------------------------------------
    async def append(self, ref: ThreadRef, messages: Sequence[NewMessage]) -> list[Message]:
        """Append messages to a thread; returns them with offset, id, seq, created_at and
        token count, once durable. All or none of them are stored."""
        self._check_open()
        if not messages:
            raise InvalidRequest("at least one message is required", field="messages")
        if len(messages) > MAX_MESSAGES_PER_APPEND:
            raise InvalidRequest(
                f"at most {MAX_MESSAGES_PER_APPEND} messages per append", field="messages"
            )
        for i, m in enumerate(messages):
            if m.role not in ROLES:
                raise InvalidRequest(
                    f"role must be one of {', '.join(ROLES)}", field=f"messages[{i}].role"
                )
            if not isinstance(m.content, str):
                raise InvalidRequest("content must be a string", field=f"messages[{i}].content")
        tokens = [self._count_tokens(m) for m in messages]
        req = _Request(
            kind="messages",
            future=asyncio.get_running_loop().create_future(),
            ref=ref,
            messages=messages,
            tokens=tokens,
            weight=len(messages),
        )
        t0 = time.perf_counter()
        out = await self._submit(req)
        if self._metrics is not None:
            self._metrics.journal_append_latency.observe(time.perf_counter() - t0)
        assert isinstance(out, list)
        return out

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
    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                batch = [self._queue.popleft()]
                weight = batch[0].weight
                while self._queue and weight + self._queue[0].weight <= self._max_batch:
                    req = self._queue.popleft()
                    weight += req.weight
                    batch.append(req)
                try:
                    await self._commit(batch)
                except Exception as e:  # a bug, not a store failure: fail the batch loudly
                    log.exception("journal committer failed")
                    self._fail_all(batch, JournalUnavailable(f"journal commit failed: {e!r}"))
            if self._closing:
                return

    @staticmethod
    def _fail_all(batch: Sequence[_Request], err: JournalError) -> None:
        for req in batch:
            if not req.future.done():
                req.future.set_exception(type(err)(err.message))

    async def _commit(self, batch: list[_Request]) -> None:
        if self._broken is not None:
            self._fail_all(batch, self._broken)
            return
        wb = WriteBatch()
        try:
            staged = await self._stage(batch, wb)
        except JournalError as e:
            # a read while staging failed: nothing was written, the writer stays usable
            # unless the read told us we are fenced (then ``_broken`` is already set)
            self._fail_all(batch, e)
            return
        if staged.puts:
            try:
                handle = await self._wdb.write(wb)
                if self._eager_flush:
                    await self._wdb.flush_with_options(_WAL_FLUSH)
                await handle.await_durable()
            except SLATE_FAILURES as e:
                err = translate(e, "committing appends")
                if not isinstance(err, JournalFenced):
                    err = JournalUnavailable(
                        f"{err.message}; the writer stopped and must be reopened"
                    )
                log.error("journal commit of %d requests failed: %s", len(batch), err.message)
                self._broken = err
                self.stats.failed_batches += 1
                self._fail_all(batch, err)
                return
            self.stats.batches += 1
            if self._metrics is not None:
                self._metrics.journal_batch_size.observe(sum(r.weight for r in batch))
        # durable: only now does the committed state move forward
        self._seq = staged.seq
        self._watermark = staged.watermark
        for ref, nxt in staged.offsets.items():
            self._remember_offset(ref, nxt)
        for req in batch:
            if req.kind == "messages":
                self.stats.appends += 1
                self.stats.messages += len(req.messages)
            elif req.kind == "event":
                self.stats.events += 1
            if not req.future.done():
                req.future.set_result(req.result)
        for callback in self._on_durable:
            callback()

    def on_durable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (synchronously, cheaply) after every durable batch: the relay
        uses it to publish at once instead of waiting for its next poll."""
        self._on_durable.append(callback)

    async def _stage(self, batch: list[_Request], wb: WriteBatch) -> _Staged:
        """Put every request of the batch into ``wb``; committed state is not touched."""
        now = self._clock.now()
        ts = epoch_ms(now)
        st = _Staged(seq=self._seq, watermark=self._watermark)
        tools: dict[bytes, ToolCallRecord] = {}
        block: list[bytes] = []  # envelopes of seqs self._seq+1 .. st.seq, one value
        next_id = self._ids.next
        for req in batch:
            if req.kind == "messages":
                assert req.ref is not None
                ref = req.ref
                prefix = keys.thread_prefix(ref)
                base = st.offsets.get(ref)
                if base is None:
                    base = await self._offset_of(ref)
                msgs: list[Message] = []
                for i, (nm, tok) in enumerate(zip(req.messages, req.tokens, strict=True)):
                    st.seq += 1
                    msg = Message(
                        account_id=ref.account_id,
                        agent_id=ref.agent_id,
                        thread_id=ref.thread_id,
                        offset=base + i,
                        message_id=next_id(ts),
                        role=nm.role,
                        content=nm.content,
                        created_at=now,
                        token_count=tok,
                        seq=st.seq,
                        reasoning=nm.reasoning,
                        tool_calls=nm.tool_calls,
                        tool_call_id=nm.tool_call_id,
                        user_id=nm.user_id,
                    )
                    env = message_appended(msg, ts)
                    # env.data is msg.to_dict(): the stored and the published message are
                    # the same bytes' worth of fields, serialized once each
                    wb.put(prefix + keys.u64(msg.offset), orjson.dumps(env.data))
                    block.append(encode(env))
                    st.puts += 1
                    if msg.tool_calls or msg.tool_call_id:
                        st.puts += await self._stage_tool_calls(wb, msg, tools)
                    msgs.append(msg)
                st.offsets[ref] = base + len(msgs)
                req.result = msgs
            elif req.kind == "event":
                assert req.env is not None
                st.seq += 1
                block.append(encode(req.env))
                req.result = st.seq
            elif req.watermark > st.watermark:
                st.watermark = req.watermark
                wb.put(keys.RELAY_WATERMARK, keys.u64(st.watermark))
                st.puts += 1
        if block:
            wb.put(keys.seq_key(self._seq + 1), encode_seq_block(block))
            st.puts += 1
        return st

    async def _offset_of(self, ref: ThreadRef) -> int:
        nxt = self._offsets.get(ref)
        if nxt is not None:
            self._offsets.move_to_end(ref)
            return nxt
        return await self.next_offset(ref)

    def _remember_offset(self, ref: ThreadRef, nxt: int) -> None:
        self._offsets[ref] = nxt
        self._offsets.move_to_end(ref)
        while len(self._offsets) > self._offset_cache_size:
            self._offsets.popitem(last=False)

    async def _stage_tool_calls(
        self, wb: WriteBatch, msg: Message, staged: dict[bytes, ToolCallRecord]
    ) -> int:
        """Store the payload of each tool call an assistant message makes, and the result a
        ``tool`` message carries. Returns the number of puts added."""
        puts = 0
        for call in msg.tool_calls if msg.role == "assistant" else ():
            key = keys.tool_call_key(msg.account_id, msg.agent_id, call.id)
            prior = await self._staged_or_stored(key, staged)
            rec = ToolCallRecord(
                name=call.name,
                arguments=call.arguments,
                result=prior.result if prior else None,
                thread_id=msg.thread_id,
                offset=msg.offset,
            )
            staged[key] = rec
            wb.put(key, encode_tool_call(rec))
            puts += 1
        if msg.role == "tool" and msg.tool_call_id:
            key = keys.tool_call_key(msg.account_id, msg.agent_id, msg.tool_call_id)
            prior = await self._staged_or_stored(key, staged)
            rec = (
                replace(prior, result=msg.content)
                if prior
                else ToolCallRecord(
                    name=None, result=msg.content, thread_id=msg.thread_id, offset=msg.offset
                )
            )
            staged[key] = rec
            wb.put(key, encode_tool_call(rec))
            puts += 1
        return puts

    async def _staged_or_stored(
        self, key: bytes, staged: dict[bytes, ToolCallRecord]
    ) -> ToolCallRecord | None:
        if key in staged:
            return staged[key]
        account, agent, call_id = keys.decode_tool_call_key(key)
        return await self.tool_call(account, agent, call_id)

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


class _Probe(JournalReads):
    """Reads on a freshly built Db, before the writer exists (recovery on open)."""

    def __init__(self, db: Db) -> None:
        self._db = db
