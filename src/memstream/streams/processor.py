"""The processor contract and the dispatch rules every processor gets for free.

A processor is a small class: a ``name`` (its consumer group is derived from it), the
``topic`` it consumes (a suffix from :mod:`memstream.schemas.topics`, e.g. ``JOURNAL``),
and either ``handle(envelope, meta)`` or, for processors that write in batches (ClickHouse),
``handle_batch(items)`` with ``batch_max`` > 1. It receives decoded envelopes; it never sees
offsets to commit or the dead-letter topic. A processor that parses in bulk (hands the JSON
to a database) sets ``raw = True`` and overrides ``handle_raw(records)`` instead: the runtime
then skips decoding (the Python decode is the runtime's main cost) and the same retry,
isolation and dead-letter rules apply, with the handler's ``DecodeError`` counted as a decode
error.

:class:`Dispatcher` owns the rules around the handler (Kafka-free, so it is testable alone):

- sealed records (crypto-shredding, :mod:`memstream.infra.data_keys`) are opened first; a
  record whose key an erasure destroyed is *shredded*: counted
  (``memstream_shredded_records_total``) and skipped, never dead-lettered; dead letters
  carry the sealed bytes. A raw processor that reads what it needs from a record's headers
  says so per record (:meth:`Processor.needs_plaintext`): such a record is only checked for
  its key (shredded ones skipped all the same) and handed over still sealed;
- raw bytes are decoded with :func:`memstream.schemas.events.decode`; a ``DecodeError``
  sends the record to the dead-letter topic at once (retrying cannot fix bad bytes);
- a **dependency outage** is not a poison record. An error that says a store is away
  (:func:`memstream.infra.outage.is_transient`: a ``RetryableInfraError`` from an adapter,
  connection refused/reset, a timeout, a closed pool, an admin shutdown...) is retried in
  place with exponential backoff, up to ``RetryPolicy.attempts`` tries (a blip costs no
  re-read); if the store is still away, :meth:`Dispatcher.dispatch` raises
  :class:`DependencyDown` naming it (``postgres``, ``valkey``, ``kafka``...). Nothing of the
  batch is dead-lettered or committed: the consumer seeks back, reports the loop as
  ``waiting for postgres``, backs off and hands the same batch over again, for as long as
  the outage lasts;
- any other exception (the record cannot be applied: a decode or validation error) sends
  the record to the dead-letter topic (a ``dlq.dead_letter`` envelope keyed by the original
  key, carrying the error, the processor name, origin topic/partition/offset and the raw
  payload) and processing goes on;
- a batch that failed permanently is retried one record at a time, so only the records that
  fail on their own are dead-lettered (the others may therefore be handled twice: handlers
  are idempotent); a dependency outage met while isolating pauses the batch as above (a
  record already dead-lettered is not dead-lettered again when the batch comes back);
- :meth:`Dispatcher.dispatch` returns only once every record of the batch was either handled
  or durably written to the dead-letter topic, or raises :class:`DependencyDown`; the
  consumer commits offsets only after it returned (:mod:`memstream.streams.consumer`).
  Publishing to the dead-letter topic is retried until it succeeds or the task is cancelled,
  so a record is never acknowledged without one of the two outcomes.

Guarantee to processors: **at-least-once**. Every record is handed over at least once; after
a crash, rebalance or replay it may be handed over again. Idempotency (event ids, natural
keys, upserts, Redis side-effect claims) is the processor's job; this runtime does not keep
a claim store of its own, because the right claim (per message, per span, per version)
depends on the side effect.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Final

from memstream.errors import RetryableInfraError, StoreUnavailable
from memstream.infra.data_keys import Keyring, thread_scope
from memstream.infra.logs import event_extra
from memstream.infra.metrics import Metrics
from memstream.infra.outage import dependency_of, is_transient
from memstream.infra.settings import Settings
from memstream.schemas.events import DecodeError, Envelope, dead_letter, decode, encode
from memstream.schemas.topics import Topics

__all__ = [
    "DependencyDown",
    "Dispatcher",
    "EventMeta",
    "Processor",
    "ProcessorContext",
    "Publish",
    "RawRecord",
    "Received",
    "RetryPolicy",
    "Rewind",
]

log = logging.getLogger(__name__)

#: ``await publish(topic, key, value)``: durable (acknowledged by the broker) on return.
Publish = Callable[[str, bytes | None, bytes], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class EventMeta:
    """Where a record came from. ``timestamp`` is the broker timestamp in epoch seconds."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp: float | None = None
    retry_for: str | None = None
    """Set on a dead letter re-published for one processor (``memstream dlq retry
    --processor``, header :data:`RETRY_FOR_HEADER`): every other processor skips it."""


