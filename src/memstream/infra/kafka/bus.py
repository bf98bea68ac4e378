"""``Bus``: memstream's Kafka producer, a small wrapper over aiokafka's ``AIOKafkaProducer``.

Guarantees:

* **Acknowledged means written.** ``publish`` and ``publish_many`` return only once the
  broker acknowledged every record (``acks=all``); otherwise they raise
  :class:`~memstream.errors.RetryableInfraError` or :class:`~memstream.errors.PermanentInfraError`.
* **Order per key.** Records with the same key go to the same partition (the Java client's
  murmur2 partitioner, so any other producer agrees) in the order given.
* **No reordering on failure.** ``publish_many`` writes each partition's records as whole
  record batches, one after another, and sends the next batch of a partition only once the
  previous one was acknowledged. When a batch fails, no later record of that partition has
  been sent: a caller that retries the whole call from the start can produce duplicates
  (same records again, in order) but never a later record before an earlier one.
* **New partitions.** Topic metadata is re-read every ``metadata_max_age_s`` (the pipeline
  passes the ``kafka_metadata_max_age_s`` setting): a partition added to a topic takes the
  keys that now hash to it from then on.
* **Idempotent producer where the broker has it.** With ``idempotent=None`` (the default)
  the bus asks for it and, if the broker refuses ``InitProducerId`` (Tansu does), falls back
  to a plain producer and says so in the log; ``Bus.idempotent`` tells which one runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, UnknownError, UnsupportedVersionError
from aiokafka.partitioner import DefaultPartitioner

from memstream.errors import InfraError, PermanentInfraError
from memstream.infra.kafka.failures import KAFKA_FAILURES, translate

__all__ = ["Bus", "BusRecord", "Headers"]

#: Kafka record headers: ``(name, value)`` pairs.
Headers = Sequence[tuple[str, bytes]]
#: What :meth:`Bus.publish_many` takes: ``(key, value)`` or ``(key, value, headers)``.
BusRecord = tuple[str, bytes] | tuple[str, bytes, Headers]

log = logging.getLogger(__name__)

_MAX_REQUEST = 1024 * 1024


class Bus:
    """A started-once Kafka producer. Build it, ``await start()``, publish, ``await stop()``."""

    def __init__(
        self,
        bootstrap: str,
        *,
        idempotent: bool | None = None,
        client_id: str = "memstream",
        request_timeout_s: float = 10.0,
        linger_ms: int = 0,
        max_batch_bytes: int = _MAX_REQUEST // 2,
        metadata_max_age_s: float = 300.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self._want_idempotent = idempotent
        self._request_timeout_ms = int(request_timeout_s * 1000)
        self._linger_ms = linger_ms
        self._max_batch_bytes = max_batch_bytes
        self._metadata_max_age_ms = int(metadata_max_age_s * 1000)
        self._producer: AIOKafkaProducer | None = None
        self._partitioner = DefaultPartitioner()
        self.idempotent: bool | None = None

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        """Connect. Raises RetryableInfraError when the broker cannot be reached."""
        if self._producer is not None:
            return
        if self._want_idempotent is not False:
            try:
                self._producer = await self._start_producer(idempotent=True)
                self.idempotent = True
                return
            except (UnknownError, UnsupportedVersionError) as exc:
                if self._want_idempotent:
                    raise PermanentInfraError(
                        f"kafka at {self.bootstrap} has no idempotent producer ({exc})"
                    ) from exc
                log.warning(
                    "kafka at %s refused the idempotent producer (%s): using a plain producer; "
                    "duplicates on retry stay possible (consumers dedupe by event id)",
                    self.bootstrap,
                    type(exc).__name__,
                )
            except KAFKA_FAILURES as exc:
                raise translate(exc, f"connecting to {self.bootstrap}") from exc
        try:
            self._producer = await self._start_producer(idempotent=False)
        except KAFKA_FAILURES as exc:
            raise translate(exc, f"connecting to {self.bootstrap}") from exc
        self.idempotent = False

    async def _start_producer(self, *, idempotent: bool) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            acks="all",
            enable_idempotence=idempotent,
            request_timeout_ms=self._request_timeout_ms,
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_bytes,
            max_request_size=_MAX_REQUEST,
            metadata_max_age_ms=self._metadata_max_age_ms,
        )
        try:
            await producer.start()
        except BaseException:
            await _close(producer)
            raise
        return producer

    async def stop(self) -> None:
        """Flush what is pending and disconnect. Idempotent; never raises."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await _close(producer)

    async def reset(self) -> None:
        """Drop the connection after a failure; the next publish reconnects."""
        await self.stop()

    async def __aenter__(self) -> Bus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- publishing -----------------------------------------------------------------------
    def _require(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise PermanentInfraError("the Kafka bus is not started")
        return self._producer

    async def publish(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> None:
        """Publish one record and wait for the broker's acknowledgement."""
        producer = self._require()
        try:
            await producer.send_and_wait(
                topic, value, key=key.encode("utf-8"), headers=list(headers) or None
            )
        except KAFKA_FAILURES as exc:
            raise translate(exc, f"publishing to {topic}") from exc

    async def publish_many(self, topic: str, records: Iterable[BusRecord]) -> int:
        """Publish ``(key, value)`` or ``(key, value, headers)`` records in order per key;
        return how many were written.

        Waits for every partition's outcome before returning or raising, so that when it
        raises nothing of this call is still in flight.
        """
        producer = self._require()
        try:
            parts = sorted(await producer.partitions_for(topic))
        except KAFKA_FAILURES as exc:
            raise translate(exc, f"reading partitions of {topic}") from exc
        by_partition: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]] | None]]] = {}
        total = 0
        for rec in records:
            k = rec[0].encode("utf-8")
            p: int = self._partitioner(k, parts, parts)
            headers = rec[2] if len(rec) == 3 else None
            # aiokafka's C record builder takes a list, nothing else
            by_partition.setdefault(p, []).append((k, rec[1], list(headers) if headers else None))
            total += 1
        if not total:
            return 0
        outcomes = await asyncio.gather(
            *(self._send_partition(producer, topic, p, recs) for p, recs in by_partition.items()),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, InfraError):
                    raise outcome
                if isinstance(outcome, KafkaError | OSError | TimeoutError):
                    raise translate(outcome, f"publishing to {topic}") from outcome
                raise outcome
        return total

    async def _send_partition(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes, bytes, list[tuple[str, bytes]] | None]],
    ) -> None:
        i = 0
        while i < len(records):
            batch: Any = producer.create_batch()
            start = i
            while i < len(records):
                key, value, headers = records[i]
                if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                    break
                i += 1
            if i == start:
                raise PermanentInfraError(
                    f"kafka: a record of {len(records[i][1])} bytes does not fit in one "
                    f"batch on {topic}"
                )
            batch.close()
            future = await producer.send_batch(batch, topic, partition=partition)
            # if our caller is cancelled, the outcome is still retrieved (no asyncio warning)
            future.add_done_callback(_retrieve)
            await future

    async def flush(self) -> None:
        """Wait until everything sent so far is acknowledged (or failed)."""
        producer = self._require()
        try:
            await producer.flush()
        except KAFKA_FAILURES as exc:
            raise translate(exc, "flushing") from exc


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _close(producer: AIOKafkaProducer, grace: float = 5.0) -> None:
    """Stop the producer, letting it flush for ``grace`` seconds, then abandon what is left.

    aiokafka's ``stop()`` waits for every pending batch, and the idempotent producer retries
    a batch until the broker is back: with Kafka down it would wait forever. Records left
    behind were never acknowledged, so callers (the relay) still hold them to re-send.
    """
    try:
        await asyncio.wait_for(producer.stop(), grace)
        return
    except TimeoutError:
        log.warning(
            "kafka producer could not flush within %.0fs (broker down?): unacknowledged "
            "records are dropped here and re-sent by their owner",
            grace,
        )
    except Exception:  # noqa: BLE001 - a failed close must not mask the caller's error
        log.debug("closing the kafka producer failed", exc_info=True)
    # No public abort in aiokafka: stop the sender task and the client ourselves. (aiokafka's
    # own flush task may stay pending on the abandoned batches; it holds no connection.)
    sender = getattr(producer, "_sender", None)
    with contextlib.suppress(Exception, asyncio.CancelledError):
        if sender is not None:
            await asyncio.wait_for(sender.close(), grace)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.client.close(), grace)
