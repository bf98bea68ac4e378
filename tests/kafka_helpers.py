"""Test helpers for putting records on a Kafka topic and reading what reached it (no fakes:
a real producer and a real consumer)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memstream.infra.kafka import high_watermarks


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
    ends = await high_watermarks(bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        out: dict[int, list[tuple[bytes | None, bytes]]] = {p: [] for p in ends}
        async with asyncio.timeout(timeout):
            while [tp for tp in tps if await consumer.position(tp) < ends[tp.partition]]:
                batch = await consumer.getmany(timeout_ms=200)
                for tp, recs in batch.items():
                    out[tp.partition].extend(
                        (r.key, r.value) for r in recs if r.offset < ends[tp.partition]
                    )
        return out
    finally:
        await consumer.stop()
