"""Dead-letter tools: list what processors gave up on, and re-publish it to its origin.

The ``dlq`` topic holds ``dlq.dead_letter`` envelopes written by the stream runtime
(:mod:`memstream.streams.processor`), keyed by the original record's key. These functions
back ``memstream dlq list`` and ``memstream dlq retry``; they are plain async functions that
return data (the CLI formats it).

Guarantees:

- :func:`list_dead_letters` reads up to the high-water mark seen when it starts (it never
  waits for new records) and returns the most recent ``limit`` dead letters, oldest first.
- :func:`retry_dead_letters` re-publishes the original payload bytes to the origin topic with
  the original key, waiting for the broker's acknowledgement. A record dead-lettered by
  several processors (each group sees every record) is re-published **once**. Without
  ``processor`` every processor then sees it again (handlers are idempotent); with
  ``processor`` the record carries the ``memstream-retry-for`` header and every other
  processor skips it, so only the processor that dead-lettered it applies it again.
  Payloads that were not valid UTF-8 were stored lossily and are skipped (reported).
- The DLQ is an append-only log: a retried dead letter stays listed. Retrying twice
  re-publishes twice.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from memstream.errors import InvalidRequest
from memstream.infra.kafka.failures import KAFKA_FAILURES, translate
from memstream.schemas.events import DecodeError, decode
from memstream.schemas.topics import Topics
from memstream.streams.lag import bootstrap_hosts, end_offsets
from memstream.streams.processor import RETRY_FOR_HEADER

__all__ = ["DeadLetter", "RetryReport", "list_dead_letters", "retry_dead_letters"]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of the ``dlq`` topic. ``id`` selects it for :func:`retry_dead_letters`."""

    id: str
    ts: int
    processor: str
    error: str
    origin_topic: str
    origin_partition: int
    origin_offset: int
    key: str | None
    payload: str
    lossless: bool
    dlq_partition: int
    dlq_offset: int
    payload_encoding: str | None = None  # "base64" for a binary (sealed) record

    def payload_bytes(self) -> bytes:
        """The original record's bytes."""
        if self.payload_encoding == "base64":
            return base64.b64decode(self.payload)
        return self.payload.encode("utf-8")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RetryReport:
    """What :func:`retry_dead_letters` did. ``missing`` are requested ids not in the DLQ."""

    republished: list[DeadLetter] = field(default_factory=list)
    skipped_lossy: list[DeadLetter] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "republished": [d.id for d in self.republished],
            "skipped_lossy": [d.id for d in self.skipped_lossy],
            "missing": list(self.missing),
        }


def _dlq_topic(topics: Topics | str) -> str:
    return topics.dlq if isinstance(topics, Topics) else topics


def _parse(record_value: bytes, partition: int, offset: int) -> DeadLetter | None:
    try:
        env = decode(record_value)
    except DecodeError:
        return None
    if env.type != "dlq.dead_letter":
        return None
    d = env.data

    def s(name: str) -> str:
        v = d.get(name)
        return v if isinstance(v, str) else ""

    def i(name: str) -> int:
        v = d.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else -1

    key = d.get("key")
    return DeadLetter(
        id=env.id,
        ts=env.ts,
        processor=s("processor"),
        error=s("error"),
        origin_topic=s("origin_topic"),
        origin_partition=i("origin_partition"),
        origin_offset=i("origin_offset"),
        key=key if isinstance(key, str) else None,
        payload=s("payload"),
        lossless=d.get("lossless") is not False,
        dlq_partition=partition,
        dlq_offset=offset,
        payload_encoding="base64" if d.get("payload_encoding") == "base64" else None,
    )