RETRY_FOR_HEADER: Final = "memstream-retry-for"
"""Kafka header naming the one processor a re-published dead letter is meant for."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One consumed record, before decoding, with its Kafka headers (``(name, value)``
    pairs, as the broker has them)."""

    meta: EventMeta
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[Any, Any], None], ...]:
    """The slot setters of a frozen slots dataclass, in ``names`` order; import fails if
    ``names`` is not exactly the class's fields (a new field cannot be left unset)."""
    if tuple(sorted(f.name for f in fields(cls))) != tuple(sorted(names)):
        raise RuntimeError(f"fast constructor of {cls.__name__} is out of date with its fields")
    return tuple(cls.__dict__[n].__set__ for n in names)


_M_TOPIC, _M_PARTITION, _M_OFFSET, _M_KEY, _M_TS, _M_RETRY = _slot_setters(
    EventMeta, ("topic", "partition", "offset", "key", "timestamp", "retry_for")
)
_R_META, _R_VALUE, _R_HEADERS = _slot_setters(RawRecord, ("meta", "value", "headers"))
_new = object.__new__


def new_raw_record(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    timestamp: float | None,
    retry_for: str | None,
    value: bytes,
    headers: tuple[tuple[str, bytes], ...] = (),
) -> RawRecord:
    """``RawRecord(EventMeta(...), value, headers)`` built without the frozen dataclasses' per-field
    ``object.__setattr__`` (about half the cost, paid once per consumed record). Checks
    nothing: the consumer's records are typed by aiokafka."""
    meta: EventMeta = _new(EventMeta)
    _M_TOPIC(meta, topic)
    _M_PARTITION(meta, partition)
    _M_OFFSET(meta, offset)
    _M_KEY(meta, key)
    _M_TS(meta, timestamp)
    _M_RETRY(meta, retry_for)
    rec: RawRecord = _new(RawRecord)
    _R_META(rec, meta)
    _R_VALUE(rec, value)
    _R_HEADERS(rec, headers)
    return rec


@dataclass(frozen=True, slots=True)
class Received:
    """One decoded record handed to ``handle_batch``."""

    envelope: Envelope
    meta: EventMeta


