"""The counters processor: per-thread threshold counters; asks for a summary on crossing.

Consumes ``journal`` (``message.appended``; other events are ignored) in batches of up to
:data:`BATCH_MAX` records, undecoded (``raw``): :func:`record_step` reads only the fields
counting needs, from the record's count header (:mod:`~memstream.schemas.count_header`)
or, without one, from its envelope (:func:`read_step`). For each message it adds its recorded ``token_count`` to the thread's two
counters unless the thread's count mark says it was counted already, in one atomic Redis
step; a batch's steps go to Redis as one script, each thread's in log order
(:meth:`~memstream.infra.thread_state.ThreadState.count_threads`). Then it applies the pure
rule (:func:`~memstream.streams.thresholds.should_summarize`) to each message's result (only
for threads whose counters after the batch reach a threshold: the counters only grow within
a batch). When the thread has crossed 2,000 tokens or 50 messages and the flush-and-summarize
guard is free, it publishes one ``summary.requested`` for the span ending at this message
(guards are claimed for a batch's crossing candidates in one more script, in log order,
which gives the same answers as claiming them one message at a time).

Guarantees:

- A redelivered or replayed message is a no-op for the counters, however late it comes (the
  thread's high-water mark of counted offsets, with the gaps below it, kept with the counters
  and without expiry), and a message already folded into a summary (at or below the
  watermark) is never counted.
- One request per crossing: the guard holds the span end until the summary is written (or
  the guard expires, so a lost request is asked again by the next message). A crash between
  taking the guard and publishing is repaired by the redelivery of the same message, which
  re-publishes the same request (deterministic event id per span end).
- The counters are reset by the summarizer when the summary is written, by subtracting the
  summarized span (messages counted meanwhile stay counted).
- Valkey losing acknowledged writes (a kill between two fsyncs, a failover to a lagging
  replica) loses no count and counts nothing twice: the processor reads the lost range again
  (``Rewind``), and first re-applies the summaries Valkey lost for the threads it re-reads
  (:mod:`~memstream.streams.summary_catchup`: watermark from the summary store, the
  summarized messages subtracted), so a message a summary covers is not counted again.
- A batch returns only after every request it produced was acknowledged by the broker; if
  anything fails the whole batch is handed over again, which the count mark makes a no-op
  apart from re-publishing the same requests.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import orjson

from memstream.clock import Clock, SystemClock, epoch_ms
from memstream.errors import InvalidRequest
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ConsumerPositions, PositionsBehind, ThreadState
from memstream.schemas.count_header import COUNT_HEADER, read_count_header
from memstream.schemas.events import ENVELOPE_VERSION, Envelope, decode, summary_requested
from memstream.schemas.records import Message, ThreadRef, req_int, req_str
from memstream.schemas.topics import JOURNAL
from memstream.streams.processor import (
    EventMeta,
    Processor,
    ProcessorContext,
    RawRecord,
    Received,
    Rewind,
)
from memstream.streams.summary_catchup import SpanReader, catch_up
from memstream.streams.thresholds import ThresholdCounters, should_summarize

log = logging.getLogger(__name__)

#: Records per batch: one Redis round trip counts them all.
BATCH_MAX = 500

#: What counting one message needs: its thread, its offset in the thread, its token count.
CountStep = tuple[ThreadRef, int, int]

#: Threads this process remembers having counted (the oldest half forgotten past this): a
#: thread it does not remember has its watermark loaded from the summary store before its
#: first count, so a new conversation is counted in one step instead of answering "unknown"
#: first (see :meth:`CountersProcessor.count_threads`). ~100 bytes a thread.
KNOWN_MAX: Final = 200_000


def to_count(env: Envelope) -> CountStep:
    """The :data:`CountStep` of a ``message.appended`` envelope.

    Reads only the fields counting needs (a full :func:`message_of` costs several times
    more); a missing or mistyped one raises ``InvalidRequest`` naming it (``data.offset``).
    """
    d = env.data
    tokens = d.get("token_count", 0)
    if tokens is None:
        tokens = 0
    if not isinstance(tokens, int) or isinstance(tokens, bool):
        raise InvalidRequest("token_count must be an integer", field="data.token_count")
    ref = ThreadRef(
        req_str(d, "account_id", prefix="data."),
        req_str(d, "agent_id", prefix="data."),
        req_str(d, "thread_id", prefix="data."),
    )
    return ref, req_int(d, "offset", prefix="data."), tokens


#: A thread as :func:`read_step` gives it: ``(account_id, agent_id, thread_id)``.
ThreadKey = tuple[str, str, str]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_APPENDED: Final = "message.appended"


def read_step(value: bytes) -> tuple[ThreadKey, int, int] | None:
    """The thread, offset and token count of one undecoded journal record; None for an
    event other than ``message.appended``.

    The same answers and errors as :func:`~memstream.schemas.events.decode` followed by
    :func:`to_count`: a straight-line path takes an envelope that decode's own fast path takes
    and whose ``data`` fields have their exact types; anything else goes through decode and
    :func:`to_count` (``DecodeError`` / ``InvalidRequest`` naming the field). It skips
    building the envelope, which is most of the processor's Python cost per message.
    """
    try:
        obj = _loads(value)
    except _JSONDecodeError:
        obj = None
    if type(obj) is dict and obj.get("type") == _APPENDED:
        g = obj.get
        v, d, thread_id = g("v"), g("data"), g("thread_id")
        if (
            type(v) is int
            and v == ENVELOPE_VERSION
            and type(d) is dict
            and type(g("id")) is str
            and type(g("ts")) is int
            and type(g("account_id")) is str
            and type(g("agent_id")) is str
            and (thread_id is None or type(thread_id) is str)
        ):
            account, agent, thread = d.get("account_id"), d.get("agent_id"), d.get("thread_id")
            offset, tokens = d.get("offset"), d.get("token_count", 0)
            if (
                type(account) is str
                and type(agent) is str
                and type(thread) is str
                and type(offset) is int
                and (tokens is None or type(tokens) is int)
            ):
                return (account, agent, thread), offset, tokens or 0
    env = decode(value)
    if env.type != _APPENDED:
        return None
    ref, offset, tokens = to_count(env)
    return (ref.account_id, ref.agent_id, ref.thread_id), offset, tokens


def record_step(rec: RawRecord) -> tuple[ThreadKey, int, int] | None:
    """:func:`read_step` of a consumed journal record, from its count header when it has a
    readable one (:mod:`~memstream.schemas.count_header`: the relay derives it from the same
    envelope), from its envelope otherwise."""
    for name, value in rec.headers:
        if name == COUNT_HEADER:
            step = read_count_header(value)
            if step is not None:
                return step
            break
    return read_step(rec.value)


@dataclass(frozen=True, slots=True)
class _Counted:
    ref: ThreadRef
    offset: int
    tokens: int
    messages: int
    watermark: int


class CountersProcessor(Processor):
    """Threshold counters (see module doc). Build with adapters; the runtime calls ``start``."""

    name = "counters"
    topic = JOURNAL
    raw = True
    batch_max = BATCH_MAX
    #: Hand over what is already fetched at once: a crossing is not held back for a batch.
    batch_within_s = 0.0

    def __init__(
        self,
        state: ThreadState,
        summaries: SummaryStore,
        *,
        guard_ttl_s: int,
        journal: SpanReader | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._state = state
        self._summaries = summaries
        self._journal = journal
        self._guard_ttl = guard_ttl_s
        self._clock = clock or SystemClock()
        self._ctx: ProcessorContext | None = None
        #: per (topic, partition), the position Redis must hold at least: what this process
        #: last wrote there, or the committed offset at assignment (see ``assigned``)
        self._written: dict[tuple[str, int], int] = {}
        #: partitions the group never committed: their first batch sets the position
        self._reset: set[tuple[str, int]] = set()
        #: partitions read again after Valkey lost writes, to the position it had
        #: acknowledged: their threads' summaries may be lost too (see ``_catch_up``)
        self._suspect: dict[tuple[str, int], int] = {}
        #: threads caught up since the last loss (each is checked once)
        self._caught_up: set[ThreadKey] = set()
        #: threads counted by this process, oldest first (see :data:`KNOWN_MAX`)
        self._known: dict[ThreadRef, None] = {}

    async def start(self, ctx: ProcessorContext) -> None:
        self._ctx = ctx

    async def assigned(self, committed: Mapping[tuple[str, int], int | None]) -> None:
        # A committed offset is what Redis must hold at least: the group committed past it,
        # so it was counted. A partition the group never committed (None: a first start, or
        # a fresh broker whose log starts again at 0) is not checked, and its first batch
        # sets its position instead of raising it.
        for tp, offset in committed.items():
            if offset is None:
                self._written.pop(tp, None)
                self._reset.add(tp)
            else:
                self._written[tp] = offset
                self._reset.discard(tp)

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        await self.handle_batch([Received(envelope, meta)])

    def needs_plaintext(self, record: RawRecord) -> bool:
        # a message with its count header is counted from it: a sealed one is not opened
        # (the dispatcher still skips it if its thread's key was destroyed)
        return not any(name == COUNT_HEADER for name, _ in record.headers)

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        groups: dict[ThreadKey, list[tuple[int, int]]] = {}
        reach: dict[tuple[str, int], int] = {}
        suspect = self._suspect
        recheck: set[ThreadKey] = set()
        for rec in records:
            meta = rec.meta
            tp = (meta.topic, meta.partition)
            if meta.offset >= reach.get(tp, -1):
                reach[tp] = meta.offset + 1
            step = record_step(rec)  # DecodeError: the runtime isolates the record
            if step is None:
                continue
            key, offset, tokens = step
            if suspect and meta.offset < suspect.get(tp, -1):
                recheck.add(key)
            steps = groups.get(key)
            if steps is None:
                groups[key] = steps = []
            steps.append((offset, tokens))
        ctx = self._ctx
        assert ctx is not None, "start() was not called"
        written = self._written
        reset = self._reset
        positions = ConsumerPositions(
            ctx.group_id,
            reach,
            {tp: written[tp] for tp in reach if tp in written},
            frozenset(tp for tp in reach if tp in reset) if reset else frozenset(),
        )
        if recheck:
            await self._catch_up(recheck)
        try:
            requests = await self.count_threads(
                {ThreadRef(*k): steps for k, steps in groups.items()}, positions=positions
            )
        except PositionsBehind as e:
            for tp in e.behind:
                lost_to = written.pop(tp, None)  # read again from Redis's own position
                if lost_to is not None and lost_to > suspect.get(tp, -1):
                    suspect[tp] = lost_to
            raise Rewind(
                e.behind, "valkey holds fewer counted records than were acknowledged"
            ) from e
        for tp, offset in reach.items():
            if offset > written.get(tp, -1) or tp in reset:
                written[tp] = offset
            reset.discard(tp)
            if suspect and offset >= suspect.get(tp, offset + 1):
                del suspect[tp]
                if not suspect:
                    self._caught_up.clear()
        await self._publish(requests)

    async def _catch_up(self, threads: set[ThreadKey]) -> None:
        """Before counting records of the range Valkey lost: re-apply the summaries it lost
        with it (:func:`~memstream.streams.summary_catchup.catch_up`), so that a re-read
        message a summary already covers is not counted again (an early summary)."""
        todo = [ThreadRef(*k) for k in threads if k not in self._caught_up]
        if todo:
            await catch_up(self._state, self._summaries, self._journal, todo)
            self._caught_up.update(threads)

    async def handle_batch(self, items: Sequence[Received]) -> None:
        await self._publish(
            await self.count_steps(
                [to_count(it.envelope) for it in items if it.envelope.type == _APPENDED]
            )
        )

    async def _publish(self, requests: Sequence[Envelope]) -> None:
        if not requests:
            return
        ctx = self._ctx
        assert ctx is not None, "start() was not called"
        await asyncio.gather(
            *(
                ctx.publish(
                    ctx.topics.summaries,
                    r,
                    ThreadRef(r.account_id, r.agent_id, r.thread_id or "").key,
                )
                for r in requests
            )
        )
        for r in requests:
            log.info(
                "summary requested for %s up to offset %s",
                r.thread_id,
                r.data.get("up_to_offset"),
            )

    async def count(self, msg: Message) -> Envelope | None:
        """Count ``msg``; the ``summary.requested`` to publish, or None."""
        requests = await self.count_many([msg])
        return requests[0] if requests else None

    async def count_many(self, msgs: Sequence[Message]) -> list[Envelope]:
        """Count ``msgs`` (in log order); the ``summary.requested`` envelopes to publish.

        The same outcome as counting the messages one at a time, in three Redis round trips
        at most (count; count again the threads whose watermark Redis lost, with it loaded
        from the summary store; claim guards).
        """
        return await self.count_steps(
            [
                (ThreadRef(m.account_id, m.agent_id, m.thread_id), m.offset, m.token_count)
                for m in msgs
            ]
        )

    async def count_steps(self, items: Sequence[CountStep]) -> list[Envelope]:
        """:meth:`count_many` for ``(thread, offset, token_count)`` steps (see :func:`to_count`)."""
        groups: dict[ThreadRef, list[tuple[int, int]]] = {}
        for ref, offset, tokens in items:
            groups.setdefault(ref, []).append((offset, tokens))
        return await self.count_threads(groups)

    async def count_threads(
        self,
        groups: Mapping[ThreadRef, Sequence[tuple[int, int]]],
        *,
        positions: ConsumerPositions | None = None,
    ) -> list[Envelope]:
        """Count each thread's ``(offset, token_count)`` steps (in log order); the
        ``summary.requested`` envelopes to publish. Two Redis round trips (count; claim
        guards), three when Redis lost the watermark of a thread this process had counted
        (count again, with it loaded from the summary store). ``positions``: the consumer
        positions the batch reaches, checked and recorded with the counts
        (:meth:`ThreadState.count_threads`; raises ``PositionsBehind``).

        A thread this process has not counted yet (a new conversation, or any thread after
        a restart) has its watermark loaded from the summary store first and handed to the
        count, which sets it only where Redis has none (Redis's own wins): a new thread is
        counted in the first step instead of coming back "unknown" and being counted again
        (its messages sent and parsed twice, one more round trip a batch)."""
        if not groups:
            if positions is not None:
                await self._state.count_threads({}, positions=positions)
            return []
        known = self._known
        fresh = [ref for ref in groups if ref not in known]
        loaded: dict[ThreadRef, int] | None = None
        if fresh:
            stored = await self._summaries.stored_many(fresh)
            loaded = {
                ref: current.last_message_offset if current is not None else -1
                for ref, current in zip(fresh, stored, strict=True)
            }
        counts = await self._state.count_threads(groups, positions=positions, watermarks=loaded)
        lost = [ref for ref, c in zip(groups, counts, strict=True) if not c.known]
        if lost:
            # Redis lost the watermark of threads this process had counted (a wipe, a
            # failover): learn what is summarized, then count their messages again (still
            # in log order).
            stored = await self._summaries.stored_many(lost)
            again = await self._state.count_threads(
                {ref: groups[ref] for ref in lost},
                positions=positions,
                watermarks={
                    ref: current.last_message_offset if current is not None else -1
                    for ref, current in zip(lost, stored, strict=True)
                },
            )
            redone = dict(zip(lost, again, strict=True))
            counts = [redone.get(ref, c) for ref, c in zip(groups, counts, strict=True)]
        if fresh:
            for ref in fresh:
                known[ref] = None
            if len(known) > KNOWN_MAX:
                for ref in list(itertools.islice(known, len(known) // 2)):
                    del known[ref]
        candidates: list[_Counted] = []
        for (ref, steps), c in zip(groups.items(), counts, strict=True):
            # Counters only grow within a batch: below the thresholds after the last message
            # means below them after every one.
            if not c.known or not should_summarize(
                ThresholdCounters(c.tokens_after, c.messages_after)
            ):
                continue
            for (offset, _), r in zip(steps, c.results(steps), strict=True):
                if r.status != "summarized" and should_summarize(
                    ThresholdCounters(r.tokens, r.messages)
                ):
                    candidates.append(_Counted(ref, offset, r.tokens, r.messages, r.watermark))
        granted = await self._state.claim_guards(
            [(c.ref, c.offset) for c in candidates], self._guard_ttl
        )
        now = epoch_ms(self._clock.now())
        return [
            summary_requested(
                c.ref.account_id,
                c.ref.agent_id,
                c.ref.thread_id,
                up_to_offset=c.offset,
                from_offset=c.watermark + 1,
                token_count=c.tokens,
                message_count=c.messages,
                ts=now,
            )
            for c, ok in zip(candidates, granted, strict=True)
            if ok
        ]
