"""Bench: raw consume rate of aiokafka against confluent-kafka (librdkafka) on one topic.

Both read the same topic from the same embedded broker (the suite's choice: Apache Kafka
when Java is there, else Tansu), assign-only (no group), from the log start to its end, in
interleaved rounds whose order rotates; medians are printed with each rate's ratio to
aiokafka's plain ``getmany``. Variants:

- ``aiokafka getmany``: the values of every record gathered (what a replay keeps);
- ``aiokafka + RawRecord``: plus the runtime's record (``consumer.raw_record``) as it was
  built from aiokafka's ``ConsumerRecord``;
- ``aiokafka, fetched RawRecord``: the runtime's record built by the fetcher instead
  (``streams.fetched_records``, no ``ConsumerRecord``);
- ``confluent consume``: ``Consumer.consume(num_messages=N)`` in a worker thread
  (``asyncio.to_thread``), values gathered in the thread;
- ``confluent + RawRecord``: plus a :class:`RawRecord` per message built in the thread.

CPU is this process's (``time.process_time``: librdkafka's own threads count too) per
message. Usage: ``python bench/kafka_clients.py [--records N] [--rounds R]``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.consumer import fetcher as aiokafka_fetcher
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as CkPartition

from memstream.infra.embedded.kafka import ApacheKafkaServer, TansuServer, choose_broker
from memstream.infra.kafka.admin import ensure_topics
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message
from memstream.schemas.topics import Topics
from memstream.streams import fetched_records
from memstream.streams.consumer import raw_record
from memstream.streams.fetched_records import as_raw_record, install
from memstream.streams.processor import RawRecord, new_raw_record

PARTITIONS = 4
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def fill(bootstrap: str, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for i in range(n):
            t = f"t{i // 49}"
            m = Message(
                account_id="bench",
                agent_id="agent",
                thread_id=t,
                offset=i % 49,
                message_id=f"{t}-{i}",
                role="user",
                content=f"message {i} of thread {t}",
                created_at=T0,
                token_count=9,
            )
            await producer.send(topic, encode(message_appended(m, 1)), key=t.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def aiokafka_read(
    bootstrap: str, topic: str, n: int, records: bool, fetched: bool = False
) -> int:
    if fetched:
        install()
    else:  # aiokafka as it ships (install's subclass costs plain consumers a little)
        aiokafka_fetcher.PartitionRecords = fetched_records._ORIGINAL  # noqa: SLF001
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        value_deserializer=as_raw_record if fetched else None,
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got = 0
        while got < n:
            polled = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if fetched:
                out_: list[RawRecord] = []
                for recs in polled.values():
                    out_.extend(recs)
                got += len(out_)
            elif records:
                out: list[RawRecord] = []
                for recs in polled.values():
                    out.extend(map(raw_record, recs))
                got += len(out)
            else:
                for recs in polled.values():
                    values = [r.value for r in recs]
                    got += len(values)
        return got
    finally:
        await consumer.stop()


def _ck_batch(consumer: Consumer, records: bool) -> int:
    msgs = consumer.consume(num_messages=5000, timeout=1.0)
    if records:
        out = []
        for m in msgs:
            ts = m.timestamp()[1]
            topic, partition, offset = m.topic(), m.partition(), m.offset()
            # records, not events (an event has no topic or offset; none comes: no EOF events)
            assert topic is not None and partition is not None and offset is not None
            out.append(
                new_raw_record(
                    topic,
                    partition,
                    offset,
                    m.key(),
                    ts / 1000.0 if ts >= 0 else None,
                    None,
                    m.value() or b"",
                )
            )
        return len(out)
    return len([m.value() for m in msgs])


async def confluent_read(bootstrap: str, topic: str, n: int, records: bool) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    try:
        consumer.assign([CkPartition(topic, p, 0) for p in range(PARTITIONS)])
        got = 0
        while got < n:
            got += await asyncio.to_thread(_ck_batch, consumer, records)
        return got
    finally:
        await asyncio.to_thread(consumer.close)


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.records
    with tempfile.TemporaryDirectory() as tmp:
        kind = choose_broker("auto")
        root = Path(tmp)
        server = ApacheKafkaServer(root / "k") if kind == "kafka" else TansuServer(root / "k")
        await server.start()
        try:
            bootstrap = server.address
            topics = Topics(prefix=f"b{uuid.uuid4().hex[:8]}.")
            await ensure_topics(bootstrap, topics, PARTITIONS, 1)
            await fill(bootstrap, topics.journal, n)
            variants: dict[str, Callable[[], Awaitable[int]]] = {
                "aiokafka getmany": lambda: aiokafka_read(bootstrap, topics.journal, n, False),
                "aiokafka + RawRecord": lambda: aiokafka_read(bootstrap, topics.journal, n, True),
                "aiokafka, fetched RawRecord": lambda: aiokafka_read(
                    bootstrap, topics.journal, n, True, fetched=True
                ),
                "confluent consume": lambda: confluent_read(bootstrap, topics.journal, n, False),
                "confluent + RawRecord": lambda: confluent_read(bootstrap, topics.journal, n, True),
            }
            names = list(variants)
            rates: dict[str, list[float]] = {k: [] for k in names}
            cpus: dict[str, list[float]] = {k: [] for k in names}
            await variants[names[0]]()  # warm-up: connections, page cache
            print(f"broker {kind}, {n} records, {PARTITIONS} partitions, load {load()}")
            for r in range(args.rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    wall, cpu = time.perf_counter(), time.process_time()
                    got = await variants[name]()
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    rates[name].append(got / wall)
                    cpus[name].append(cpu / got * 1e6)
                print(f"round {r + 1} done, load {load()}", flush=True)
        finally:
            await server.stop()
    base = statistics.median(rates[names[0]])
    for name in names:
        rate = statistics.median(rates[name])
        cpu = statistics.median(cpus[name])
        print(
            f"{name:<28} {rate:>10,.0f} rec/s  {cpu:5.2f} µs CPU/rec  "
            f"{rate / base:.2f}x aiokafka getmany  (min {min(rates[name]):,.0f}, "
            f"max {max(rates[name]):,.0f})"
        )
    print(f"load at the end {load()}")


if __name__ == "__main__":
    asyncio.run(main())
