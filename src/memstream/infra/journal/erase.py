"""Erasing threads from the journal (issue 13): log rewriting inside our own store.

What a thread left in SlateDB, and what erasure does with it:

- its messages (``m|account|agent|thread|offset``): deleted;
- the tool calls its messages made (``t|account|agent|id`` whose record names the thread):
  deleted;
- its envelopes in the sequence log (``s|first_seq`` blocks, shared with other threads):
  each block holding one is rewritten with that envelope replaced by a content-free
  ``thread.deleted`` envelope of the same tenancy (data ``{"erased": true}``). Seqs keep no
  gaps (the relay and ``replay --from-journal`` rely on that), no other thread's envelope
  changes, and no consumer does anything with ``thread.deleted``.

Deletes and rewrites are plain SlateDB writes, durable on return; compaction later drops
the old versions from object storage. Idempotent: a second run finds nothing to do.

Finding the blocks, without reading the whole log: each message record carries its seq,
and each ``thread.*`` event of a thread has an index key (``keys.THREAD_EVENTS``), so the
blocks holding the threads' envelopes are looked up one by one (the last block starting at
or before a seq holds it). Two cases read the log instead (streamed; a block is decoded only
if its raw bytes name an erased thread, :func:`thread_filter`): the part of a journal written
before events were indexed (``keys.EVENTS_INDEXED_FROM``: its blocks are all read), and a
message stored without its seq (an early release) or more seqs to find than
:data:`LOCATE_MAX_SHARE` of the log (a lookup each would cost more), which make the call read
it all. The blocks are rewritten, durably, before the keys that locate them are deleted, so
a run cut in between is finished by the next one.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import orjson
from slatedb.uniffi import Db, KeyRange, KeyValue, WriteBatch

from memstream.infra.journal import keys
from memstream.infra.journal.codec import (
    decode_seq_block,
    decode_tool_call,
    encode_seq_block,
    seq_block_len,
)
from memstream.infra.journal.reads import ALL_KEYS, ASCENDING, block_holding
from memstream.schemas.events import encode, thread_event
from memstream.schemas.records import ThreadRef

WRITE_EVERY = 256
"""Keys per write batch while erasing."""

LOCATE_MAX_SHARE = 0.02
"""Past this share of the log's seqs, the blocks are found by reading the log rather than
one lookup each (``bench/erasure_scan.py``, 100,000 envelopes: erasing 0.5% of them, the
lookups took 0.13x the time of reading the log; 10%, 1.24x; all of them, 3.7x)."""

Identity = tuple[str, str, str]


@dataclass
class ErasedJournal:
    """What one call removed: message keys, tool-call keys, sequence-log envelopes."""

    messages: int = 0
    tool_calls: int = 0
    sequence: int = 0


def placeholder(account_id: str, agent_id: str, thread_id: str, event_id: str, ts: int) -> bytes:
    """What replaces an erased envelope in the sequence log: no content, same tenancy."""
    env = thread_event(
        "thread.deleted",
        account_id,
        agent_id,
        thread_id,
        ts,
        data={"erased": True},
        event_id=f"erased-{event_id}",
    )
    return encode(env)


def thread_filter(erased: set[Identity]) -> re.Pattern[bytes]:
    """Matches a sequence block that may hold an envelope of ``erased``: the thread id as the
    envelope encoder (orjson, with which every envelope of the log is written: ``encode`` and
    the append fast path, byte-identical) writes it. A block it misses holds none of them,
    so only candidate blocks are decoded (a false positive only costs a decode). Pure."""
    needles = sorted({orjson.dumps(t) for _, _, t in erased}, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(b'"thread_id":' + n) for n in needles))


def redact_block(
    raw: bytes, erased: set[Identity], candidates: re.Pattern[bytes] | None = None
) -> tuple[bytes, int] | None:
    """A sequence block with the envelopes of ``erased`` threads replaced (and how many),
    or None when it holds none of them (nothing to write). ``candidates``
    (:func:`thread_filter`) skips decoding a block that cannot hold one. Pure."""
    if candidates is not None and candidates.search(raw) is None:
        return None
    out: list[bytes] = []
    hits = 0
    for env in decode_seq_block(raw):
        obj = orjson.loads(env)
        ident = (str(obj.get("account_id")), str(obj.get("agent_id")), str(obj.get("thread_id")))
        data = obj.get("data")
        done = isinstance(data, dict) and data.get("erased") is True
        if ident in erased and not done:
            hits += 1
            out.append(placeholder(*ident, str(obj.get("id")), int(obj.get("ts") or 0)))
        else:
            out.append(env)
    return (encode_seq_block(out), hits) if hits else None


async def _scan(db: Db, prefix: bytes, subrange: KeyRange = ALL_KEYS) -> AsyncIterator[KeyValue]:
    it = await db.scan_prefix_with_options(prefix, subrange, ASCENDING)
    while True:
        batch = await it.next_batch(WRITE_EVERY)
        for kv in batch:
            yield kv
        if len(batch) < WRITE_EVERY:
            return


class _Writes:
    """Write batches of at most ``WRITE_EVERY`` keys, each made durable."""

    def __init__(self, make_durable: Callable[[WriteBatch], Awaitable[None]]) -> None:
        self._durable = make_durable
        self._wb = WriteBatch()
        self._n = 0

    async def delete(self, key: bytes) -> None:
        self._wb.delete(key)
        await self._count()

    async def put(self, key: bytes, value: bytes) -> None:
        self._wb.put(key, value)
        await self._count()

    async def _count(self) -> None:
        self._n += 1
        if self._n >= WRITE_EVERY:
            await self.flush()

    async def flush(self) -> None:
        if self._n:
            await self._durable(self._wb)
            self._wb, self._n = WriteBatch(), 0


async def erase_threads(
    db: Db,
    refs: Sequence[ThreadRef],
    make_durable: Callable[[WriteBatch], Awaitable[None]],
    *,
    events_indexed_from: int | None = None,
    last_seq: int = 0,
) -> ErasedJournal:
    """Remove every trace of ``refs`` from the journal (see the module docstring).
    ``events_indexed_from``: the first seq whose thread events are indexed (None: none are,
    so the whole log is read); ``last_seq``: the log's size, which bounds the lookups."""
    out = ErasedJournal()
    if not refs:
        return out
    erased = {(r.account_id, r.agent_id, r.thread_id) for r in refs}
    writes = _Writes(make_durable)
    most = int(LOCATE_MAX_SHARE * last_seq) if events_indexed_from else 0
    located = await _locate(db, refs, most, below=events_indexed_from or 0)
    candidates = thread_filter(erased)
    if located.unknown or located.too_many:
        blocks = _scan(db, keys.SEQUENCE)
    else:
        assert events_indexed_from is not None  # else nothing is located (most == 0)
        blocks = _blocks_holding(db, located.seqs, below=events_indexed_from)
    async for kv in blocks:
        redacted = redact_block(kv.value, erased, candidates)
        if redacted is not None:
            await writes.put(kv.key, redacted[0])
            out.sequence += redacted[1]
    await writes.flush()  # the blocks first: until then, the keys below still locate them
    for key in located.messages:
        await writes.delete(key)
    for key in located.events:
        await writes.delete(key)
    out.messages = len(located.messages)
    for account_id, agent_id in sorted({(a, g) for a, g, _ in erased}):
        async for kv in _scan(db, keys.agent_tool_calls_prefix(account_id, agent_id)):
            thread = keys.decode_tool_call_key(kv.key)[3] or decode_tool_call(kv.value).thread_id
            if (account_id, agent_id, thread) in erased:
                await writes.delete(kv.key)
                out.tool_calls += 1
    await writes.flush()
    return out