async def list_dead_letters(
    bootstrap: str,
    topics: Topics | str,
    limit: int | None = 100,
    *,
    processor: str | None = None,
    timeout: float = 30.0,
) -> list[DeadLetter]:
    """The most recent ``limit`` dead letters (None: all), oldest first.

    ``topics`` is the deployment's :class:`Topics` or the full DLQ topic name; ``processor``
    keeps only that processor's dead letters. Records in the DLQ topic that are not
    dead-letter envelopes are ignored.
    """
    if limit is not None and limit < 1:
        raise InvalidRequest("limit must be at least 1", field="limit")
    topic = _dlq_topic(topics)
    starts, highs = await end_offsets(bootstrap, [topic], timeout=timeout)
    wanted = {tp: hw for tp, hw in highs.items() if hw > starts.get(tp, 0)}
    if not wanted:
        return []
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_hosts(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    out: list[DeadLetter] = []
    try:
        await consumer.start()
        tps = list(wanted)
        consumer.assign(tps)
        for tp in tps:
            # Without a processor filter only the last ``limit`` of each partition can matter.
            first = starts.get(tp, 0)
            if limit is not None and processor is None:
                first = max(first, wanted[tp] - limit)
            consumer.seek(tp, first)
        pending = set(tps)
        async with asyncio.timeout(timeout):
            while pending:
                batch = await consumer.getmany(*pending, timeout_ms=200)
                for tp, records in batch.items():
                    for rec in records:
                        if rec.offset >= wanted[tp] or rec.value is None:
                            continue
                        dl = _parse(rec.value, tp.partition, rec.offset)
                        if dl is not None and (processor is None or dl.processor == processor):
                            out.append(dl)
                for tp in list(pending):
                    if await consumer.position(tp) >= wanted[tp]:
                        pending.discard(tp)
    except KAFKA_FAILURES as exc:
        raise translate(exc, f"reading {topic}") from exc
    finally:
        await consumer.stop()
    out.sort(key=lambda d: (d.ts, d.dlq_partition, d.dlq_offset))
    return out[-limit:] if limit is not None else out


async def retry_dead_letters(
    bootstrap: str,
    topics: Topics | str,
    ids: Collection[str] | None = None,
    *,
    processor: str | None = None,
    timeout: float = 30.0,
) -> RetryReport:
    """Re-publish dead letters to their origin topics with their original keys.

    ``ids=None`` retries every dead letter (of ``processor``, if given); otherwise only the
    listed ids (an empty collection raises ``InvalidRequest(field="ids")``).
    """
    if ids is not None and not ids:
        raise InvalidRequest("give at least one dead-letter id, or retry all", field="ids")
    letters = await list_dead_letters(bootstrap, topics, None, processor=processor, timeout=timeout)
    if ids is not None:
        wanted = set(ids)
        chosen = [d for d in letters if d.id in wanted]
        found = {d.id for d in chosen}
        missing = sorted(wanted - found)
    else:
        chosen, missing = letters, []
    report = RetryReport(missing=missing)
    seen: set[tuple[str, int, int]] = set()
    to_send: list[DeadLetter] = []
    for d in chosen:
        if not d.lossless:
            report.skipped_lossy.append(d)
            continue
        origin = (d.origin_topic, d.origin_partition, d.origin_offset)
        if origin in seen:
            continue
        seen.add(origin)
        to_send.append(d)
    if not to_send:
        return report
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_hosts(bootstrap), acks="all")
    try:
        await producer.start()
        futures = [
            await producer.send(
                d.origin_topic,
                value=d.payload_bytes(),
                key=d.key.encode("utf-8") if d.key is not None else None,
                headers=[(RETRY_FOR_HEADER, processor.encode("utf-8"))] if processor else None,
            )
            for d in to_send
        ]
        async with asyncio.timeout(timeout):
            await asyncio.gather(*futures)
    except KAFKA_FAILURES as exc:
        raise translate(exc, "re-publishing dead letters") from exc
    finally:
        await producer.stop()
    report.republished.extend(to_send)
    return report


def origins(letters: Sequence[DeadLetter]) -> set[tuple[str, int, int]]:
    """(topic, partition, offset) of each dead letter's origin record."""
    return {(d.origin_topic, d.origin_partition, d.origin_offset) for d in letters}
