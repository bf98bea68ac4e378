"""Summaries Valkey lost: re-apply to a thread's counters what its summary store holds.

A summary applied inside Valkey's lost window (``appendfsync everysec``: up to a second or
two of acknowledged writes gone on a kill, or a failover to a replica that lagged) leaves the
thread's watermark behind its newest stored summary, and its counters still holding the
summarized messages. The counters processor then reads the lost range again (``Rewind``):
without this step, every re-read message the summary covers counted again, an early summary
request (docs/thread-memory.md).

:func:`catch_up` raises such a thread's watermark to its stored summary and subtracts the
messages between the two, read from the journal: what the summarizer's own reset would have
done, in the same atomic step, at most once per offset. Without a journal it raises the
watermark and clears the counters: a summary may come late (the messages counted between
the summary and the re-read range are forgotten), never early.

Both the catch-up and the summarizer apply a span with :func:`apply`, which subtracts from
*Valkey's* watermark, not from the span's start (:meth:`ThreadState.apply_span`): a new
summary written while Valkey still misses the previous one (the summarizer's span starts
after the stored summary, Valkey's watermark is before it) subtracts the lost summary's
messages too, so whichever of the two comes first, each summarized message is subtracted
once (before, a summary applied first left the lost one's messages counted: an early
request).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final, Protocol

from memstream.errors import RetryableInfraError
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


#: Rounds of :func:`apply` before giving up (each one follows a watermark that moved).
APPLY_ROUNDS: Final = 8


async def apply(
    state: ThreadState,
    journal: SpanReader | None,
    ref: ThreadRef,
    first: int,
    last: int,
    steps: Sequence[tuple[int, int]],
) -> bool:
    """Apply the summary of ``first..last`` (``steps``: its messages' ``(offset,
    token_count)``) from Valkey's own watermark: the messages of a summary Valkey lost before
    ``first`` are read from the journal and subtracted with it, and of a span Valkey already
    holds in part only the rest. At most once per offset; True if this call applied it.
    Without a journal, a lost summary's messages clear the counters (late, never early)."""
    todo = [(o, t) for o, t in steps if first <= o <= last]
    for _ in range(APPLY_ROUNDS):
        # a step of _ALL tokens (no journal to say what a span held) clears both counters
        clears = any(t == _ALL for _, t in todo)
        tokens = _ALL if clears else sum(t for _, t in todo)
        messages = _ALL if clears else len(todo)
        outcome = await state.apply_span(ref, first, last, tokens, messages)
        if outcome.status == "applied":
            return True
        if outcome.status == "already":
            return False
        if outcome.status == "inside":
            first = outcome.watermark + 1
            todo = [(o, t) for o, t in todo if o >= first]
            continue
        # behind: Valkey lost the summaries of watermark+1 .. first-1
        lost_from = outcome.watermark + 1
        if journal is None:
            lost = [(lost_from, _ALL)]
        else:
            lost = [
                (m.offset, m.token_count)
                for m in await journal.read_range(ref, lost_from, first - 1)
            ]
        log.warning(
            "valkey lost the summary of %s up to offset %d (it held %d): subtracted with the "
            "next one",
            ref.key,
            first - 1,
            outcome.watermark,
        )
        first, todo = lost_from, lost + todo
    raise RetryableInfraError(f"the summary watermark of {ref.key} kept moving")


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
            # Valkey lost the summary's cache entry too (an older version may be back): the
            # readers must see the summary the counters are about to count from
            assert current is not None  # a span needs a stored summary
            await summaries.refresh_cache(ref, current)
            if journal is None:
                steps = [(first, _ALL)]
            else:
                steps = [
                    (m.offset, m.token_count) for m in await journal.read_range(ref, first, last)
                ]
            applied = await apply(state, journal, ref, first, last, steps)
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