@dataclass
class _Located:
    """The threads' message keys and event-index keys, and the seqs they name."""

    messages: list[bytes] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)
    seqs: set[int] = field(default_factory=set)
    unknown: bool = False  # a message stored without its seq
    too_many: bool = False  # more seqs than a lookup each is worth (then not all are here)


async def _locate(db: Db, refs: Sequence[ThreadRef], most: int, *, below: int) -> _Located:
    """The keys to delete, and the seqs at or past ``below`` they name (the blocks below are
    read whole anyway) until there are more than ``most`` (past that the log is read, so the
    records are not parsed for it)."""
    found = _Located(too_many=most <= 0)

    def add(seq: int) -> None:
        if seq >= below:
            found.seqs.add(seq)
            found.too_many = len(found.seqs) > most

    for ref in refs:
        async for kv in _scan(db, keys.thread_prefix(ref)):
            found.messages.append(kv.key)
            if found.too_many or found.unknown:
                continue
            seq = orjson.loads(kv.value).get("seq")
            if type(seq) is int and seq > 0:
                add(seq)
            else:
                found.unknown = True
        async for kv in _scan(db, keys.thread_events_prefix(ref)):
            found.events.append(kv.key)
            if not found.too_many:
                add(keys.decode_thread_event_key(kv.key)[1])
    return found


async def _blocks_holding(db: Db, seqs: set[int], *, below: int) -> AsyncIterator[KeyValue]:
    """Every block that starts before ``below`` (events there are not indexed), then the
    block holding each of ``seqs`` at or past it, each once, in seq order."""
    legacy = KeyRange(start=None, start_inclusive=False, end=keys.u64(below), end_inclusive=False)
    if below > 1:
        async for kv in _scan(db, keys.SEQUENCE, legacy):
            yield kv
    covered = below - 1  # the last seq of the blocks yielded so far
    for seq in sorted(s for s in seqs if s >= below):
        if seq <= covered:
            continue
        kv = await block_holding(db, seq)
        if kv is None:
            continue
        covered = keys.decode_seq_key(kv.key) + seq_block_len(kv.value) - 1
        yield kv
