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
the old versions from object storage. Idempotent: a second run finds nothing to do. The
sequence scan reads the whole log once per call (streamed, not held in memory), so erase
many threads in one call; a block is decoded only if the raw bytes name one of the erased
threads (:func:`thread_filter`), so the scan costs little more than reading the log.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import orjson
from slatedb.uniffi import Db, KeyValue, WriteBatch

from memstream.infra.journal import keys
from memstream.infra.journal.codec import decode_seq_block, decode_tool_call, encode_seq_block
from memstream.infra.journal.reads import ALL_KEYS, ASCENDING
from memstream.schemas.events import encode, thread_event
from memstream.schemas.records import ThreadRef

WRITE_EVERY = 256
"""Keys per write batch while erasing."""

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


async def _scan(db: Db, prefix: bytes) -> AsyncIterator[KeyValue]:
    it = await db.scan_prefix_with_options(prefix, ALL_KEYS, ASCENDING)
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
    db: Db, refs: Sequence[ThreadRef], make_durable: Callable[[WriteBatch], Awaitable[None]]
) -> ErasedJournal:
    """Remove every trace of ``refs`` from the journal (see the module docstring)."""
    out = ErasedJournal()
    if not refs:
        return out
    erased = {(r.account_id, r.agent_id, r.thread_id) for r in refs}
    writes = _Writes(make_durable)
    for ref in refs:
        async for kv in _scan(db, keys.thread_prefix(ref)):
            await writes.delete(kv.key)
            out.messages += 1
    for account_id, agent_id in sorted({(a, g) for a, g, _ in erased}):
        async for kv in _scan(db, keys.agent_tool_calls_prefix(account_id, agent_id)):
            thread = keys.decode_tool_call_key(kv.key)[3] or decode_tool_call(kv.value).thread_id
            if (account_id, agent_id, thread) in erased:
                await writes.delete(kv.key)
                out.tool_calls += 1
    candidates = thread_filter(erased)
    async for kv in _scan(db, keys.SEQUENCE):
        redacted = redact_block(kv.value, erased, candidates)
        if redacted is not None:
            await writes.put(kv.key, redacted[0])
            out.sequence += redacted[1]
    await writes.flush()
    return out
