"""The summarizer processor: progressive thread summaries, after a pre-compaction flush.

Consumes ``summaries`` (``summary.requested``; ``summary.written`` and others are ignored).
For a request ending at offset U of a thread:

1. take the thread's summarization lock in Redis, as a lease: it expires
   ``summary_lock_lease_s`` (10 s) after the holder last renewed it, and the holder renews
   it every third of that while it works, for at most ``summary_lock_ttl_s`` (120 s); so a
   crashed holder's lock runs out within the lease, not the whole bound (a summarizer
   SIGKILLed mid-summary stalled its partitions' summaries for 120 s before); a busy lock
   is waited for;
2. read the current summary from object storage (not the cache); if it already covers U the
   request is a redelivery: only make sure the summary's after-effects happened (below);
3. wait until the journal shows U, then read the span ``(previous.last_message_offset, U]``
   straight from the journal;
4. **pre-compaction flush**, only when the agent has the Memory capability bound, and once
   per span (a Redis claim keyed by thread and span: a retried request or a summary that
   lost a version race does not flush the same span again): one silent model turn
   (:class:`~memstream.infra.llm.ports.FactExtractor`) per user of the span, over that
   user's own messages only, whose facts are stored for that user with the same path and
   policies as ``memory_store`` (messages without a user give facts without a user); best
   effort: any failure is logged and never blocks;
5. summarize progressively (the previous content is passed to the model with the span);
6. write version N+1 with the optimistic check (a lost race re-reads and starts over);
7. publish ``summary.written`` (deterministic id per version), then subtract the span from
   the threshold counters, raise the watermark and clear the guard (one atomic step).

Guarantees: exactly one summary per version (the store's claim), a redelivered or raced
request never writes twice, and after-effects are repaired by a redelivery if the worker
crashed between the write and them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from memstream.clock import Clock, SystemClock, epoch_ms
from memstream.errors import Conflict, MemstreamError, RetryableInfraError
from memstream.infra.llm.ports import FactExtractor, SummaryModel
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.events import DecodeError, Envelope, summary_written
from memstream.schemas.records import Caller, Message, Summary, ThreadRef
from memstream.schemas.topics import SUMMARIES
from memstream.streams.processor import EventMeta, Processor, ProcessorContext
from memstream.streams.summary_catchup import apply as apply_span

log = logging.getLogger(__name__)


class SpanJournal(Protocol):
    """What the summarizer reads from the journal (``Journal`` and ``JournalReader`` fit)."""

    async def read_range(self, ref: ThreadRef, start: int, end_inclusive: int) -> list[Message]: ...

    async def next_offset(self, ref: ThreadRef) -> int: ...


class _AgentLike(Protocol):
    @property
    def memory(self) -> bool: ...


class AgentDirectory(Protocol):
    """Whether an agent has Memory bound (``memstream.infra.accounts.Accounts`` fits)."""

    async def get_agent(self, account_id: str, agent_id: str) -> _AgentLike | None: ...


class FactSink(Protocol):
    """The ``memory_store`` path (``MemoryService`` fits)."""

    async def store(
        self,
        caller: Caller,
        key: object,
        content: object,
        category: object,
        scope: object,
        importance: object = None,
    ) -> object: ...


FLUSH_CLAIM_TTL_S = 7 * 24 * 3600
"""How long a span's flush claim is kept (far longer than any retry of its summary)."""


def messages_by_user(span: Sequence[Message]) -> list[tuple[str | None, list[Message]]]:
    """The span's user messages grouped by the user who wrote them, in order of first
    appearance: each user's facts are extracted from that user's own words only."""
    groups: dict[str | None, list[Message]] = {}
    for m in span:
        if m.role == "user":
            groups.setdefault(m.user_id, []).append(m)
    return list(groups.items())


