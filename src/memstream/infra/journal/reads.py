"""The journal's read methods, shared by the writer (:class:`Journal`) and :class:`JournalReader`.

Reads only ever return *durable* data: scans and gets use SlateDB's ``REMOTE`` durability
filter, so a message the writer has staged but not yet acknowledged is never visible, and a
write that is later lost (fencing) was never seen by anyone.

Every SlateDB failure becomes :class:`~memstream.errors.JournalUnavailable` (or
:class:`~memstream.errors.JournalFenced` for a fenced writer): callers never see a driver
error, and a failed read is never replaced by a stale or empty answer.
"""

from __future__ import annotations

from typing import Protocol

from slatedb.uniffi import (
    DbIterator,
    DurabilityLevel,
    IterationOrder,
    KeyRange,
    KeyValue,
    ReadOptions,
    ScanOptions,
)

from memstream.errors import InvalidRequest, JournalError
from memstream.infra.journal import keys
from memstream.infra.journal.codec import (
    ToolCallRecord,
    decode_message,
    decode_seq_block,
    decode_tool_call,
    seq_block_len,
)
from memstream.infra.journal.failures import SLATE_FAILURES, translate
from memstream.schemas.records import Message, ThreadRef

_ALL = KeyRange(start=None, start_inclusive=False, end=None, end_inclusive=False)
_READ = ReadOptions(durability_filter=DurabilityLevel.REMOTE, dirty=False, cache_blocks=True)
_SCAN_BATCH = 256
TOOL_CALL_SCAN_MAX = 1_000
"""At most this many threads' records of one tool-call id are read by one lookup."""


def _scan_options(order: IterationOrder, read_ahead: int = 64 * 1024) -> ScanOptions:
    return ScanOptions(
        durability_filter=DurabilityLevel.REMOTE,
        dirty=False,
        read_ahead_bytes=read_ahead,
        cache_blocks=True,
        max_fetch_tasks=1,
        order=order,
    )


_ASC = _scan_options(IterationOrder.ASCENDING)
ASCENDING = _ASC
ALL_KEYS = _ALL
_DESC = _scan_options(IterationOrder.DESCENDING, read_ahead=16 * 1024)


class SlateReadable(Protocol):
    """What both ``slatedb.Db`` and ``slatedb.DbReader`` offer for reading."""

    async def get_with_options(self, key: bytes, options: ReadOptions) -> bytes | None: ...

    async def scan_prefix_with_options(
        self, prefix: bytes, subrange: KeyRange, options: ScanOptions
    ) -> DbIterator: ...


async def block_holding(db: SlateReadable, seq: int, *, field: str = "seq") -> KeyValue | None:
    """The sequence block holding ``seq``: the last one that starts at or before it (None
    when none does). Driver errors are the caller's to translate; an out-of-range ``seq``
    is an ``InvalidRequest`` naming ``field``."""
    upto = KeyRange(
        start=None, start_inclusive=False, end=keys.u64(seq, field=field), end_inclusive=True
    )
    it = await db.scan_prefix_with_options(keys.SEQUENCE, upto, _DESC)
    rows = await it.next_batch(1)
    return rows[0] if rows else None


