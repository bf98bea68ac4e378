"""Thread memory end to end through a real Kafka: journal topic -> counters -> summaries topic
-> two summarizers in two consumer groups racing on every request -> summary.json.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from obstore.store import LocalStore

from memstream.clock import FixedClock
from memstream.infra.journal import Journal, local_store
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.schemas.events import decode, encode, message_appended
from memstream.schemas.records import Message, NewMessage, Summary, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.counters import CountersProcessor
from memstream.streams.processor import RetryPolicy
from memstream.streams.runner import Runner
from memstream.streams.summarizer import SummarizerProcessor


@dataclass
class Pipeline:
    bootstrap: str
    topics: Topics
    journal: Journal
    store: SummaryStore


@pytest.fixture(scope="module")
async def pipeline(
    kafka_bootstrap: str, redis_client: aioredis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    root: Path = tmp_path_factory.mktemp("thread-memory")
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await ensure_topics(kafka_bootstrap, topics, 2, 1)
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, partitions=2, data_dir=root
    )
    journal = await Journal.open(local_store(root / "journal"), "journal", clock=FixedClock())
    store = SummaryStore(LocalStore(prefix=root / "objects", mkdir=True), redis_client)
    state = ThreadState(redis_client)

    def summarizer(name: str) -> SummarizerProcessor:
        return SummarizerProcessor(
            journal, state, store, ExtractiveSummaryModel(), token_budget=200, name=name
        )

    runner = Runner(
        settings,
        {
            "counters": lambda: CountersProcessor(state, store, guard_ttl_s=600),
            "summarizer": lambda: summarizer("summarizer"),
            "summarizer-b": lambda: summarizer("summarizer-b"),  # a second group: races
        },
        make_metrics(),
        retry=RetryPolicy(attempts=3, first_delay=0.05),
        lag_interval_s=None,
    )
    await runner.start()
    try:
        await runner.wait_ready(60)
        yield Pipeline(kafka_bootstrap, topics, journal, store)
    finally:
        await runner.stop()
        await journal.close()


async def publish(p: Pipeline, msgs: Sequence[Message]) -> None:
    """What the relay does: each journal message as a message.appended record."""
    producer = AIOKafkaProducer(bootstrap_servers=p.bootstrap)
    await producer.start()
    try:
        for m in msgs:
            ref = ThreadRef(m.account_id, m.agent_id, m.thread_id)
            await producer.send(
                p.topics.journal, encode(message_appended(m, 1)), key=ref.key.encode()
            )
        await producer.flush()
    finally:
        await producer.stop()


async def wait_version(p: Pipeline, ref: ThreadRef, version: int, timeout: float = 60) -> Summary:
    async with asyncio.timeout(timeout):
        while True:
            s = await p.store.get_stored(ref)
            if s is not None and s.version >= version:
                return s
            await asyncio.sleep(0.1)


async def summary_events(p: Pipeline, ref: ThreadRef) -> list[tuple[str, str]]:
    """(type, id) of every summaries-topic event of this thread, in order: read up to the
    topic's end offsets as they are when called (not until the first empty fetch, which
    stops short on a loaded machine)."""
    consumer = AIOKafkaConsumer(
        p.topics.summaries, bootstrap_servers=p.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    out: list[tuple[str, str]] = []
    try:
        deadline = time.monotonic() + 60
        while not consumer.assignment():
            assert time.monotonic() < deadline, "no partition of the summaries topic assigned"
            await asyncio.sleep(0.05)
        parts = list(consumer.assignment())
        end = await consumer.end_offsets(parts)
        while [tp for tp in parts if await consumer.position(tp) < end[tp]]:
            assert time.monotonic() < deadline, "summaries topic not read to its end in 60 s"
            batches = await consumer.getmany(timeout_ms=1000)
            for records in batches.values():
                for r in records:
                    env = decode(r.value)
                    if env.thread_id == ref.thread_id and env.agent_id == ref.agent_id:
                        out.append((env.type, env.id))
    finally:
        await consumer.stop()
    return out


def chatter(n: int, start: int = 0) -> list[NewMessage]:
    return [
        NewMessage(role="user", content=f"Note {i}: deploy target d{i} is healthy again.")
        for i in range(start, start + n)
    ]


async def test_end_to_end_one_summary_per_crossing_with_redelivery(pipeline: Pipeline) -> None:
    ref = ThreadRef("acc", f"agent-{uuid.uuid4().hex[:6]}", f"thr-{uuid.uuid4().hex[:6]}")
    intro = await pipeline.journal.append(
        ref,
        [
            NewMessage(
                role="user", content="Hello, my name is Grace Hopper and I live in Arlington."
            )
        ],
    )
    first = intro + await pipeline.journal.append(ref, chatter(48))
    await publish(pipeline, first)  # 49 messages: nothing
    await asyncio.sleep(3)
    assert await pipeline.store.get_stored(ref) is None
    nxt = await pipeline.journal.append(ref, chatter(1, 48))
    await publish(pipeline, nxt)  # the 50th
    v1 = await wait_version(pipeline, ref, 1)
    assert v1.last_message_offset == 49
    assert "Grace Hopper" in v1.content
    # Every event redelivered (a replay): nothing new happens.
    await publish(pipeline, first + nxt)
    second = await pipeline.journal.append(ref, chatter(50, 100))
    await publish(pipeline, second)
    v2 = await wait_version(pipeline, ref, 2)
    assert v2.last_message_offset == 99 and v2.message_count == 100
    assert "Grace Hopper" in v2.content  # progressive: v2 saw v1
    await asyncio.sleep(3)  # let both racing summarizers and any redelivery settle
    assert (await pipeline.store.get_stored(ref)) == v2
    assert await pipeline.store.get_version(ref, 3) is None
    expected = {
        f"sum:{ref.account_id}/{ref.agent_id}/{ref.thread_id}@v1",
        f"sum:{ref.account_id}/{ref.agent_id}/{ref.thread_id}@v2",
    }
    deadline = time.monotonic() + 60  # summary.written is published after the store write
    while True:
        events = await summary_events(pipeline, ref)
        written = [i for t, i in events if t == "summary.written"]
        if set(written) >= expected or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    requested = {i for t, i in events if t == "summary.requested"}
    assert len(requested) == 2  # one per crossing
    assert set(written) == expected


async def test_many_threads_race_to_dense_versions(pipeline: Pipeline) -> None:
    refs = [ThreadRef("acc", "racer", f"thr-{uuid.uuid4().hex[:6]}") for _ in range(4)]
    for round_ in range(3):
        batch: list[Message] = []
        for ref in refs:
            batch += await pipeline.journal.append(ref, chatter(50, round_ * 50))
        await publish(pipeline, batch)
        for ref in refs:
            await wait_version(pipeline, ref, round_ + 1)
    await asyncio.sleep(2)
    for ref in refs:
        versions = [await pipeline.store.get_version(ref, v) for v in range(1, 5)]
        assert [v.version for v in versions if v is not None] == [1, 2, 3]
        assert [v.last_message_offset for v in versions if v is not None] == [49, 99, 149]
