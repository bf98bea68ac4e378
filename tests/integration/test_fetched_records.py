"""A consumer built with ``as_raw_record`` gets from ``getmany`` the RawRecord that
``consumer.raw_record`` makes of aiokafka's own record, and every other consumer in the
process still gets aiokafka's records."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from memstream.infra.kafka import ensure_topics
from memstream.schemas.topics import Topics
from memstream.streams.consumer import raw_record
from memstream.streams.fetched_records import as_raw_record, install
from memstream.streams.processor import RETRY_FOR_HEADER, RawRecord

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def read(bootstrap: str, topic: str, n: int, *, raw: bool) -> list[object]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        value_deserializer=as_raw_record if raw else None,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        out: list[object] = []
        async with asyncio.timeout(30):
            while len(out) < n:
                got = await consumer.getmany(tp, timeout_ms=200)
                out.extend(got.get(tp, []))
        return out
    finally:
        await consumer.stop()


async def test_fetched_records_are_what_raw_record_made_of_aiokafkas(
    kafka_bootstrap: str, unique_topics: Topics
) -> None:
    await ensure_topics(kafka_bootstrap, unique_topics, 1, 1)
    topic = unique_topics.journal
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"plain", key=b"k1", partition=0)
        await producer.send_and_wait(topic, None, key=b"k2", partition=0)  # a tombstone
        await producer.send_and_wait(
            topic, b"retried", partition=0, headers=[(RETRY_FOR_HEADER, b"counters")]
        )
        await producer.send_and_wait(topic, b"other header", partition=0, headers=[("x", b"y")])
    finally:
        await producer.stop()
    install()
    fetched = await read(kafka_bootstrap, topic, 4, raw=True)
    plain = await read(kafka_bootstrap, topic, 4, raw=False)  # after install: untouched
    assert all(type(r) is ConsumerRecord for r in plain)
    assert all(type(r) is RawRecord for r in fetched)
    # the element types, as the two assertions just above checked them
    plain_records = cast(list[ConsumerRecord[bytes, bytes]], plain)
    fetched_records = cast(list[RawRecord], fetched)
    assert fetched_records == [raw_record(r) for r in plain_records]
    by_value = {r.value: r for r in fetched_records}
    assert by_value[b"retried"].meta.retry_for == "counters"
    assert by_value[b""].meta.key == b"k2"
    assert by_value[b"plain"].meta.timestamp is not None