class SummarizerProcessor(Processor):
    """Progressive summaries with the pre-compaction flush (see module doc)."""

    name = "summarizer"
    topic = SUMMARIES

    def __init__(
        self,
        journal: SpanJournal,
        state: ThreadState,
        store: SummaryStore,
        model: SummaryModel,
        *,
        agents: AgentDirectory | None = None,
        extractor: FactExtractor | None = None,
        memory: FactSink | None = None,
        token_budget: int = 512,
        lock_ttl_s: float = 120.0,
        lock_lease_s: float = 10.0,
        journal_wait_s: float = 5.0,
        flush_timeout_s: float = 30.0,
        summary_timeout_s: float = 60.0,
        clock: Clock | None = None,
        name: str = "summarizer",
    ) -> None:
        self.name = name  # another name means another consumer group (tests race two)
        self._journal = journal
        self._state = state
        self._store = store
        self._model = model
        self._agents = agents
        self._extractor = extractor
        self._memory = memory
        self._budget = token_budget
        self._lock_ttl = lock_ttl_s
        self._lease = min(lock_lease_s, lock_ttl_s)
        self._journal_wait = journal_wait_s
        self._flush_timeout = flush_timeout_s
        self._summary_timeout = summary_timeout_s
        self._clock = clock or SystemClock()
        self._ctx: ProcessorContext | None = None

    async def start(self, ctx: ProcessorContext) -> None:
        self._ctx = ctx

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        if envelope.type != "summary.requested" or envelope.thread_id is None:
            return
        up_to = envelope.data.get("up_to_offset")
        if not isinstance(up_to, int) or isinstance(up_to, bool) or up_to < 0:
            raise DecodeError(
                "up_to_offset must be a non-negative integer", field="data.up_to_offset"
            )
        ref = ThreadRef(envelope.account_id, envelope.agent_id, envelope.thread_id)
        await self.summarize(ref, up_to)

    # --- the job -------------------------------------------------------------------------------
    async def summarize(self, ref: ThreadRef, up_to: int) -> Summary | None:
        """Fold the thread up to offset ``up_to`` into its summary (idempotent).

        Returns the summary written now, or None when the span was already covered.
        """
        token = await self._lock(ref)
        renewing = asyncio.create_task(self._renew(ref, token), name=f"lease-{ref.key}")
        try:
            while True:
                prev = await self._store.get_stored(ref)
                if prev is not None and prev.last_message_offset >= up_to:
                    await self._repair(ref, prev)
                    return None
                start = prev.last_message_offset + 1 if prev is not None else 0
                span = await self._read_span(ref, start, up_to)
                await self._flush(ref, span)
                content = await self._summarize(prev, span)
                summary = Summary(
                    version=(prev.version if prev is not None else 0) + 1,
                    timestamp=self._clock.now(),
                    last_message_offset=span[-1].offset,
                    last_message_id=span[-1].message_id,
                    content=content,
                    token_count=count_tokens(content),
                    message_count=(prev.message_count if prev is not None else 0) + len(span),
                )
                try:
                    await self._store.write(
                        ref, summary, expected_previous_version=prev.version if prev else 0
                    )
                except Conflict:
                    log.info("summary of %s: lost version %d, re-reading", ref.key, summary.version)
                    continue
                await self._after_write(ref, summary, span)
                log.info(
                    "summary of %s: v%d covers offsets %d..%d (%d tokens)",
                    ref.key,
                    summary.version,
                    start,
                    summary.last_message_offset,
                    summary.token_count,
                )
                return summary
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await self._state.unlock(ref, token)

    async def _renew(self, ref: ThreadRef, token: str) -> None:
        """Keep the lease on the thread's lock while the work goes on, for at most the
        lock's bound (a holder stuck longer lets it expire). A failed renewal is retried at
        the next tick; a lost lock is only logged (the version claim still makes the write
        exactly once)."""
        bound = time.monotonic() + self._lock_ttl
        while True:
            await asyncio.sleep(self._lease / 3)
            left = bound - time.monotonic()
            if left <= 0:
                return
            try:
                held = await self._state.renew_lock(ref, token, min(self._lease, left))
            except Exception as e:  # noqa: BLE001 - the lease just runs out sooner
                log.warning("summary lock of %s: renewal failed (%s)", ref.key, e)
                continue
            if not held:
                log.warning("summary lock of %s: lost (expired) while summarizing", ref.key)
                return

    async def _summarize(self, prev: Summary | None, span: Sequence[Message]) -> str:
        """One bounded model call: a stalled call fails (and is retried by the dispatcher)
        instead of outliving the summary lock."""
        try:
            async with asyncio.timeout(self._summary_timeout):
                return await self._model.summarize(
                    prev.content if prev is not None else None, span, self._budget
                )
        except TimeoutError:
            raise RetryableInfraError(
                f"the summary model took more than {self._summary_timeout:g} s"
            ) from None

    async def _lock(self, ref: ThreadRef) -> str:
        """Wait for the lock; a holder that crashed loses it when it expires."""
        deadline = time.monotonic() + self._lock_ttl + 5.0
        delay = 0.05
        while True:
            token = await self._state.try_lock(ref, self._lease)
            if token is not None:
                return token
            if time.monotonic() > deadline:
                raise RetryableInfraError(f"summary lock of {ref.key} stayed busy")
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 2)

    async def _read_span(self, ref: ThreadRef, start: int, up_to: int) -> list[Message]:
        deadline = time.monotonic() + self._journal_wait
        while await self._journal.next_offset(ref) <= up_to:
            if time.monotonic() > deadline:
                raise RetryableInfraError(f"journal does not show offset {up_to} of {ref.key} yet")
            await asyncio.sleep(0.02)
        span = await self._journal.read_range(ref, start, up_to)
        if not span or span[-1].offset != up_to:
            raise RetryableInfraError(f"journal span {start}..{up_to} of {ref.key} is incomplete")
        return span

    async def _after_write(self, ref: ThreadRef, summary: Summary, span: Sequence[Message]) -> None:
        """Publish ``summary.written``, then reset the counters for the span (this order: a
        reset counters means the event is out, which :meth:`_repair` relies on)."""
        if self._ctx is not None:
            env = summary_written(
                ref.account_id, ref.agent_id, ref.thread_id, summary, epoch_ms(self._clock.now())
            )
            await self._ctx.publish(self._ctx.topics.summaries, env, ref.key)
        # the cache first (SummaryStore.refresh_cache): a write that failed while Valkey
        # was down must not leave the previous summary cached once the counters move on
        await self._store.refresh_cache(ref, summary)
        # from Valkey's own watermark: a summary it lost before this span is subtracted too
        await apply_span(
            self._state,
            self._journal,
            ref,
            span[0].offset if span else summary.last_message_offset,
            summary.last_message_offset,
            [(m.offset, m.token_count) for m in span],
        )

    async def _repair(self, ref: ThreadRef, current: Summary) -> None:
        """A redelivered request: redo the after-effects of ``current`` if a crash cut them."""
        if await self._state.watermark(ref) >= current.last_message_offset:
            await self._store.refresh_cache(ref, current)
            await self._state.apply_summary(ref, current.last_message_offset, 0, 0)  # guard only
            return
        before = await self._store.get_version(ref, current.version - 1)
        start = before.last_message_offset + 1 if before is not None else 0
        span = await self._journal.read_range(ref, start, current.last_message_offset)
        await self._after_write(ref, current, span)

    # --- pre-compaction flush -------------------------------------------------------------------
    async def _flush(self, ref: ThreadRef, span: Sequence[Message]) -> int:
        """Store durable facts from ``span`` if the agent has Memory bound, once per span,
        each for the user who stated it. Never raises."""
        if self._agents is None or self._extractor is None or self._memory is None or not span:
            return 0
        try:
            agent = await self._agents.get_agent(ref.account_id, ref.agent_id)
            if agent is None or not agent.memory:
                return 0
            first, last = span[0].offset, span[-1].offset
            if not await self._state.claim_flush(ref, first, last, FLUSH_CLAIM_TTL_S):
                log.info("flush of %s %d..%d: already done", ref.key, first, last)
                return 0
            stored = 0
            async with asyncio.timeout(self._flush_timeout):
                for user_id, own in messages_by_user(span):
                    caller = Caller(ref.account_id, ref.agent_id, user_id)
                    for fact in await self._extractor.extract(own):
                        scope = "private" if fact.category == "user_profile" else "shared"
                        try:
                            await self._memory.store(
                                caller,
                                fact.key,
                                fact.content,
                                fact.category,
                                scope,
                                fact.importance,
                            )
                            stored += 1
                        except MemstreamError as e:  # a policy said no to this fact
                            log.info("flush of %s: fact %r not stored: %s", ref.key, fact.key, e)
            return stored
        except Exception:
            log.exception("pre-compaction flush of %s failed; summarizing anyway", ref.key)
            return 0
