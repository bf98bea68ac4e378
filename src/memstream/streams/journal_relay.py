"""The journal relay: publishes the journal's global sequence to the Kafka ``journal`` topic.

The journal (SlateDB) is the source of truth; Kafka is how processors hear about it. The
relay reads the sequenced envelopes after its watermark (``read_seq``), publishes each to
``<prefix>journal`` keyed by its thread (``account/agent/thread``), and only once Kafka
acknowledged all of them advances the watermark in the journal (``set_relay_watermark``).

Guarantees:

* **At-least-once, nothing lost.** A seq is recorded as published only after Kafka
  acknowledged it. After a crash, a broker outage or a failed watermark write, the relay
  starts again from the recorded watermark, so records may be published again. A re-published
  record carries the same envelope (same deterministic event id): consumers dedupe by id.
  Without a keyring it is byte-identical; sealed, its nonce differs.
* **Sealed** (with ``keyring``, as ``memstream up`` wires it): each envelope of a thread is
  encrypted with the thread's data key (:mod:`memstream.infra.data_keys`), so erasing the
  thread (destroying the key) shreds every copy on the brokers. A thread whose key is
  refused (erased) is published as the content-free placeholder the journal's erasure
  writes; quarantine letters then keep no head bytes.
  ``stats.republished`` counts the records that may have been published twice.
* **Never reordered within a thread.** Records are read in global-sequence order, a thread
  always maps to one partition, and :meth:`Bus.publish_many` never lets a later record of a
  partition through before an earlier one that failed. A retry re-sends from the watermark.
* **Appends never wait for Kafka.** The relay runs beside the journal writer; when Kafka is
  down, appends keep succeeding, the relay retries with exponential backoff
  (``min_backoff`` → ``max_backoff``) and catches up when Kafka returns.
* **Poison records** (a sequenced value that is not a valid envelope) go to the dead-letter
  topic as data and the relay moves on.
* **Oversized records** (over :data:`~memstream.schemas.limits.MAX_BUS_RECORD_BYTES`, which
  the broker would refuse forever) are *quarantined*: a dead letter naming the seq and the
  size, with the first bytes of the record (the whole record stays in the journal), an error
  log line, ``stats.quarantined``; the relay moves on, so one record never stops every
  tenant. The API refuses such appends at the edge, so this is a safety net.

A broker that lost its log (issue 16 item 4, "durable without Java"): with
``check_broker_log=True`` (the CLI wiring sets it), :meth:`JournalRelay.start` compares the
journal topic with the recorded watermark. If the topic is missing or holds fewer records
than the watermark says were published (a fresh broker, a wiped log dir, Tansu, which keeps
nothing across a restart), the relay warns, naming what it cannot restore (dead letters live
only on the broker), and re-publishes the whole journal from seq 1. The processors are
idempotent (event ids, natural keys, version claims), so they converge with nothing applied
twice.

Wake-up: :meth:`JournalRelay.notify` (call it after an append) wakes the relay at once;
otherwise it polls the journal every ``poll_interval`` seconds. With ``linger_s`` (the CLI
wires ``MEMSTREAM_RELAY_LINGER_MS``, 5 ms) a pass starts no sooner than that after the
previous one ended, so a stream of single appends leaves in batches; after a longer quiet a
pass starts at once (:func:`linger_left`).
``backlog`` (last seq seen in the journal minus the watermark) is the lag; with ``metrics``
it is exported as ``memstream_relay_backlog{relay="journal"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from memstream.clock import Clock, SystemClock, epoch_ms
from memstream.errors import InfraError, JournalError, JournalFenced
from memstream.infra.data_keys import OVERHEAD_BYTES, Keyring, thread_scope
from memstream.infra.journal.erase import placeholder
from memstream.infra.kafka.bus import Bus, BusRecord
from memstream.infra.metrics import Metrics
from memstream.infra.outage import dependency_of
from memstream.infra.supervisor import LoopState
from memstream.schemas.count_header import COUNT_HEADER, count_header
from memstream.schemas.events import DecodeError, Envelope, dead_letter, decode, encode
from memstream.schemas.limits import MAX_BUS_RECORD_BYTES
from memstream.schemas.topics import Topics

__all__ = [
    "JournalRelay",
    "RelaySource",
    "RelayStats",
    "linger_left",
    "plan_batch",
    "seal_records",
]

log = logging.getLogger(__name__)

PROCESSOR = "journal-relay"


class RelaySource(Protocol):
    """What the relay needs from the journal (``memstream.infra.journal.Journal`` has it)."""

    async def read_seq(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]: ...
    async def last_seq(self) -> int: ...
    async def relay_watermark(self) -> int: ...
    async def set_relay_watermark(self, seq: int) -> None: ...


@dataclass(slots=True)
class RelayStats:
    published: int = 0  # records acknowledged by Kafka (re-publications included)
    republished: int = 0  # records re-sent after a failure (upper bound on duplicates)
    batches: int = 0
    failures: int = 0  # failed attempts (Kafka or journal)
    dead_lettered: int = 0
    quarantined: int = 0  # oversized records dead-lettered by reference (seq) instead
    rebuilt_from: int | None = None  # records the broker still had when its log was rebuilt
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class Planned:
    """One pass of the relay: records for the journal topic (``(key, value, headers)``) and
    poison for the DLQ."""

    records: list[tuple[str, bytes, tuple[tuple[str, bytes], ...]]]
    poison: list[tuple[str, bytes]]
    last_seq: int
    oversized: tuple[int, ...] = ()  # seqs quarantined (their letters are in ``poison``)
    #: per record, the envelope it carries (what sealing needs: its thread and header)
    envelopes: tuple[Envelope, ...] = ()


def thread_key(env: Envelope) -> str:
    """Kafka key of a journal event: ``account/agent/thread`` (``account/agent`` without one)."""
    if env.thread_id is None:
        return f"{env.account_id}/{env.agent_id}"
    return f"{env.account_id}/{env.agent_id}/{env.thread_id}"


#: What a record's count header adds to its size on the bus, besides its value (a header's
#: name and value, and their varint lengths, bounded).
_COUNT_HEADER_BYTES = len(COUNT_HEADER) + 10

#: How much of an oversized record its quarantine letter keeps (the journal keeps it all).
QUARANTINE_HEAD_BYTES = 4_096


def plan_batch(
    rows: Sequence[tuple[int, bytes]],
    journal_topic: str,
    ts: int,
    max_record_bytes: int = MAX_BUS_RECORD_BYTES,
    *,
    keep_head: bool = True,
) -> Planned:
    """Pure rule: turn sequenced journal rows into keyed records (and dead letters).

    The value published is the journal's bytes unchanged, so a re-publication is identical.
    A row that does not decode, or whose record would exceed ``max_record_bytes``, becomes a
    dead letter instead (an oversized one keeps only its first bytes: see module doc; none
    with ``keep_head=False``, which sealing sets: a letter must carry no thread content).
    """
    envelopes: list[Envelope] = []
    records: list[tuple[str, bytes, tuple[tuple[str, bytes], ...]]] = []
    poison: list[tuple[str, bytes]] = []
    oversized: list[int] = []
    for seq, raw in rows:
        try:
            env = decode(raw)
        except DecodeError as exc:
            letter = dead_letter(
                raw=raw,
                error=f"{exc.field}: {exc.message}",
                processor=PROCESSOR,
                topic=journal_topic,
                partition=-1,
                offset=seq,
                key=None,
                ts=ts,
            )
            poison.append((PROCESSOR, encode(letter)))
            continue
        key = thread_key(env)
        counted = count_header(env)
        headers = () if counted is None else ((COUNT_HEADER, counted),)
        size = (
            len(raw)
            + len(key.encode())
            + (0 if counted is None else _COUNT_HEADER_BYTES + len(counted))
        )
        if size > max_record_bytes:
            head = QUARANTINE_HEAD_BYTES if keep_head else 0
            letter = dead_letter(
                raw=raw[:head],
                error=(
                    f"quarantined: journal seq {seq} encodes to {size} bytes, over the bus "
                    f"limit of {max_record_bytes}; the record stays in the journal (first "
                    f"{head} bytes here)"
                ),
                processor=PROCESSOR,
                topic=journal_topic,
                partition=-1,
                offset=seq,
                key=key.encode(),
                ts=ts,
                account_id=env.account_id,
                agent_id=env.agent_id,
                truncated=True,
            )
            poison.append((key, encode(letter)))
            oversized.append(seq)
            continue
        records.append((key, raw, headers))
        envelopes.append(env)
    return Planned(records, poison, rows[-1][0] if rows else 0, tuple(oversized), tuple(envelopes))


async def seal_records(keyring: Keyring, plan: Planned) -> list[BusRecord]:
    """``plan``'s records sealed with their threads' keys (agent-level events as they are),
    their headers kept. A thread whose key is refused is erased: its envelope goes out as
    the content-free placeholder the journal's erasure writes (so seqs and counts stay
    whole), with no header (it is not a message to count)."""
    scopes = [
        None if e.thread_id is None else thread_scope(e.account_id, e.agent_id, e.thread_id)
        for e in plan.envelopes
    ]
    sealed = await keyring.seal_many(
        [(s, raw) for s, (_, raw, _) in zip(scopes, plan.records, strict=True)]
    )
    out: list[BusRecord] = []
    for (key, _, headers), env, value in zip(plan.records, plan.envelopes, sealed, strict=True):
        out.append((key, erased_placeholder(env), ()) if value is None else (key, value, headers))
    return out


def erased_placeholder(env: Envelope) -> bytes:
    """What is published for an envelope of an erased thread (no content)."""
    if env.type == "thread.deleted" and env.data.get("erased") is True:
        return encode(env)
    return placeholder(env.account_id, env.agent_id, env.thread_id or "", env.id, env.ts)


def linger_left(now: float, last_pass_end: float, linger_s: float) -> float:
    """Seconds a relay woken at ``now`` waits before its pass (pure): what remains of
    ``linger_s`` since the last pass ended, 0 after a longer quiet.

    One message at a time otherwise travels alone through every stage: a journal scan and a
    Kafka produce here, then a fetch, a batch and an offset commit in each processor, an
    insert and an index commit in the projectors. Measured on ``memstream up`` with one
    client appending back to back, that made each append cost ~6 ms of CPU, against
    ~0.5 ms at 64 clients, where batches form by themselves (docs/operations.md).
    """
    if linger_s <= 0:
        return 0.0
    return max(0.0, last_pass_end + linger_s - now)


NOTIFIED_RELAY_POLL_S: Final = 1.0
"""The relay's poll where the journal writer notifies it of every durable batch
(``Journal.on_durable``, as ``memstream up`` and ``memstream api`` wire it): a missed wake-up
would only wait this long."""


class JournalRelay:
    """Relays the journal's sequence to Kafka. ``await start()``; ``await stop()``."""

    def __init__(
        self,
        journal: RelaySource,
        bus: Bus,
        topics: Topics,
        *,
        batch_size: int = 500,
        poll_interval: float = 0.02,
        min_backoff: float = 0.1,
        max_backoff: float = 5.0,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        check_broker_log: bool = False,
        keyring: Keyring | None = None,
        state: LoopState | None = None,
        linger_s: float = 0.0,
    ) -> None:
        #: the relay's loop state (``infra.supervisor``: ``/readyz``, console, ``/metrics``):
        #: ``waiting for kafka`` / ``waiting for postgres`` (sealing) while a pass fails
        self.state = state if state is not None else LoopState()
        self._check_broker_log = check_broker_log
        self._keyring = keyring
        self._journal = journal
        self._metrics = metrics
        self._bus = bus
        self._topics = topics
        self._batch_size = max(1, batch_size)
        self._poll_interval = poll_interval
        #: a pass starts at most this long after the previous one ended (``linger_left``)
        self._linger = max(0.0, linger_s)
        self._pass_end = float("-inf")
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._clock = clock or SystemClock()
        self._wake = asyncio.Event()
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._watermark = 0
        self._last_seq = 0
        self._stopping = False
        self._publish_started: float | None = None
        self._failed_upto = 0  # highest seq attempted in a failed pass: later sends repeat it
        self.stats = RelayStats()

    # --- state -----------------------------------------------------------------------------
    @property
    def watermark(self) -> int:
        """Highest seq known published (and recorded in the journal)."""
        return self._watermark

    @property
    def backlog(self) -> int:
        """Sequenced records not yet published (last seq seen minus the watermark)."""
        return max(0, self._last_seq - self._watermark)

    @property
    def publishing_for(self) -> float:
        """Seconds the current publish has been waiting on Kafka (0 when not publishing).

        With the idempotent producer a broker outage shows here rather than in
        ``stats.failures``: aiokafka retries the batch in place until the broker is back.
        """
        started = self._publish_started
        return 0.0 if started is None else time.monotonic() - started

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def notify(self) -> None:
        """New records are in the journal: wake the relay now instead of at the next poll."""
        self._wake.set()

    # --- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the watermark and start relaying in the background. Raises JournalError."""
        if self.running:
            return
        self._watermark = await self._journal.relay_watermark()
        if self._check_broker_log and self._watermark > 0:
            kept = await self._broker_records()
            if kept is not None and kept < self._watermark - self.stats.dead_lettered:
                log.warning(
                    "journal relay: the broker holds %d records of %s but %d were published: "
                    "it lost its log; re-publishing the journal from seq 1 (processors are "
                    "idempotent). Dead letters and committed consumer offsets lived only on "
                    "the broker and are not restored",
                    kept,
                    self._topics.journal,
                    self._watermark,
                )
                self._watermark = 0
                self.stats.rebuilt_from = kept
        self._last_seq = max(self._watermark, await self._journal.last_seq())
        log.info(
            "journal relay starting at watermark %d (backlog %d)", self._watermark, self.backlog
        )
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="journal-relay")

    async def _broker_records(self) -> int | None:
        """How many records the journal topic holds now (0 if missing); None if unknown."""
        from memstream.errors import InvalidRequest
        from memstream.streams.lag import end_offsets

        try:
            _, highs = await end_offsets(self._bus.bootstrap, [self._topics.journal])
        except InvalidRequest:
            return 0  # the topic is gone
        except InfraError as exc:
            log.warning("journal relay: cannot check the broker's log (%s)", exc.message)
            return None
        return sum(highs.values())

    async def stop(self) -> None:
        """Stop relaying (what is not yet published stays in the journal for next time)."""
        task, self._task = self._task, None
        if task is not None:
            self._stopping = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_caught_up(self, timeout: float) -> bool:
        """Wait until everything appended so far is published; False on timeout."""
        target = await self._journal.last_seq()
        self._last_seq = max(self._last_seq, target)
        self.notify()
        try:
            async with asyncio.timeout(timeout), self._progress:
                await self._progress.wait_for(lambda: self._watermark >= target)
        except TimeoutError:
            return False
        return True

    # --- the loop --------------------------------------------------------------------------
    async def run_once(self) -> int:
        """One pass: publish up to ``batch_size`` records after the watermark, then record
        the new watermark. Returns how many sequenced records it covered (0 = caught up).
        Raises InfraError (Kafka) or JournalError; the watermark is then unchanged."""
        rows = await self._journal.read_seq(self._watermark, self._batch_size)
        if not rows:
            return 0
        plan = plan_batch(
            rows,
            self._topics.journal,
            epoch_ms(self._clock.now()),
            MAX_BUS_RECORD_BYTES - (0 if self._keyring is None else OVERHEAD_BYTES),
            keep_head=self._keyring is None,
        )
        self._last_seq = max(self._last_seq, plan.last_seq)
        records: list[BusRecord] = list(plan.records)
        if self._keyring is not None:  # Postgres away: InfraError, retried like Kafka
            records = await seal_records(self._keyring, plan)
        if not self._bus.started:
            await self._bus.start()
        self._publish_started = time.monotonic()
        try:
            if plan.poison:
                await self._bus.publish_many(self._topics.dlq, plan.poison)
            await self._bus.publish_many(self._topics.journal, records)
        except BaseException:
            self._failed_upto = max(self._failed_upto, plan.last_seq)
            raise
        finally:
            self._publish_started = None
        if self._failed_upto > self._watermark:
            self.stats.republished += sum(1 for s, _ in rows if s <= self._failed_upto)
        self.stats.published += len(plan.records)
        self.stats.dead_lettered += len(plan.poison) - len(plan.oversized)
        self.stats.quarantined += len(plan.oversized)
        self.stats.batches += 1
        try:
            await self._journal.set_relay_watermark(plan.last_seq)
        except BaseException:
            self._failed_upto = max(self._failed_upto, plan.last_seq)
            raise
        async with self._progress:
            self._watermark = plan.last_seq
            self._progress.notify_all()
        for _, raw in plan.poison:
            log.error("journal relay: poison record sent to %s: %s", self._topics.dlq, raw[:200])
        if plan.oversized and self._metrics is not None:
            self._metrics.dead_letters.labels(PROCESSOR, self._topics.journal).inc(
                len(plan.oversized)
            )
        return len(rows)

    async def _run(self) -> None:
        backoff = self._min_backoff
        while not self._stopping:
            # cleared before reading: a notify() during the pass triggers another pass
            self._wake.clear()
            if self._metrics is not None:
                self._metrics.relay_backlog.labels(relay="journal").set(self.backlog)
            try:
                n = await self.run_once()
            except JournalFenced as exc:
                log.error("journal relay: the journal writer was fenced; relay stops")
                self.state.failed(exc)
                self.state.state = "stopped"
                return
            except (InfraError, JournalError) as exc:
                self.stats.failures += 1
                self.stats.last_error = exc.message
                away = "journal" if isinstance(exc, JournalError) else "kafka"
                self.state.waiting(dependency_of(exc) or away, exc)
                log.warning(
                    "journal relay: publishing after seq %d failed (%s); retrying in %.1fs",
                    self._watermark,
                    exc.message.splitlines()[0],
                    backoff,
                )
                if isinstance(exc, InfraError):
                    await self._bus.reset()
                await asyncio.sleep(backoff)
                backoff = min(self._max_backoff, backoff * 2)
                continue
            if backoff > self._min_backoff:
                log.info("journal relay: publishing again, watermark %d", self._watermark)
            self.state.recovered()
            backoff = self._min_backoff
            self._pass_end = time.monotonic()
            if n >= self._batch_size:
                continue  # more is waiting: no sleep while catching up
            await self._idle()

    async def _idle(self) -> None:
        """Sleep until notified or ``poll_interval`` passed, then out the linger; refresh
        the backlog."""
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # races with the event being set, and stop() would then wait forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._poll_interval):
                await self._wake.wait()
        wait = linger_left(time.monotonic(), self._pass_end, self._linger)
        if wait > 0:  # what lands meanwhile joins this pass
            await asyncio.sleep(wait)
        with contextlib.suppress(JournalError):
            self._last_seq = max(self._last_seq, await self._journal.last_seq())