class JournalReads:
    """Read methods over one SlateDB handle. Subclasses provide ``_db`` and may hook
    ``_on_failure`` (the writer uses it to notice it was fenced)."""

    _db: SlateReadable

    def _on_failure(self, err: JournalError) -> None:  # pragma: no cover - hook
        """Called with every translated failure before it is raised."""

    def _fail(self, exc: BaseException, doing: str) -> JournalError:
        err = translate(exc, doing)
        self._on_failure(err)
        return err

    # --- primitives ----------------------------------------------------------------------------
    async def _get(self, key: bytes, doing: str) -> bytes | None:
        try:
            return await self._db.get_with_options(key, _READ)
        except SLATE_FAILURES as e:
            raise self._fail(e, doing) from e

    async def _scan(
        self, prefix: bytes, subrange: KeyRange, *, limit: int | None, descending: bool, doing: str
    ) -> list[KeyValue]:
        out: list[KeyValue] = []
        try:
            it = await self._db.scan_prefix_with_options(
                prefix, subrange, _DESC if descending else _ASC
            )
            while limit is None or len(out) < limit:
                want = _SCAN_BATCH if limit is None else min(_SCAN_BATCH, limit - len(out))
                batch = await it.next_batch(want)
                out.extend(batch)
                if len(batch) < want:
                    break
        except SLATE_FAILURES as e:
            raise self._fail(e, doing) from e
        return out

    # --- messages ------------------------------------------------------------------------------
    async def last(self, ref: ThreadRef, n: int) -> list[Message]:
        """The last ``n`` durable messages of a thread, oldest first (fewer if it has fewer)."""
        if n < 0:
            raise InvalidRequest("n must be >= 0", field="n")
        if n == 0:
            return []
        rows = await self._scan(
            keys.thread_prefix(ref), _ALL, limit=n, descending=True, doing="reading a thread"
        )
        return [decode_message(kv.value) for kv in reversed(rows)]

    async def read_range(self, ref: ThreadRef, start: int, end_inclusive: int) -> list[Message]:
        """Messages with ``start <= offset <= end_inclusive``, in offset order."""
        if start < 0:
            raise InvalidRequest("start must be >= 0", field="start")
        if end_inclusive < start:
            return []
        span = KeyRange(
            start=keys.u64(start, field="start"),
            start_inclusive=True,
            end=keys.u64(end_inclusive, field="end"),
            end_inclusive=True,
        )
        rows = await self._scan(
            keys.thread_prefix(ref), span, limit=None, descending=False, doing="reading a range"
        )
        return [decode_message(kv.value) for kv in rows]

    async def next_offset(self, ref: ThreadRef) -> int:
        """The offset the thread's next message will get (0 for an empty thread)."""
        rows = await self._scan(
            keys.thread_prefix(ref), _ALL, limit=1, descending=True, doing="reading an offset"
        )
        if not rows:
            return 0
        return keys.decode_message_key(rows[0].key)[1] + 1

    # --- tool calls ----------------------------------------------------------------------------
    async def tool_call(
        self, account_id: str, agent_id: str, tool_call_id: str, thread_id: str
    ) -> ToolCallRecord | None:
        """The stored tool call with this id in this thread of this account/agent, or None."""
        raw = await self._get(
            keys.tool_call_key(account_id, agent_id, tool_call_id, thread_id),
            "reading a tool call",
        )
        return None if raw is None else decode_tool_call(raw)

    async def tool_calls(
        self, account_id: str, agent_id: str, tool_call_id: str, limit: int = TOOL_CALL_SCAN_MAX
    ) -> list[ToolCallRecord]:
        """Every thread's record of this tool-call id (at most ``limit``), by thread id."""
        rows = await self._scan(
            keys.tool_call_prefix(account_id, agent_id, tool_call_id),
            _ALL,
            limit=limit,
            descending=False,
            doing="reading tool calls",
        )
        return [decode_tool_call(kv.value) for kv in rows]

    # --- the global sequence (for the relay) ---------------------------------------------------
    async def read_seq(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` sequenced records with seq > ``after_seq``, in seq order, as
        ``(seq, encoded Envelope)``. Seqs start at 1 and have no gaps."""
        if limit <= 0:
            return []
        if after_seq < 0:
            raise InvalidRequest("after_seq must be >= 0", field="after_seq")
        want = after_seq + 1
        try:
            head = await block_holding(self._db, want, field="after_seq")
        except SLATE_FAILURES as e:
            raise self._fail(e, "reading the sequence") from e
        start = keys.decode_seq_key(head.key) if head else want
        out: list[tuple[int, bytes]] = []
        span = KeyRange(start=keys.u64(start), start_inclusive=True, end=None, end_inclusive=False)
        try:
            it = await self._db.scan_prefix_with_options(keys.SEQUENCE, span, _ASC)
            while len(out) < limit:
                rows = await it.next_batch(8)
                for kv in rows:
                    first = keys.decode_seq_key(kv.key)
                    for i, env in enumerate(decode_seq_block(kv.value)):
                        if first + i >= want and len(out) < limit:
                            out.append((first + i, env))
                if len(rows) < 8:
                    break
        except SLATE_FAILURES as e:
            raise self._fail(e, "reading the sequence") from e
        return out

    async def last_seq(self) -> int:
        """The highest durable seq (0 when the journal is empty)."""
        rows = await self._scan(
            keys.SEQUENCE, _ALL, limit=1, descending=True, doing="reading the sequence"
        )
        if not rows:
            return 0
        return keys.decode_seq_key(rows[0].key) + seq_block_len(rows[0].value) - 1

    async def events_indexed_from(self) -> int | None:
        """The first seq whose thread events are indexed (``keys.THREAD_EVENTS``); None for
        a journal opened by no release that indexes them."""
        raw = await self._get(keys.EVENTS_INDEXED_FROM, "reading the journal's metadata")
        return None if raw is None else keys.read_u64(raw)

    async def relay_watermark(self) -> int:
        """The highest seq the relay recorded as published (0 if none)."""
        raw = await self._get(keys.RELAY_WATERMARK, "reading the relay watermark")
        return 0 if raw is None else keys.read_u64(raw)
