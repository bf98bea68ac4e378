"""Summaries Valkey lost: re-apply to a thread's counters what its summary store holds.

A summary applied inside Valkey's lost window (``appendfsync everysec``: up to a second or
two of acknowledged writes gone on a kill, or a failover to a replica that lagged) leaves the
thread's watermark behind its newest stored summary, and its counters still holding the
summarized messages. The counters processor then reads the lost range again (``Rewind``):
without this step, every re-read message the summary covers counted again, an early summary
request (docs/thread-memory.md).

:func:`catch_up` raises such a thread's watermark to its stored summary and subtracts the
messages between the two, read from the journal: what the summarizer's own reset would have
done, in the same atomic step (:meth:`ThreadState.apply_summary`, at most once per offset).
Without a journal it raises the watermark and clears the counters: a summary may come late
(the messages counted between the summary and the re-read range are forgotten), never early.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final, Protocol

from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.schemas.records import Message, ThreadRef

log = logging.getLogger(__name__)

#: Threads checked at once (object-store reads, then journal reads).
CONCURRENCY: Final = 32
#: What clears the counters when there is no journal to say what to subtract (clamped at 0).
_ALL: Final = 1 << 62


class SpanReader(Protocol):
    """A thread's messages from the journal (``Journal`` and ``JournalReader`` fit)."""

    async def read_range(self, ref: ThreadRef, start: int, end_inclusive: int) -> list[Message]: ...


def lost_span(redis_watermark: int | None, stored: int | None) -> tuple[int, int] | None:
    """The offsets ``(first, last)`` a stored summary covers and Valkey's watermark does not;
    None when nothing is missing (pure). An unknown Valkey watermark (None) is not a lost
    summary: the counters load it from the store on first sight."""
    if redis_watermark is None or stored is None or stored <= redis_watermark:
        return None
    return redis_watermark + 1, stored


async def catch_up(
    state: ThreadState,
    summaries: SummaryStore,
    journal: SpanReader | None,
    refs: Sequence[ThreadRef],
) -> list[ThreadRef]:
    """Re-apply the summaries Valkey lost for ``refs``; the threads it changed."""
    if not refs:
        return []
    marks = await state.watermarks(refs)
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(ref: ThreadRef, mark: int | None) -> bool:
        if mark is None:
            return False
        async with slots:
            current = await summaries.get_stored(ref)
            span = lost_span(mark, current.last_message_offset if current is not None else None)
            if span is None:
                return False
            first, last = span
            if journal is None:
                tokens = messages = _ALL
            else:
                msgs = await journal.read_range(ref, first, last)
                tokens, messages = sum(m.token_count for m in msgs), len(msgs)
            applied = await state.apply_summary(ref, last, tokens, messages)
        if applied:
            log.warning(
                "valkey lost the summary of %s up to offset %d (it held %d): re-applied",
                ref.key,
                last,
                mark,
            )
        return applied

    done = await asyncio.gather(*(one(r, m) for r, m in zip(refs, marks, strict=True)))
    return [r for r, ok in zip(refs, done, strict=True) if ok]
