"""The counters processor: per-thread threshold counters; asks for a summary on crossing.

Consumes ``journal`` (``message.appended``; other events are ignored). For each message it
claims the message and adds its recorded ``token_count`` to the thread's two counters in one
atomic Redis step (:meth:`~memstream.infra.thread_state.ThreadState.count_message`), then
applies the pure rule (:func:`~memstream.streams.thresholds.should_summarize`). When the
thread has crossed 2,000 tokens or 50 messages and the flush-and-summarize guard is free, it
publishes one ``summary.requested`` for the span ending at this message.

Guarantees:

- A redelivered or replayed message is a no-op for the counters (per-message claim), and a
  message already folded into a summary (at or below the watermark) is never counted.
- One request per crossing: the guard holds the span end until the summary is written (or
  the guard expires, so a lost request is asked again by the next message). A crash between
  taking the guard and publishing is repaired by the redelivery of the same message, which
  re-publishes the same request (deterministic event id per span end).
- The counters are reset by the summarizer when the summary is written, by subtracting the
  summarized span (messages counted meanwhile stay counted).
"""

from __future__ import annotations

import logging

from memstream.clock import Clock, SystemClock, epoch_ms
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.schemas.events import Envelope, message_of, summary_requested
from memstream.schemas.records import Message, ThreadRef
from memstream.schemas.topics import JOURNAL
from memstream.streams.processor import EventMeta, Processor, ProcessorContext
from memstream.streams.thresholds import ThresholdCounters, should_summarize

log = logging.getLogger(__name__)


class CountersProcessor(Processor):
    """Threshold counters (see module doc). Build with adapters; the runtime calls ``start``."""

    name = "counters"
    topic = JOURNAL

    def __init__(
        self,
        state: ThreadState,
        summaries: SummaryStore,
        *,
        claim_ttl_s: int,
        guard_ttl_s: int,
        clock: Clock | None = None,
    ) -> None:
        self._state = state
        self._summaries = summaries
        self._claim_ttl = claim_ttl_s
        self._guard_ttl = guard_ttl_s
        self._clock = clock or SystemClock()
        self._ctx: ProcessorContext | None = None

    async def start(self, ctx: ProcessorContext) -> None:
        self._ctx = ctx

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        if envelope.type != "message.appended":
            return
        request = await self.count(message_of(envelope))
        if request is None:
            return
        assert self._ctx is not None, "start() was not called"
        key = ThreadRef(request.account_id, request.agent_id, request.thread_id or "").key
        await self._ctx.publish(self._ctx.topics.summaries, request, key)
        log.info(
            "summary requested for %s up to offset %s (from %s[%d]@%d)",
            request.thread_id,
            request.data.get("up_to_offset"),
            meta.topic,
            meta.partition,
            meta.offset,
        )

    async def count(self, msg: Message) -> Envelope | None:
        """Count ``msg``; the ``summary.requested`` to publish, or None."""
        ref = ThreadRef(msg.account_id, msg.agent_id, msg.thread_id)
        result = await self._state.count_message(ref, msg.offset, msg.token_count, self._claim_ttl)
        if result.status == "no_watermark":
            # First sight of this thread since Redis was (re)started: learn what is summarized.
            current = await self._summaries.get_stored(ref)
            await self._state.init_watermark(
                ref, current.last_message_offset if current is not None else -1
            )
            result = await self._state.count_message(
                ref, msg.offset, msg.token_count, self._claim_ttl
            )
        if result.status in ("summarized", "no_watermark"):
            return None
        if not should_summarize(ThresholdCounters(result.tokens, result.messages)):
            return None
        if not await self._state.claim_guard(ref, msg.offset, self._guard_ttl):
            return None
        return summary_requested(
            ref.account_id,
            ref.agent_id,
            ref.thread_id,
            up_to_offset=msg.offset,
            from_offset=result.watermark + 1,
            token_count=result.tokens,
            message_count=result.messages,
            ts=epoch_ms(self._clock.now()),
        )
