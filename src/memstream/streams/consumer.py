"""One processor's consumer group on aiokafka: poll in batches, dispatch in order, commit.

This replaced the faust agent path (see ``docs/streams.md``, "Throughput, and why the consumer
is not faust's"):
faust hands records to an agent one at a time (a task pair per record in its fetcher loop,
then a stream queue and per-record acks), which capped a no-op processor at 1-5k rec/s
against 130-330k rec/s for a raw ``getmany``. Here a poll's records go to the
:class:`~memstream.streams.processor.Dispatcher` as lists.

- :func:`group_id` is the consumer group of a processor: ``<prefix>-<name>`` where
  ``<prefix>`` is the topic prefix without its trailing separator (``memstream-counters``).
- :class:`ProcessorConsumer` runs one processor: an ``AIOKafkaConsumer`` subscribed to the
  processor's topic with group management (``earliest`` reset, auto-commit off), a poll loop
  and the commit rules below.

Batches. A processor with ``batch_max == 1`` gets one ``handle`` call per record. With
``batch_max > 1`` a batch is what one poll returns (up to ``batch_max`` records), topped up
with further polls for at most ``batch_within_s`` while it is not full; so records already
fetched are handed over at once, and a lone record waits at most ``batch_within_s``. A batch
may hold records of several partitions of the topic; each partition's records keep their
log order (a consumer owns a partition alone, so per-key order holds across the group).

Commits (at-least-once):

- a record's offset becomes committable only once :meth:`Dispatcher.dispatch` returned for
  its batch, i.e. after its handler returned (for a batch: after ``handle_batch``) or after
  it was durably written to the dead-letter topic; **an offset is never committed before its
  effect is durable**;
- committable offsets are committed every ``commit_interval_s`` (1 s), on a clean stop, and
  in the rebalance listener before partitions are revoked. The listener waits for the batch
  in hand to finish first; records polled before a rebalance but not yet dispatched are
  dropped and fetched again from the committed offsets;
- a batch whose store is away (:class:`~memstream.streams.processor.DependencyDown`) is
  sought back and handed over again after a pause (0.5 s doubling to ``MAX_PAUSE_S``), for
  as long as the outage lasts; none of it is committed or dead-lettered meanwhile, and the
  loop state reads ``waiting for <store>`` until the batch goes through;
- a crash between an effect and its commit re-delivers the record (handlers are
  idempotent). A failed commit is logged and retried with the next one. Should dispatching
  itself fail (a bug: the dispatcher handles every handler error), the partitions are sought
  back to the first record not handled, so no record is skipped.

Positions (issue 12, defect 1). aiokafka advances a partition's fetch position as soon as
``getmany`` hands records over, so **a batch that is polled but not dispatched must seek
its partitions back**, or the next poll starts after it. Two paths drop a polled batch:

- a rebalance between poll and dispatch (the batch may hold records fetched from the *new*
  assignment, whose position already moved past them: this is what silently skipped one
  batch per partition when a broker restart made the group rejoin mid-load);
- an error in the poll's top-up or in dispatch.

Both seek every still-assigned partition of the batch back to its lowest offset in the batch.
A consume task that dies anyway (an exception past the loop's handling) is started again,
every held partition sought back to its next expected offset (``_restart``).
As a second line, each partition's *next expected offset* is tracked (the committed offset at
assignment, then last handled + 1): a poll whose first record of a partition is past it (an
offset reset, a position moved by anyone) is a *gap*; the partition is sought back to the
expected offset and the batch re-read (``memstream_consumer_gaps_total{kind="rewound"}``).
Only if the very same gap comes back (the broker no longer holds those records: retention,
a lost log) is it accepted, logged as an error and counted as ``kind="accepted"``.

Stalls (``consumer_stall_s``, 30 s). A consumer can stop making progress with no error at
all: once in ~30 chaos runs a projector held its three partitions at offsets 44/18/28 of
1060/375/677 for minutes after a broker ``kill -9``, state ``running``. aiokafka's
``getmany`` waits for the group's next assignment without a timeout, and a partition whose
committed offset never arrives is never fetched; a position moved past records that nothing
follows is not a gap the check above can see. So, between polls, every ``stall_s / 3``:

- a held partition whose end offset is past the offset expected next, and that has not moved
  for ``stall_s``, is sought back to that offset (``memstream_consumer_stalls_total
  {remedy="seek"}``);
- one that is still not moving ``stall_s`` after that seek, or a poll or a periodic commit
  that has not returned after ``max(stall_s, rebalance timeout + 10 s)`` (aiokafka's commit
  waits for the group coordinator without a timeout), has its Kafka consumer built anew: what
  was handled is committed, the old consumer closed (bounded), its partitions forgotten as on
  a revoke, and a new member joins the group (``{remedy="rebuild"}``, an error in the log,
  state ``backoff`` until it consumes again).

A processor paused on a store's outage is not a stall: its clock starts after the store is
back.

No module-level state: every consumer and task is built inside :class:`ProcessorConsumer`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from memstream.infra.data_keys import Keyring
from memstream.infra.metrics import Metrics
from memstream.infra.settings import Settings
from memstream.infra.supervisor import LoopState
from memstream.schemas.topics import Topics
from memstream.streams.coverage import CoverageStore, PartitionCoverage
from memstream.streams.fetched_records import as_raw_record, install
from memstream.streams.processor import (
    RETRY_FOR_HEADER,
    DependencyDown,
    Dispatcher,
    Processor,
    ProcessorContext,
    Publish,
    RawRecord,
    RetryPolicy,
    Rewind,
    new_raw_record,
)

__all__ = [
    "COMMIT_INTERVAL_S",
    "ProcessorConsumer",
    "group_id",
    "first_gaps",
    "flatten_poll",
    "lowest_offsets",
    "raw_record",
]

log = logging.getLogger(__name__)

#: How often committable offsets are committed (seconds).
COMMIT_INTERVAL_S = 1.0
#: Records per poll for a ``batch_max == 1`` processor (each still gets its own ``handle``).
POLL_RECORDS = 500
#: Longest single wait in ``getmany`` (keeps commits and stop requests timely).
POLL_TIMEOUT_S = 0.5
#: Backoff of the consume loop after an error (doubling; reset by a good iteration).
MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
#: Longest wait between two tries of a batch paused on a dependency outage (after the
#: dispatcher's own in-place retries): a store that is back is used within about this.
MAX_PAUSE_S = 5.0
#: How long ``stop`` lets the batch in hand finish before cancelling it.
STOP_GRACE_S = 10.0


def group_id(settings: Settings, name: str) -> str:
    """Consumer group of processor ``name``: ``memstream-<name>`` with the default prefix."""
    prefix = settings.topic_prefix.rstrip(".-_") or "memstream"
    return f"{prefix}-{name}"


class _Stuck(Exception):
    """The Kafka consumer makes no progress with records behind it: build it anew."""


# --- pure rules ------------------------------------------------------------------------------
def raw_record(rec: ConsumerRecord[bytes, bytes]) -> RawRecord:
    """An aiokafka record (no deserializers: bytes or None) as the dispatcher's
    :class:`RawRecord`; the timestamp in epoch seconds. The consumer's own records are built
    by the fetcher instead (``streams.fetched_records``), with the same fields."""
    ts = rec.timestamp
    retry_for = None
    headers = rec.headers
    if headers:
        for name, value in headers:
            if name == RETRY_FOR_HEADER and value:
                retry_for = value.decode("utf-8", "replace")
    value = rec.value
    return new_raw_record(
        rec.topic,
        rec.partition,
        rec.offset,
        rec.key,
        ts / 1000.0 if ts is not None else None,
        retry_for,
        value if value is not None else b"",
        tuple(headers) if headers else (),
    )


def first_gaps(
    polled: Mapping[TopicPartition, Sequence[RawRecord]],
    expected: Mapping[TopicPartition, int],
) -> dict[TopicPartition, tuple[int, int]]:
    """Partitions whose first polled record is past the offset expected next:
    ``{tp: (expected, first offset polled)}`` (pure)."""
    gaps: dict[TopicPartition, tuple[int, int]] = {}
    for tp, records in polled.items():
        if records:
            want = expected.get(tp)
            first = records[0].meta.offset
            if want is not None and first > want:
                gaps[tp] = (want, first)
    return gaps


def lowest_offsets(batch: Sequence[RawRecord]) -> dict[TopicPartition, int]:
    """Per partition, the lowest offset among ``batch``'s records (pure)."""
    low: dict[TopicPartition, int] = {}
    for r in batch:
        tp = TopicPartition(r.meta.topic, r.meta.partition)
        off = low.get(tp)
        if off is None or r.meta.offset < off:
            low[tp] = r.meta.offset
    return low


