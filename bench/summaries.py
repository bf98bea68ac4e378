"""Bench: thread-memory counters throughput vs the raw consume rate, and crossing-message ->
summary.written latency with the offline summarizer.

Runs on embedded servers (Kafka via the suite's choice: Apache Kafka or Tansu, Valkey, a
SlateDB journal and an obstore folder in a temp dir). Prints figures and ratios; asserts
nothing. Usage: ``python bench/summaries.py [--threads 100] [--latency-threads 20]``.
Throughput is measured twice: threads new to Redis (each costs a watermark load) and threads
Redis already knows.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from obstore.store import LocalStore

from memstream.infra.embedded.kafka import ApacheKafkaServer, TansuServer, choose_broker
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.journal import Journal, local_store
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message, NewMessage, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.counters import CountersProcessor
from memstream.streams.runner import Runner
from memstream.streams.summarizer import SummarizerProcessor


async def publish(bootstrap: str, topic: str, msgs: list[Message]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for m in msgs:
            key = ThreadRef(m.account_id, m.agent_id, m.thread_id).key.encode()
            await producer.send(topic, encode(message_appended(m, 1)), key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def raw_consume_rate(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """Messages per second of a plain ``getmany`` loop, and this process's CPU µs per message."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        got, started, cpu = 0, time.perf_counter(), time.process_time()
        while got < n:
            batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
            got += sum(len(v) for v in batches.values())
        return n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1e6
    finally:
        await consumer.stop()


async def main(threads: int, latency_threads: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kind = choose_broker("auto")
        kafka = (
            ApacheKafkaServer(root / "kafka") if kind == "kafka" else TansuServer(root / "kafka")
        )
        redis_server = EmbeddedRedis(root / "redis")
        await kafka.start()
        await redis_server.start()
        redis = aioredis.from_url(redis_server.url)
        journal = await Journal.open(local_store(root / "journal"), "journal")
        try:
            store = SummaryStore(LocalStore(prefix=root / "objects", mkdir=True), redis)
            state = ThreadState(redis)

            async def fresh_topics() -> tuple[Topics, Settings]:
                topics = Topics(prefix=f"b{uuid.uuid4().hex[:6]}.")
                await ensure_topics(kafka.address, topics, 4, 1)
                return topics, Settings(
                    kafka_bootstrap=kafka.address,
                    topic_prefix=topics.prefix,
                    partitions=4,
                    data_dir=root,
                )

            async def throughput(label: str, known: bool) -> None:
                """Counters vs a raw consume of the same topic, for ``threads`` new threads.

                ``known``: their watermarks are in Redis already (a running system's usual
                case); otherwise each thread costs one watermark load from the summary store
                (the first sight of a thread after a Redis restart: the worst case)."""
                topics, settings = await fresh_topics()
                msgs: list[Message] = []
                for t in range(threads):
                    ref = ThreadRef("bench", label, f"t{t}")
                    if known:
                        await state.init_watermark(ref, -1)
                    msgs += await journal.append(
                        ref,
                        [
                            NewMessage(role="user", content=f"message {i} of thread {t}")
                            for i in range(49)
                        ],
                    )
                # 49 per thread: no summary requested, pure counting.
                n = len(msgs)
                await publish(kafka.address, topics.journal, msgs)
                raw, raw_cpu = await raw_consume_rate(kafka.address, topics.journal, n)
                metrics = make_metrics()
                runner = Runner(
                    settings,
                    {
                        "counters": lambda: CountersProcessor(
                            state, store, claim_ttl_s=3600, guard_ttl_s=600
                        )
                    },
                    metrics,
                    lag_interval_s=None,
                )
                started = time.perf_counter()
                await runner.start()
                await runner.wait_ready(60)
                join = time.perf_counter() - started
                handled = {"processor": "counters", "topic": topics.journal}

                def done_so_far() -> float:
                    return metrics.sample("memstream_processor_events_total", handled) or 0

                # Watch the runner's own counter (no I/O: polling Redis here would slow the
                # processor, which shares this event loop). Timed from the first handled
                # batch, like the raw consume (which has no group join or offset lookup).
                while done_so_far() == 0:
                    await asyncio.sleep(0.002)
                started, first, cpu = time.perf_counter(), done_so_far(), time.process_time()
                while done_so_far() < n:
                    await asyncio.sleep(0.01)
                counted = (n - first) / (time.perf_counter() - started)
                # CPU of this process only (the processor's Python side; Redis and the broker
                # are other processes): steadier than wall time on a shared machine.
                counted_cpu = (time.process_time() - cpu) / (n - first) * 1e6
                await runner.stop()
                done = 0
                for t in range(threads):
                    done += (await state.counters(ThreadRef("bench", label, f"t{t}")))[1]
                if done != n:
                    print(f"WARNING: counters hold {done} messages, expected {n}")
                what = "known to Redis" if known else "new to Redis (watermark loads)"
                print(f"{label}: {n} message.appended events, {threads} threads {what}")
                print(
                    f"  raw consume (aiokafka getmany): {raw:,.0f} msg/s, {raw_cpu:.1f} µs CPU/msg"
                )
                print(
                    f"  through counters: {counted:,.0f} msg/s, {counted_cpu:.1f} µs CPU/msg "
                    f"(group join {join:.1f} s and the first batch excluded)"
                )
                print(f"  ratio counters/raw: {counted / raw:.3f}")

            print(f"broker: {kind}")
            # --- 1. throughput: counters vs raw consume --------------------------------------
            await throughput("cold", known=False)
            await throughput("warm", known=True)
            # --- 2. latency: crossing message appended -> summary.written ---------------------
            topics, settings = await fresh_topics()
            runner = Runner(
                settings,
                {
                    "counters": lambda: CountersProcessor(
                        state, store, claim_ttl_s=3600, guard_ttl_s=600
                    ),
                    "summarizer": lambda: SummarizerProcessor(
                        journal, state, store, ExtractiveSummaryModel(), token_budget=512
                    ),
                },
                make_metrics(),
                lag_interval_s=None,
            )
            await runner.start()
            await runner.wait_ready(60)
            latencies: list[float] = []
            for t in range(latency_threads):
                ref = ThreadRef("bench", "lat", f"t{t}")
                head = await journal.append(
                    ref,
                    [
                        NewMessage(role="user", content=f"Note {i}: the cache hit rate is {i}%.")
                        for i in range(49)
                    ],
                )
                await publish(kafka.address, topics.journal, head)
                await asyncio.sleep(0.3)
                started = time.perf_counter()
                last = await journal.append(
                    ref, [NewMessage(role="user", content="The 50th message.")]
                )
                await publish(kafka.address, topics.journal, last)
                while await store.get_stored(ref) is None:
                    await asyncio.sleep(0.005)
                latencies.append((time.perf_counter() - started) * 1000)
            await runner.stop()
            latencies.sort()
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(
                f"crossing append -> summary.json written ({len(latencies)} threads, offline model): "
                f"p50 {statistics.median(latencies):.0f} ms, p99 {p99:.0f} ms"
            )
        finally:
            await journal.close()
            await redis.aclose()
            await redis_server.stop()
            await kafka.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=100)
    ap.add_argument("--latency-threads", type=int, default=20)
    a = ap.parse_args()
    asyncio.run(main(a.threads, a.latency_threads))
