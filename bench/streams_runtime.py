"""Bench: records/s through the stream runtime vs a raw aiokafka consume of the same topic.

Prints, on an embedded broker (Tansu by default, ``--broker kafka`` for Apache Kafka):

- raw: a group-less ``AIOKafkaConsumer.getmany`` reading the whole topic (decode skipped);
- raw + decode: the same, plus ``schemas.events.decode`` of every value (the ceiling of any
  processor that reads envelopes in this process);
- runtime, one record per call: a no-op ``Processor.handle`` hosted by ``Runner`` (group
  consumer, decode with ``schemas.events.decode``, metrics, commits);
- runtime, batched: a no-op ``handle_batch`` with ``batch_max=500``;
- runtime, raw: a no-op ``handle_raw`` (``raw = True``: no decode) with ``batch_max=500``;
- the ratios runtime/raw. Time to first record (group join) is excluded from the rates.

The three are measured in interleaved rounds (the machine is shared) and the medians are
printed. Run: ``python bench/streams_runtime.py [--records N] [--rounds R]
[--broker tansu|kafka]``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memstream.infra.embedded.kafka import ApacheKafkaServer, TansuServer
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.schemas.events import Envelope, decode, encode, thread_event
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.processor import EventMeta, Processor, RawRecord, Received
from memstream.streams.runner import Runner

PARTITIONS = 4


class Noop(Processor):
    topic = JOURNAL

    def __init__(self, name: str, batch_max: int, raw: bool = False) -> None:
        self.name = name
        self.batch_max = batch_max
        self.raw = raw
        self.batch_within_s = 0.05
        self.count = 0
        self.first: float | None = None
        self.done = asyncio.Event()
        self.target = 0

    def _tick(self, n: int) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        self.count += n
        if self.count >= self.target:
            self.done.set()

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        self._tick(1)

    async def handle_batch(self, items: Sequence[Received]) -> None:
        self._tick(len(items))

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        self._tick(len(records))


async def fill(bootstrap: str, topic: str, n: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for i in range(n):
            env = thread_event(
                "thread.created", "acct", "agent", f"th{i % 500}", ts=1, data={"i": i}
            )
            await producer.send(topic, encode(env), key=f"th{i % 500}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def raw_rate(bootstrap: str, topic: str, n: int, *, decoding: bool = False) -> float:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        got, start = 0, time.perf_counter()
        while got < n:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            got += sum(len(v) for v in batch.values())
            if decoding:
                for records in batch.values():
                    for r in records:
                        decode(r.value or b"")
        return n / (time.perf_counter() - start)
    finally:
        await consumer.stop()


async def runtime_rate(
    bootstrap: str, topics: Topics, data: Path, n: int, batch_max: int, raw: bool = False
) -> float:
    name = f"noop{batch_max}-{uuid.uuid4().hex[:6]}"
    proc = Noop(name, batch_max, raw)
    proc.target = n
    settings = Settings(
        kafka_bootstrap=bootstrap, topic_prefix=topics.prefix, partitions=PARTITIONS, data_dir=data
    )
    runner = Runner(settings, {name: lambda: proc}, make_metrics(), lag_interval_s=None)
    await runner.start()
    try:
        await asyncio.wait_for(proc.done.wait(), 600)
        assert proc.first is not None
        return (n - 1) / (time.perf_counter() - proc.first)
    finally:
        await runner.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--broker", choices=["tansu", "kafka"], default="tansu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = (
            ApacheKafkaServer(root / "k") if args.broker == "kafka" else TansuServer(root / "k")
        )
        await server.start()
        try:
            bootstrap = server.address
            topics = Topics(prefix=f"b{uuid.uuid4().hex[:8]}.")
            await ensure_topics(bootstrap, topics, PARTITIONS, 1)
            await fill(bootstrap, topics.journal, args.records)
            raws, decoded, singles, batches, undecoded = [], [], [], [], []
            for _ in range(args.rounds):
                raws.append(await raw_rate(bootstrap, topics.journal, args.records))
                decoded.append(
                    await raw_rate(bootstrap, topics.journal, args.records, decoding=True)
                )
                singles.append(await runtime_rate(bootstrap, topics, root / "d", args.records, 1))
                batches.append(await runtime_rate(bootstrap, topics, root / "d", args.records, 500))
                undecoded.append(
                    await runtime_rate(bootstrap, topics, root / "d", args.records, 500, raw=True)
                )
        finally:
            await server.stop()
    raw, dec, single, batched, bulk = (
        statistics.median(x) for x in (raws, decoded, singles, batches, undecoded)
    )
    print(
        f"broker: {args.broker}, records: {args.records} (~200 B envelopes), {PARTITIONS} "
        f"partitions, median of {args.rounds} interleaved rounds"
    )
    print(f"raw aiokafka getmany:         {raw:10.0f} rec/s")
    print(f"raw getmany + decode:         {dec:10.0f} rec/s  ({dec / raw:.3f} of raw)")
    print(f"runtime, handle per record:   {single:10.0f} rec/s  ({single / raw:.3f} of raw)")
    print(f"runtime, handle_batch(500):   {batched:10.0f} rec/s  ({batched / raw:.3f} of raw)")
    print(f"runtime, raw handle_raw(500): {bulk:10.0f} rec/s  ({bulk / raw:.3f} of raw)")


if __name__ == "__main__":
    asyncio.run(main())
