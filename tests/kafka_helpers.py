"""Test helpers for putting records on a Kafka topic and reading what reached it (no fakes:
a real producer and a real consumer)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memstream.infra.journal import Journal
from memstream.infra.kafka import high_watermarks
from memstream.schemas.records import NewMessage, ThreadRef
from memstream.streams.consumer import raw_record
from memstream.streams.journal_relay import JournalRelay
from memstream.streams.processor import RawRecord


async def append_load(
    journal: Journal,
    relay: JournalRelay,
    threads: Sequence[ThreadRef],
    stop: asyncio.Event,
    pause_s: float,
) -> int:
    """Append one message per thread per round (``m0``, ``m1``...) and wake the relay,
    until ``stop``; returns how many were appended."""
    n = r = 0
    while not stop.is_set():
        await asyncio.gather(
            *(journal.append(ref, [NewMessage(role="user", content=f"m{r}")]) for ref in threads)
        )
        n += len(threads)
        r += 1
        relay.notify()
        await asyncio.sleep(pause_s)
    return n


async def produce(bootstrap: str, topic: str, records: Sequence[tuple[str, bytes]]) -> list[int]:
    """Send (key, value) records in one batch; returns their offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        futs = [await producer.send(topic, value=v, key=k.encode()) for k, v in records]
        return [(await f).offset for f in futs]
    finally:
        await producer.stop()


async def read_topic(
    bootstrap: str, topic: str, timeout: float = 30.0
) -> dict[int, list[tuple[bytes | None, bytes]]]:
    """Every ``(key, value)`` on ``topic`` now, per partition in offset order."""
    records = await read_topic_records(bootstrap, topic, timeout)
    return {p: [(r.meta.key, r.value) for r in recs] for p, recs in records.items()}


async def read_topic_records(
    bootstrap: str, topic: str, timeout: float = 30.0
) -> dict[int, list[RawRecord]]:
    """Every record on ``topic`` now, as the processors get it (headers included), per
    partition in offset order."""
    ends = await high_watermarks(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: dict[int, list[RawRecord]] = {p: [] for p in ends}
        async with asyncio.timeout(timeout):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp.partition]]:
                batch = await consumer.getmany(timeout_ms=200)
                for tp, recs in batch.items():
                    out[tp.partition].extend(
                        raw_record(r) for r in recs if r.offset < ends[tp.partition]
                    )
        return out
    finally:
        await consumer.stop()