def flatten_poll(
    polled: Mapping[TopicPartition, Sequence[RawRecord]],
    into: list[RawRecord],
    offsets: dict[TopicPartition, int],
) -> None:
    """Append ``polled`` to ``into`` (partition by partition, in log order) and raise
    ``offsets`` to each partition's last offset + 1."""
    for tp, records in polled.items():
        if records:
            into.extend(records)
            offsets[tp] = max(offsets.get(tp, 0), records[-1].meta.offset + 1)


# --- the adapter -----------------------------------------------------------------------------
def commit_stamp(unix_s: float) -> str:
    """The metadata stored with a commit: ``t=<unix seconds>``."""
    return f"t={unix_s:.3f}"


def commit_time(metadata: str | None) -> float | None:
    """The commit time in a commit's metadata (None when absent or foreign)."""
    if not metadata or not metadata.startswith("t="):
        return None
    try:
        return float(metadata[2:])
    except ValueError:
        return None


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: ProcessorConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._owner._on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._owner._on_assigned(assigned)
        log.info(
            "%s: assigned %s",
            self._owner.processor.name,
            sorted((tp.topic, tp.partition) for tp in assigned),
        )


class ProcessorConsumer:
    """Runs ``processor`` as consumer group :func:`group_id` (see module doc)."""

    def __init__(
        self,
        processor: Processor,
        settings: Settings,
        metrics: Metrics,
        *,
        bootstrap: str,
        publish: Publish,
        retry: RetryPolicy | None = None,
        commit_interval_s: float = COMMIT_INTERVAL_S,
        keyring: Keyring | None = None,
        coverage: CoverageStore | None = None,
        state: LoopState | None = None,
    ) -> None:
        if not bootstrap.strip():
            raise ValueError("kafka_bootstrap is empty: start the embedded broker or set it")
        self.processor = processor
        topics = Topics(settings.topic_prefix)
        self.topic = topics.prefix + processor.topic
        self.group_id = group_id(settings, processor.name)
        self.ctx = ProcessorContext(
            name=processor.name,
            group_id=self.group_id,
            settings=settings,
            topics=topics,
            metrics=metrics,
            publish_raw=publish,
            keyring=keyring,
        )
        self._dispatcher = Dispatcher(
            processor,
            dlq_topic=topics.dlq,
            publish=publish,
            metrics=metrics,
            retry=retry,
            keyring=keyring,
        )
        install()  # getmany hands over RawRecord objects built by the fetcher
        self._bootstrap = bootstrap
        self._settings = settings
        self._consumer = self._new_consumer()
        rebalance_s = max(settings.consumer_session_timeout_s * 2, 10.0)
        #: no progress on a partition with records behind it for this long is a stall
        self._stall_s = settings.consumer_stall_s
        #: a poll that has not returned after this long is stuck (a legitimate one waits at
        #: most for a rebalance, which the group bounds by its rebalance timeout)
        self._poll_stuck_s = max(settings.consumer_stall_s, rebalance_s + 10.0)
        #: per held partition, (next offset expected, monotonic time it was first seen)
        self._watched: dict[TopicPartition, tuple[int, float]] = {}
        self._watch_at = time.monotonic()
        #: partitions sought back for a stall, not moved since (a second stall: rebuild)
        self._stall_sought: set[TopicPartition] = set()
        self._rebuilds = 0
        self._stalls_sought = metrics.consumer_stalls.labels(processor.name, "seek")
        self._stalls_rebuilt = metrics.consumer_stalls.labels(processor.name, "rebuild")
        self._commit_interval = commit_interval_s
        #: this consume loop's supervised state (``infra.supervisor``: readiness, console)
        self.state = state if state is not None else LoopState()
        self._gauge = metrics.last_commit.labels(processor.name)
        self._pending: dict[TopicPartition, int] = {}
        #: Per assigned partition, the offset the next record handed over must have.
        self._next: dict[TopicPartition, int] = {}
        #: Per partition, a gap already rewound once (accepted if it comes back).
        self._gap_seen: dict[TopicPartition, int] = {}
        self._gaps_rewound = metrics.consumer_gaps.labels(processor.name, "rewound")
        self._gaps_accepted = metrics.consumer_gaps.labels(processor.name, "accepted")
        self._store_rewinds = metrics.consumer_gaps.labels(processor.name, "store")
        #: What this member applied per held partition (``streams.coverage``), if stored.
        self.coverage = PartitionCoverage(coverage, self.group_id) if coverage else None
        self._coverage_failing = False
        self._gap_gauge = metrics.projection_gap.labels(processor.name)
        self._lock = asyncio.Lock()  # held while a batch is dispatched and by the listener
        self._epoch = 0  # bumped on every revoke: older polls are stale
        self._paused_epoch = -1  # the epoch in which a batch last paused on an outage
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._restarts = 0  # times the consume loop died and was started again
        self._last_commit_at = time.monotonic()
        #: Unix time of the last successful commit in this process, or None.
        self.last_commit: float | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect and subscribe; the group join and consumption go on in a task."""
        self._consumer.subscribe([self.topic], listener=_Listener(self))
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name=f"consume-{self.processor.name}")
        self._task.add_done_callback(self._ended)

    def _new_consumer(self) -> AIOKafkaConsumer:
        settings = self._settings
        session = settings.consumer_session_timeout_s
        return AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(session * 1000),
            heartbeat_interval_ms=int(settings.consumer_heartbeat_interval_s * 1000),
            rebalance_timeout_ms=int(max(session * 2, 10.0) * 1000),
            # a partition added to the topic is noticed (and the group rebalanced) this soon
            metadata_max_age_ms=int(settings.kafka_metadata_max_age_s * 1000),
            value_deserializer=as_raw_record,
        )

    async def _rebuild(self, why: str) -> None:
        """Replace the Kafka consumer by a new one (see "Stalls" in the module doc): commit
        what was handled, close the old one (bounded: it may be the part that hangs), forget
        its partitions as a revoke would, and join the group again. Called from the consume
        loop, between batches."""
        self._rebuilds += 1
        self._stalls_rebuilt.inc()
        log.error(
            "%s: %s; building its Kafka consumer anew (rebuild %d); it reads on from what "
            "it handled",
            self.processor.name,
            why,
            self._rebuilds,
        )
        old = self._consumer
        async with self._lock:
            self._epoch += 1  # a poll of the old consumer is stale
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await self._commit()
            held = set(old.assignment())
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                await old.stop()
        except Exception as e:  # noqa: BLE001 - the old consumer is dropped either way
            log.warning("%s: the old consumer did not close cleanly: %r", self.processor.name, e)
        async with self._lock:
            self._pending.clear()  # a later commit is the new member's, of what it handles
            self._next.clear()
            self._gap_seen.clear()
            self._watched.clear()
            self._stall_sought.clear()
            if self.coverage is not None and held:
                self.coverage.revoked((tp.topic, tp.partition) for tp in held)
                self._gap_gauge.set(self.coverage.gap())
            self._consumer = self._new_consumer()
            self._consumer.subscribe([self.topic], listener=_Listener(self))
        backoff = MIN_BACKOFF_S
        while not self._stopping:
            try:
                await self._consumer.start()
                break
            except Exception as e:  # noqa: BLE001 - e.g. the broker is away: try again
                log.warning("%s: the new consumer did not start: %r", self.processor.name, e)
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
        self._watch_at = time.monotonic()

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The consume task ended: expected on stop; else say so loudly (readiness too) and
        start the loop again (:meth:`_restart`)."""
        if self._stopping:
            self.state.state = "stopped"
            return
        error = None if task.cancelled() else task.exception()
        self.state.failed(error or "the consume loop ended")
        self.state.state = "stopped"
        self._restarts += 1
        log.error(
            "%s: the consume loop ended unexpectedly (%r); starting it again from what it "
            "handled (restart %d)",
            self.processor.name,
            error,
            self._restarts,
        )
        delay = min(MAX_BACKOFF_S, MIN_BACKOFF_S * 2 ** min(self._restarts - 1, 5))
        self._task = asyncio.get_running_loop().create_task(
            self._restart(delay), name=f"consume-{self.processor.name}"
        )
        self._task.add_done_callback(self._ended)

    async def _restart(self, delay: float) -> None:
        """The consume loop again after it died (a handler or the loop raised past its own
        handling, e.g. a CancelledError that was not a stop): its position moved past
        records it fetched but did not finish, so every held partition is sought back to
        the next offset it expected (what it handled + 1, else the committed offset, else
        the start) and the batch that was in hand is handed over again (at-least-once)."""
        await asyncio.sleep(delay)
        if self._stopping:
            return
        async with self._lock:
            self._epoch += 1  # a poll of the dead loop is stale
            for tp in self._consumer.assignment():
                want = self._next.get(tp)
                if want is None:
                    committed = await self._consumer.committed(tp)
                    if committed is None or committed < 0:
                        await self._consumer.seek_to_beginning(tp)
                        continue
                    want = committed
                self._seek(tp, want)
        await self._run()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member holds now (empty before the group join)."""
        return set(self._consumer.assignment())

    def assigned(self) -> bool:
        """True once the consumer holds at least one partition of the group."""
        return bool(self._consumer.assignment())

    async def stop(self) -> None:
        """Finish the batch in hand, commit what was handled, leave the group. Idempotent."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_GRACE_S)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            except Exception:
                log.exception("%s: consume loop failed", self.processor.name)
        with contextlib.suppress(Exception):
            async with self._lock:
                await self._commit()
        await self._consumer.stop()

    # --- loop --------------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = MIN_BACKOFF_S
        pause = MIN_BACKOFF_S
        while not self._stopping:
            batch: list[RawRecord] = []
            try:
                epoch = self._epoch
                batch, offsets = await self._poll()
                if batch and not await self._hand_over(batch, offsets, epoch):
                    continue
                if time.monotonic() - self._watch_at >= self._stall_s / 3:
                    await self._watch()
                if time.monotonic() - self._last_commit_at >= self._commit_interval:
                    await self._periodic_commit()
            except asyncio.CancelledError:
                raise
            except _Stuck as e:
                self.state.failed(str(e))
                await self._rebuild(str(e))
            except DependencyDown as e:
                # a store is away (the batch was sought back, nothing committed or
                # dead-lettered): wait for it, then hand the same batch over again
                if self.state.state != "waiting":
                    log.warning(
                        "%s: waiting for %s (%s); the batch is retried every %.1f-%.0fs "
                        "until it is back, nothing is dead-lettered",
                        self.processor.name,
                        e.dependency,
                        e.cause,
                        MIN_BACKOFF_S,
                        MAX_PAUSE_S,
                    )
                self.state.waiting(e.dependency, e.cause)
                self._dispatcher.paused_on = e.dependency
                self._paused_epoch = self._epoch
                await asyncio.sleep(pause)
                pause = min(MAX_PAUSE_S, pause * 2)
            except KafkaError as e:
                self.state.failed(e)
                log.warning(
                    "%s: consumer error, retrying in %.1fs: %s", self.processor.name, backoff, e
                )
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
            except Exception as e:
                self.state.failed(e)
                log.exception(
                    "%s: unexpected error in the consume loop; retrying in %.1fs",
                    self.processor.name,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(MAX_BACKOFF_S, backoff * 2)
            else:
                if self.state.state == "waiting" and not batch and epoch == self._paused_epoch:
                    continue  # not re-read yet: waiting until the batch goes through
                if self.state.state != "running":
                    log.info("%s: consuming again (%s)", self.processor.name, self.state.describe())
                self.state.recovered()
                self._dispatcher.paused_on = None
                backoff = pause = MIN_BACKOFF_S

    async def _periodic_commit(self) -> None:
        """Commit what was handled, bounded like a poll: aiokafka's commit waits for the
        group's coordinator without a timeout, and after a broker ``kill -9`` its lookup was
        seen waiting for good on a metadata update that never came (the counters held lag
        1,063 with "a commit for 196s" in the chaos suite): the consumer is rebuilt."""
        async with self._lock:
            self.state.working("a commit")  # a commit that never returns shows
            try:
                async with asyncio.timeout(self._poll_stuck_s):
                    await self._commit()
            except TimeoutError:
                raise _Stuck(f"a commit did not return for {self._poll_stuck_s:.0f}s") from None
            finally:
                self.state.idle()

    async def _hand_over(
        self, batch: list[RawRecord], offsets: dict[TopicPartition, int], epoch: int
    ) -> bool:
        """Dispatch a polled batch; False when it was sought back to be read again."""
        async with self._lock:
            if epoch != self._epoch:
                # a rebalance came between poll and dispatch: re-read the batch (its records
                # may come from the new assignment, whose position already moved past them)
                self._rewind(batch)
                return False
            self.state.working()  # a batch held for minutes shows in `memstream lag`
            try:
                await self._dispatch(batch, offsets)
            except Rewind as r:
                self._rewind(batch)
                await self._resume_at(r)
                return False
            except Exception:
                self._rewind(batch)  # never skip records that were not handled
                raise
            finally:
                self.state.idle()
        return True

    async def _poll(self) -> tuple[list[RawRecord], dict[TopicPartition, int]]:
        """One batch and the offsets to commit once it is handled. A gap (see module doc)
        seeks back and answers an empty batch."""
        proc = self.processor
        want = proc.batch_max if proc.batch_max > 1 else POLL_RECORDS
        records: list[RawRecord] = []
        offsets: dict[TopicPartition, int] = {}
        polled = await self._getmany(int(POLL_TIMEOUT_S * 1000), want)
        if not self._take(polled, records, offsets):
            return [], {}
        if proc.batch_max > 1 and records:
            deadline = time.monotonic() + max(0.0, proc.batch_within_s)
            while len(records) < want and not self._stopping:
                left = deadline - time.monotonic()
                try:
                    more = await self._getmany(max(0, int(left * 1000)), want - len(records))
                except BaseException:
                    self._rewind(records)  # handed over by aiokafka, not by us: re-read
                    raise
                if not more:
                    break
                if not self._take(more, records, offsets):
                    return [], {}
        return records, offsets

    async def _getmany(
        self, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[RawRecord]]:
        """``getmany``, bounded: aiokafka's waits for the group's next assignment without a
        timeout, so a group join that never ends would hold the loop for good (it showed as
        a plain ``running`` beside a growing lag)."""
        try:
            async with asyncio.timeout(self._poll_stuck_s):
                polled: Mapping[TopicPartition, Sequence[RawRecord]]
                polled = await self._consumer.getmany(
                    timeout_ms=timeout_ms, max_records=max_records
                )
                return polled
        except TimeoutError:
            raise _Stuck(f"a poll did not return for {self._poll_stuck_s:.0f}s") from None

    async def _watch(self) -> None:
        """The stall check, between polls that brought nothing: a held partition whose end
        offset is past the offset expected next, and that has not moved for ``stall_s``, is
        sought back to it (a position moved past records nothing follows, or a partition
        the fetcher never started); one that stalls again after that raises :class:`_Stuck`
        (the consumer is rebuilt). Unknown end offsets (broker away) check nothing."""
        now = self._watch_at = time.monotonic()
        if self._dispatcher.paused_on is not None:
            self._watched.clear()  # a store's outage holds it back: the clock starts after
            return
        held = set(self._consumer.assignment())
        for tp in list(self._watched):
            if tp not in held:
                del self._watched[tp]
        if not held:
            return
        try:
            async with asyncio.timeout(10.0):
                ends = await self._consumer.end_offsets(sorted(held))
                expected = {tp: await self._expected(tp) for tp in held}
        except Exception as e:  # noqa: BLE001 - a check, never a stop
            log.debug("%s: stall check skipped: %r", self.processor.name, e)
            return
        stalled: dict[TopicPartition, int] = {}
        for tp in held:
            want, end = expected[tp], int(ends.get(tp, 0))
            seen = self._watched.get(tp)
            if want >= end or seen is None or seen[0] != want:
                self._watched[tp] = (want, now)  # caught up, or moved since the last check
                if seen is not None and seen[0] != want:
                    self._stall_sought.discard(tp)
                continue
            if now - seen[1] >= self._stall_s:
                stalled[tp] = want
        if not stalled:
            return
        names = ", ".join(f"{tp.topic}[{tp.partition}] at {o}" for tp, o in sorted(stalled.items()))
        if stalled.keys() & self._stall_sought:
            raise _Stuck(f"{names} still not moving after a seek")
        self._stalls_sought.inc()
        log.warning(
            "%s: %s: records behind, none handled for %.0fs; reading again from there",
            self.processor.name,
            names,
            self._stall_s,
        )
        async with self._lock:
            for tp, want in stalled.items():
                self._seek(tp, want)
                self._watched[tp] = (want, now)
                self._stall_sought.add(tp)

    async def _expected(self, tp: TopicPartition) -> int:
        """The offset ``tp``'s next record must have: tracked, else committed, else the
        partition's start."""
        want = self._next.get(tp)
        if want is not None:
            return want
        committed = await self._consumer.committed(tp)
        if committed is not None and committed >= 0:
            return int(committed)
        starts = await self._consumer.beginning_offsets([tp])
        return int(starts.get(tp, 0))

    def _take(
        self,
        polled: Mapping[TopicPartition, Sequence[RawRecord]],
        into: list[RawRecord],
        offsets: dict[TopicPartition, int],
    ) -> bool:
        """Add ``polled`` to the batch; False (batch sought back) when it shows a gap."""
        expected = {**self._next, **offsets} if offsets else self._next
        gaps = first_gaps(polled, expected)
        rewind = False
        for tp, (want, got) in gaps.items():
            if self._gap_seen.get(tp) == got:
                self._gaps_accepted.inc()
                log.error(
                    "%s: %s[%d] jumps from offset %d to %d and the broker has nothing in "
                    "between: records %d..%d are lost to this processor (replay from the "
                    "journal to repair)",
                    self.processor.name,
                    tp.topic,
                    tp.partition,
                    want,
                    got,
                    want,
                    got - 1,
                )
                self._gap_seen.pop(tp, None)
                continue
            self._gap_seen[tp] = got
            self._gaps_rewound.inc()
            log.warning(
                "%s: %s[%d] position jumped from %d to %d; seeking back",
                self.processor.name,
                tp.topic,
                tp.partition,
                want,
                got,
            )
            rewind = True
        if rewind:
            for tp, records in polled.items():
                if records:
                    self._seek(tp, expected.get(tp, records[0].meta.offset))
            self._rewind(into)  # after: a partition already in the batch goes back further
            return False
        flatten_poll(polled, into, offsets)
        return True

    async def _dispatch(self, records: list[RawRecord], offsets: dict[TopicPartition, int]) -> None:
        if self.processor.batch_max > 1:
            await self._dispatcher.dispatch(records)
            self._mark(offsets)
            self._covered(records)
            return
        tps = {(tp.topic, tp.partition): tp for tp in offsets}
        done = 0
        try:
            for rec in records:
                await self._dispatcher.dispatch([rec])
                tp = tps[(rec.meta.topic, rec.meta.partition)]
                if rec.meta.offset + 1 > self._pending.get(tp, -1):
                    self._pending[tp] = rec.meta.offset + 1
                self._next[tp] = rec.meta.offset + 1
                done += 1
        finally:  # those handled before a pause are applied (and committable) too
            self._covered(records[:done])

    def _covered(self, records: Sequence[RawRecord]) -> None:
        """Record the offsets of ``records`` as applied (their effects are durable)."""
        if self.coverage is None:
            return
        by_tp: dict[tuple[str, int], list[int]] = {}
        for r in records:
            by_tp.setdefault((r.meta.topic, r.meta.partition), []).append(r.meta.offset)
        self.coverage.applied(by_tp)
        self._gap_gauge.set(self.coverage.gap())

    async def _flush_coverage(self) -> None:
        """Write applied ranges before their offsets are committed (see streams.coverage).
        A failing store never holds commits back: the ranges stay queued."""
        if self.coverage is None:
            return
        try:
            async with asyncio.timeout(5.0):
                await self.coverage.flush()
        except Exception as e:  # noqa: BLE001 - derived bookkeeping, never a stop
            if not self._coverage_failing:
                log.warning(
                    "%s: could not record applied ranges (kept, retried): %r",
                    self.processor.name,
                    e,
                )
            self._coverage_failing = True
            return
        if self._coverage_failing:
            log.info("%s: recording applied ranges again", self.processor.name)
        self._coverage_failing = False

    def _rewind(self, batch: Sequence[RawRecord]) -> None:
        """Seek each still-assigned partition of ``batch`` back to its lowest offset in it
        (or to what was handled since, if more): the next poll re-reads the batch."""
        for tp, offset in lowest_offsets(batch).items():
            self._seek(tp, max(offset, self._pending.get(tp, offset)))

    async def _resume_at(self, rewind: Rewind) -> None:
        """Read the partitions of ``rewind`` again from its offsets (the processor's store
        lost what the group had committed past them). Caller holds the lock."""
        held = {(tp.topic, tp.partition): tp for tp in self._consumer.assignment()}
        for key, offset in rewind.offsets.items():
            tp = held.get(key)
            if tp is None:
                continue  # not ours any more: its new owner checks it on assignment
            self._store_rewinds.inc()
            log.warning(
                "%s: %s[%d]: %s; reading it again from %s",
                self.processor.name,
                tp.topic,
                tp.partition,
                rewind.reason,
                "its start" if offset is None else f"offset {offset}",
            )
            self._pending.pop(tp, None)
            if offset is None:
                self._next.pop(tp, None)
                with contextlib.suppress(Exception):  # revoked in between
                    await self._consumer.seek_to_beginning(tp)
            else:
                self._next[tp] = offset
                self._seek(tp, offset)

    def _seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self._consumer.assignment():
            return  # not ours any more: its new owner reads it from the committed offset
        with contextlib.suppress(Exception):  # revoked in between: same as above
            self._consumer.seek(tp, offset)

    def _mark(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, off in offsets.items():
            if off > self._pending.get(tp, -1):
                self._pending[tp] = off
            self._next[tp] = off

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit pending offsets (of ``only``, if given). Caller holds the lock."""
        self._last_commit_at = time.monotonic()
        offsets = {tp: off for tp, off in self._pending.items() if only is None or tp in only}
        # Ranges queued while the store was away are written on the next tick even with no
        # offset left to commit: an idle partition would otherwise show a false gap for good.
        await self._flush_coverage()
        if not offsets:
            return
        try:
            # the commit's metadata carries its wall-clock time: `memstream lag`, in another
            # process, reads it back as "since commit" (Kafka keeps no commit time itself)
            stamp = commit_stamp(time.time())
            await self._consumer.commit(
                {tp: OffsetAndMetadata(o, stamp) for tp, o in offsets.items()}
            )
        except KafkaError as e:
            log.warning("%s: commit failed (retried with the next): %s", self.processor.name, e)
            return
        for tp, off in offsets.items():
            if self._pending.get(tp) == off:
                del self._pending[tp]
        self.last_commit = time.time()
        self._gauge.set(self.last_commit)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self._lock:  # waits for the batch in hand
            self._epoch += 1
            await self._commit(set(revoked))
            for tp in revoked:
                self._pending.pop(tp, None)
                self._next.pop(tp, None)
                self._gap_seen.pop(tp, None)
            if self.coverage is not None:
                await self._flush_coverage()
                self.coverage.revoked((tp.topic, tp.partition) for tp in revoked)
                self._gap_gauge.set(self.coverage.gap())

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        """Expect each new partition to start at its committed offset (unknown: no check
        until its first record is handled)."""
        known: dict[TopicPartition, int | None] = {}
        for tp in assigned:
            self._next.pop(tp, None)
            try:
                async with asyncio.timeout(5.0):
                    committed = await self._consumer.committed(tp)
            except Exception as e:  # noqa: BLE001 - the check is a safety net, never a stop
                log.info("%s: committed offset of %s unknown (%s)", self.processor.name, tp, e)
                continue
            known[tp] = committed if committed is not None and committed >= 0 else None
            if committed is not None and committed >= 0:
                self._next[tp] = committed
        try:
            await self.processor.assigned({(tp.topic, tp.partition): c for tp, c in known.items()})
        except Exception:  # noqa: BLE001 - a hook of the processor's own bookkeeping
            log.exception("%s: its assignment hook failed", self.processor.name)
        if self.coverage is not None:
            await self._assign_coverage(known)

    async def _assign_coverage(self, known: Mapping[TopicPartition, int | None]) -> None:
        """Load (or start, or seed) the coverage of newly held partitions whose committed
        offset is known (``known``: partition -> committed offset, None if never)."""
        assert self.coverage is not None
        tps = sorted(known, key=lambda tp: (tp.topic, tp.partition))
        if not tps:
            return
        try:
            async with asyncio.timeout(10.0):
                starts = await self._consumer.beginning_offsets(tps)
                await self.coverage.assigned(
                    {(tp.topic, tp.partition): (known[tp], int(starts.get(tp, 0))) for tp in tps}
                )
        except Exception as e:  # noqa: BLE001 - unknown coverage: no gap reported for them
            log.warning("%s: coverage of %s unknown (%r)", self.processor.name, tps, e)
            return
        self._gap_gauge.set(self.coverage.gap())
        if gap := self.coverage.gap():
            log.error(
                "%s: %d record(s) below the committed offsets of its partitions were never "
                "applied (a skipped range: see `memstream lag`, column gap)",
                self.processor.name,
                gap,
            )