class DependencyDown(StoreUnavailable):
    """A batch could not be applied because ``dependency`` stayed away through the in-place
    retries (``cause`` is the last error). Raised by :meth:`Dispatcher.dispatch`: the
    consumer pauses and hands the same batch over again; nothing was dead-lettered."""

    def __init__(self, dependency: str, cause: BaseException) -> None:
        super().__init__(f"{dependency} is unavailable: {type(cause).__name__}: {cause}")
        self.dependency = dependency
        self.cause = cause

    @classmethod
    def of(cls, error: BaseException) -> DependencyDown:
        if isinstance(error, DependencyDown):
            return error
        return cls(dependency_of(error) or "a dependency", error)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff of the in-place retries of a transient error (delays in
    seconds); past it, the batch is paused (:class:`DependencyDown`)."""

    attempts: int = 6
    first_delay: float = 0.1
    max_delay: float = 5.0

    def delay(self, attempt: int) -> float:
        """Delay after the ``attempt``-th failure (1-based)."""
        return float(min(self.max_delay, self.first_delay * (2 ** (attempt - 1))))


@dataclass(frozen=True, slots=True)
class ProcessorContext:
    """What the runtime hands a processor at start: its identity, settings and outputs."""

    name: str
    group_id: str
    settings: Settings
    topics: Topics
    metrics: Metrics
    publish_raw: Publish
    #: seals what is published about a thread (crypto-shredding; None: published as is)
    keyring: Keyring | None = None

    async def publish(self, topic: str, envelope: Envelope, key: str | None) -> None:
        """Publish ``envelope`` to the full topic name ``topic``; durable on return. With a
        keyring, an envelope of a thread is sealed with the thread's key, and nothing is
        published for an erased thread (its key is refused)."""
        value = encode(envelope)
        if self.keyring is not None and envelope.thread_id is not None:
            scope = thread_scope(envelope.account_id, envelope.agent_id, envelope.thread_id)
            sealed = (await self.keyring.seal_many([(scope, value)]))[0]
            if sealed is None:
                log.info(
                    "%s: thread %s is erased; not publishing %s", self.name, key, envelope.type
                )
                return
            value = sealed
        await self.publish_raw(topic, key.encode() if key is not None else None, value)


class Rewind(Exception):  # noqa: N818 - an instruction, not a failure
    """Raised by a handler whose store holds less than the runtime believes (a Redis that
    lost acknowledged writes to a kill between two fsyncs): nothing of the batch was applied;
    read each ``(topic, partition)`` again from ``offsets`` (None: from the start of the
    partition). The consumer seeks there and hands the records over again; never retried in
    place, never dead-lettered."""

    def __init__(self, offsets: Mapping[tuple[str, int], int | None], reason: str) -> None:
        super().__init__(reason)
        self.offsets = dict(offsets)
        self.reason = reason


class Processor(abc.ABC):
    """Base class of every stream processor.

    Subclasses set ``name`` and ``topic`` (class attributes or in ``__init__``) and override
    :meth:`handle` or, with ``batch_max > 1``, :meth:`handle_batch`. A handler returns
    normally once its effect is applied (durably); it raises ``RetryableInfraError`` (or
    lets a driver's connection error through) when a dependency is away (retried, then the
    processor pauses until it is back) and anything else when the record cannot be applied
    (dead-lettered).
    """

    name: str
    #: Topic suffix (``memstream.schemas.topics.JOURNAL`` ...); the prefix is a setting.
    topic: str
    #: Records per ``handle_batch`` call; 1 means one ``handle`` call per record.
    batch_max: int = 1
    #: Longest wait for a batch to fill before it is handed over anyway.
    batch_within_s: float = 0.5

    async def start(self, ctx: ProcessorContext) -> None:  # noqa: B027 - optional hook
        """Called once before the first record (open connections, keep ``ctx``)."""

    async def stop(self) -> None:  # noqa: B027 - optional hook
        """Called once after the last record."""

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        """Apply one event. Must be idempotent."""
        raise NotImplementedError(f"{type(self).__name__} must override handle or handle_batch")

    async def handle_batch(self, items: Sequence[Received]) -> None:
        """Apply several events in order (default: ``handle`` each). Must be idempotent."""
        for item in items:
            await self.handle(item.envelope, item.meta)

    #: True: the runtime does not decode; it calls :meth:`handle_raw` with the records' bytes
    #: (for processors that parse in bulk, e.g. hand the JSON to a database). Such a
    #: processor owns decoding: it raises ``DecodeError`` (or any error) for a bad record,
    #: and the dispatcher isolates and dead-letters it like any failing record.
    raw: bool = False

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        """Apply several undecoded records in order (only with ``raw = True``). Idempotent."""
        raise NotImplementedError(f"{type(self).__name__} sets raw = True without handle_raw")

    def needs_plaintext(self, record: RawRecord) -> bool:
        """False when :meth:`handle_raw` reads all it needs of ``record`` from its headers:
        a sealed record is then not opened (only checked for a destroyed key, so a shredded
        one is still skipped) and reaches the handler sealed. Only with ``raw = True``."""
        return True

    async def assigned(self, committed: Mapping[tuple[str, int], int | None]) -> None:  # noqa: B027
        """Called when the group hands this member partitions, with each ``(topic,
        partition)``'s committed offset (None: never committed). A processor whose store
        records its own positions (the counters processor) checks them against these: a
        store behind the committed offset lost acknowledged writes (see :class:`Rewind`)."""


class Dispatcher:
    """Decode, handle with retries, dead-letter on failure, count and time. See module doc."""

    def __init__(
        self,
        processor: Processor,
        *,
        dlq_topic: str,
        publish: Publish,
        metrics: Metrics,
        retry: RetryPolicy | None = None,
        now_ms: Callable[[], int] | None = None,
        keyring: Keyring | None = None,
    ) -> None:
        self.processor = processor
        self._keyring = keyring
        self._sealed: dict[EventMeta, bytes] = {}  # this batch's sealed originals (for the DLQ)
        self.dlq_topic = dlq_topic
        self._publish = publish
        self._metrics = metrics
        self._retry = retry or RetryPolicy()
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        name = processor.name
        self._latency = metrics.processing_latency.labels(name)
        self._errors_decode = metrics.processor_errors.labels(name, "decode")
        self._errors_handler = metrics.processor_errors.labels(name, "handler")
        self._errors_retry = metrics.processor_errors.labels(name, "retry")
        self._shredded = metrics.shredded_records.labels(name)
        self._processed: dict[str, Any] = {}  # topic -> counter child (labels() is slow)
        #: records dead-lettered by a dispatch that then paused on an outage: not again
        #: when the same batch comes back (cleared once a dispatch completes)
        self._lettered: set[tuple[str, int, int]] = set()
        #: set by the consumer while it waits for a dependency: retries log quietly
        self.paused_on: str | None = None

    async def dispatch(self, records: Sequence[RawRecord]) -> None:
        """Handle ``records`` (one batch, in order). Returns when each is applied or in the DLQ."""
        if not records:
            return
        mine: list[RawRecord] = []
        others: list[RawRecord] = []
        for r in records:
            (mine if r.meta.retry_for in (None, self.processor.name) else others).append(r)
        if others:
            # dead letters re-published for another processor: already applied here
            self._count(others)
            records = mine
            if not records:
                return
        if self._keyring is not None:
            records = await self._open(self._keyring, records)
            if not records:
                return
        if self.processor.raw:
            await self._dispatch_raw(records)
            return
        good: list[Received] = []
        for rec in records:
            try:
                good.append(Received(decode(rec.value), rec.meta))
            except DecodeError as e:
                self._errors_decode.inc()
                await self._dead_letter(rec.meta, rec.value, f"DecodeError: {e} (field {e.field})")
        started = time.perf_counter()
        if good:
            error = await self._run(good)
            if error is not None and is_transient(error):
                # The store stayed away through the in-place retries: no record is to
                # blame. Pause (the consumer re-reads the batch); never dead-letter.
                raise DependencyDown.of(error)
            if error is not None and len(good) > 1:
                # Isolate the bad records: only those that fail alone go to the DLQ.
                for item in good:
                    single = await self._run([item])
                    if single is not None and is_transient(single):
                        raise DependencyDown.of(single)
                    if single is not None:
                        await self._fail(item, single, records)
            elif error is not None:
                await self._fail(good[0], error, records)
        self._latency.observe(time.perf_counter() - started)
        self._count(records)
        self._lettered.clear()

    async def _open(self, keyring: Keyring, records: Sequence[RawRecord]) -> list[RawRecord]:
        """Open sealed records (crypto-shredding). A shredded one (its key was destroyed by
        an erasure) is counted and skipped, never dead-lettered; the others go on in
        plaintext, their sealed bytes kept for a dead letter (which must not hold content).
        Postgres away: retried like a handler's transient error, then
        :class:`DependencyDown` (the consumer pauses and re-reads the batch)."""
        self._sealed.clear()
        processor = self.processor
        keep_sealed = (
            [not processor.needs_plaintext(r) for r in records]
            if processor.raw and type(processor).needs_plaintext is not Processor.needs_plaintext
            else None
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                values = await keyring.open_many([r.value for r in records], keep_sealed)
                break
            except RetryableInfraError as e:
                self._errors_retry.inc()
                if attempt >= self._retry.attempts:
                    raise DependencyDown.of(e) from e
                log.log(
                    logging.DEBUG if self.paused_on else logging.WARNING,
                    "%s: opening sealed records failed (%s); retrying",
                    self.processor.name,
                    e,
                )
                await asyncio.sleep(self._retry.delay(attempt))
        out: list[RawRecord] = []
        gone: list[RawRecord] = []
        for rec, value in zip(records, values, strict=True):
            if value is None:
                gone.append(rec)
            elif value is rec.value:
                out.append(rec)
            else:
                self._sealed[rec.meta] = rec.value
                out.append(RawRecord(rec.meta, value, rec.headers))
        if gone:
            # never silent: a key missing for any other reason than an erasure loses data
            log.warning(
                "%s: skipping %d sealed record(s) whose data key is gone (shredded by an "
                "erasure?): %s",
                self.processor.name,
                len(gone),
                ", ".join(f"{r.meta.topic}[{r.meta.partition}]@{r.meta.offset}" for r in gone[:20]),
            )
            self._shredded.inc(len(gone))
            self._count(gone)
        return out

    async def _dispatch_raw(self, records: Sequence[RawRecord]) -> None:
        """The same rules for a ``raw`` processor: its handler decodes."""
        started = time.perf_counter()
        error = await self._attempt(lambda: self.processor.handle_raw(records), records[0].meta)
        if error is not None and is_transient(error):
            raise DependencyDown.of(error)
        if error is not None and len(records) > 1:
            for rec in records:
                single = await self._attempt(partial(self.processor.handle_raw, [rec]), rec.meta)
                if single is not None and is_transient(single):
                    raise DependencyDown.of(single)
                if single is not None:
                    await self._fail_raw(rec, single)
        elif error is not None:
            await self._fail_raw(records[0], error)
        self._latency.observe(time.perf_counter() - started)
        self._count(records)
        self._lettered.clear()

    async def _fail_raw(self, rec: RawRecord, error: BaseException) -> None:
        if isinstance(error, DecodeError):
            self._errors_decode.inc()
            text = f"DecodeError: {error} (field {error.field})"
        else:
            self._errors_handler.inc()
            text = f"{type(error).__name__}: {error}"
        await self._dead_letter(rec.meta, rec.value, text, exc=error)

    def _count(self, records: Sequence[RawRecord]) -> None:
        by_topic: dict[str, int] = {}
        for rec in records:
            by_topic[rec.meta.topic] = by_topic.get(rec.meta.topic, 0) + 1
        for topic, n in by_topic.items():
            counter = self._processed.get(topic)
            if counter is None:
                counter = self._metrics.events_processed.labels(self.processor.name, topic)
                self._processed[topic] = counter
            counter.inc(n)

    async def _run(self, items: list[Received]) -> BaseException | None:
        """Call the handler with retries; the final exception, or None on success."""
        if len(items) == 1 and self.processor.batch_max <= 1:
            return await self._attempt(
                lambda: self.processor.handle(items[0].envelope, items[0].meta), items[0].meta
            )
        return await self._attempt(lambda: self.processor.handle_batch(items), items[0].meta)

    async def _attempt(
        self, call: Callable[[], Awaitable[None]], first: EventMeta
    ) -> BaseException | None:
        """``await call()`` with retries; the final exception, or None on success."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await call()
            except (asyncio.CancelledError, Rewind):
                raise
            except Exception as e:
                if not is_transient(e):
                    return e  # the record cannot be applied: isolated, then dead-lettered
                self._errors_retry.inc()
                if attempt >= self._retry.attempts:
                    return e
                log.log(
                    logging.DEBUG if self.paused_on else logging.WARNING,
                    "%s: transient error at %s[%d]@%d (attempt %d/%d): %s",
                    self.processor.name,
                    first.topic,
                    first.partition,
                    first.offset,
                    attempt,
                    self._retry.attempts,
                    e,
                    extra=event_extra(
                        first.topic, first.partition, first.offset, processor=self.processor.name
                    ),
                )
                await asyncio.sleep(self._retry.delay(attempt))
            else:
                return None

    async def _fail(
        self, item: Received, error: BaseException, records: Sequence[RawRecord]
    ) -> None:
        self._errors_handler.inc()
        raw = next(r.value for r in records if r.meta == item.meta)
        await self._dead_letter(
            item.meta,
            raw,
            f"{type(error).__name__}: {error}",
            account_id=item.envelope.account_id,
            agent_id=item.envelope.agent_id,
            exc=error,
        )

    async def _dead_letter(
        self,
        meta: EventMeta,
        raw: bytes,
        error: str,
        *,
        account_id: str = "",
        agent_id: str = "",
        exc: BaseException | None = None,
    ) -> None:
        origin = (meta.topic, meta.partition, meta.offset)
        if origin in self._lettered:
            return  # this batch paused on an outage after dead-lettering it: once is enough
        env = dead_letter(
            raw=self._sealed.get(meta, raw),
            error=error,
            processor=self.processor.name,
            topic=meta.topic,
            partition=meta.partition,
            offset=meta.offset,
            key=meta.key,
            ts=self._now_ms(),
            account_id=account_id,
            agent_id=agent_id,
        )
        log.error(
            "%s: dead-lettering %s[%d]@%d: %s",
            self.processor.name,
            meta.topic,
            meta.partition,
            meta.offset,
            error,
            exc_info=exc,
            extra=event_extra(
                meta.topic, meta.partition, meta.offset, processor=self.processor.name
            ),
        )
        value = encode(env)
        delay = self._retry.first_delay
        while True:
            try:
                await self._publish(self.dlq_topic, meta.key, value)
                break
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the broker is away: never ack without a DLQ record
                log.warning("%s: DLQ publish failed, retrying: %s", self.processor.name, e)
                await asyncio.sleep(delay)
                delay = min(self._retry.max_delay, delay * 2)
        self._lettered.add(origin)
        self._metrics.dead_letters.labels(self.processor.name, meta.topic).inc()
