"""Append -> visible on the Kafka ``journal`` topic: latency of the journal relay.

Run: ``python bench/relay_latency.py [--appends 300] [--broker kafka|tansu]``.

Set-up: Apache Kafka 4.x (KRaft, embedded from Maven jars) or Tansu, a real SlateDB journal
on a local folder (5 ms WAL flush), the ``JournalRelay`` publishing through ``Bus`` (the
idempotent producer on Kafka), and a consumer assigned to every partition of the topic
(``fetch_max_wait_ms=5``). Appends are sequential, one message each, to 8 threads in turn.

It prints p50/p99 of:

- ``relay (notify)``: from calling ``journal.append`` to the consumer holding the record, with
  ``relay.notify()`` after each append (how ``memstream up`` wires it);
- ``relay (poll 20 ms)``: the same without notify: the relay finds appends by polling;
- ``append only``: the durable append itself (part of both figures above);
- ``raw kafka``: the ceiling for the Kafka leg: ``send_and_wait`` of the same bytes by a
  plain producer to the consumer holding it;

and the ratio relay(notify) / (append + raw kafka).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memstream.infra.embedded.kafka import ApacheKafkaServer, TansuServer
from memstream.infra.journal import Journal, local_store
from memstream.infra.kafka import Bus, ensure_topics, topic_partitions
from memstream.schemas.events import decode
from memstream.schemas.records import NewMessage, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.journal_relay import JournalRelay

THREADS = [ThreadRef("bench", "agent", f"t{i}") for i in range(8)]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def show(name: str, xs: list[float]) -> None:
    print(
        f"{name:<22} n={len(xs):<5} p50={pct(xs, 50):7.2f} ms  p99={pct(xs, 99):7.2f} ms  "
        f"mean={statistics.fmean(xs):7.2f} ms"
    )


class Watcher:
    """A consumer on every partition that resolves a future when an event id shows up."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=5
        )
        self.topic = topic
        self.bootstrap = bootstrap
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.arrived: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        parts = await topic_partitions(self.bootstrap, self.topic)
        tps = [TopicPartition(self.topic, p) for p in parts]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve "end" now, not at the first fetch
            await self.consumer.position(tp)
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=50)
            now = time.perf_counter()
            for recs in batch.values():
                for r in recs:
                    key = decode(r.value).id if r.value[:1] == b"{" else r.value.decode()
                    fut = self.waiting.pop(key, None)
                    if fut is None:
                        self.arrived[key] = now  # came before anyone asked
                    elif not fut.done():
                        fut.set_result(now)

    def expect(self, key: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if key in self.arrived:
            fut.set_result(self.arrived.pop(key))
        else:
            self.waiting[key] = fut
        return fut

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
        await self.consumer.stop()


async def relay_run(
    journal: Journal, relay: JournalRelay, watcher: Watcher, n: int, notify: bool
) -> tuple[list[float], list[float]]:
    total: list[float] = []
    append_only: list[float] = []
    for i in range(n):
        ref = THREADS[i % len(THREADS)]
        t0 = time.perf_counter()
        msgs = await journal.append(ref, [NewMessage(role="user", content=f"hello {i}")])
        t1 = time.perf_counter()
        fut = watcher.expect(f"msg:{msgs[0].message_id}")
        if notify:
            relay.notify()
        seen = await asyncio.wait_for(fut, 30)
        total.append((seen - t0) * 1000)
        append_only.append((t1 - t0) * 1000)
    return total, append_only


async def raw_run(bootstrap: str, topic: str, watcher: Watcher, n: int) -> list[float]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    out: list[float] = []
    try:
        for i in range(n):
            key = f"raw-{i}-{time.perf_counter_ns()}"
            fut = watcher.expect(key)
            t0 = time.perf_counter()
            await producer.send_and_wait(topic, key.encode(), key=THREADS[i % 8].key.encode())
            seen = await asyncio.wait_for(fut, 30)
            out.append((seen - t0) * 1000)
    finally:
        await producer.stop()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=300)
    ap.add_argument("--broker", choices=["kafka", "tansu"], default="kafka")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="memstream-bench-relay-") as tmp:
        root = Path(tmp)
        server = ApacheKafkaServer(root / "kafka") if args.broker == "kafka" else TansuServer(root)
        t = time.perf_counter()
        await server.start()
        print(f"{args.broker} ready in {time.perf_counter() - t:.2f}s on {server.address}")
        journal = await Journal.open(local_store(root / "journal"), "journal", flush_interval_ms=5)
        topics = Topics("bench.")
        await ensure_topics(server.address, topics, 4, 1)
        bus = Bus(server.address)
        await bus.start()
        relay = JournalRelay(journal, bus, topics)  # default poll: 20 ms
        await relay.start()
        watcher = Watcher(server.address, topics.journal)
        await watcher.start()
        try:
            await relay_run(journal, relay, watcher, 20, notify=True)  # warm-up
            notify_total, append_only = await relay_run(
                journal, relay, watcher, args.appends, notify=True
            )
            poll_total, _ = await relay_run(
                journal, relay, watcher, max(50, args.appends // 3), notify=False
            )
            raw_topics = Topics("bench.raw.")
            await ensure_topics(server.address, raw_topics, 4, 1)
            watcher2 = Watcher(server.address, raw_topics.journal)
            await watcher2.start()
            await raw_run(server.address, raw_topics.journal, watcher2, 20)  # warm-up
            raw = await raw_run(server.address, raw_topics.journal, watcher2, args.appends)
            await watcher2.stop()
        finally:
            await watcher.stop()
            await relay.stop()
            await bus.stop()
            await journal.close()
            await server.stop()
    print(f"idempotent producer: {bus.idempotent}")
    show("relay (notify)", notify_total)
    show("relay (poll 20 ms)", poll_total)
    show("append only", append_only)
    show("raw kafka", raw)
    ceiling = pct(append_only, 50) + pct(raw, 50)
    print(
        f"ratio relay(notify) p50 / (append p50 + raw kafka p50) = {pct(notify_total, 50) / ceiling:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
