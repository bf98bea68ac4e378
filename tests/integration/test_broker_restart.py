"""Defect 1 of issue 12: a broker restart must not make a processor skip records.

The Kafka JVM is killed (SIGKILL) mid-load and restarted on its log dir while appends keep
going, the journal relay keeps publishing and a batch processor keeps consuming. Afterwards
every appended message must have been applied (at least once), and the processor's
committed offsets must never pass a record it did not apply.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from memstream.infra.embedded.kafka import ApacheKafkaServer
from memstream.infra.journal import Journal
from memstream.infra.kafka import Bus, ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.schemas.events import message_of
from memstream.schemas.records import ThreadRef
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.journal_relay import JournalRelay
from memstream.streams.processor import Processor, Received, RetryPolicy
from memstream.streams.runner import ProcessorFactory, Runner
from tests.kafka_helpers import append_load

pytestmark = pytest.mark.asyncio(loop_scope="session")

THREADS = [ThreadRef("acct", "agent", f"r{i}") for i in range(8)]


def factory(processor: Processor) -> ProcessorFactory:
    """A factory the Runner may call any number of times: this one instance, every time."""
    return lambda: processor


class SeqRecorder(Processor):
    """Records the journal seq of every message it applies (a batch processor, like the
    message projector)."""

    topic = JOURNAL

    def __init__(self, name: str, batch_max: int) -> None:
        self.name = name
        self.batch_max = batch_max
        self.batch_within_s = 0.1
        self.applied: set[int] = set()

    async def handle_batch(self, items: Sequence[Received]) -> None:
        for it in items:
            self.applied.add(message_of(it.envelope).seq)


async def load(journal: Journal, relay: JournalRelay, stop: asyncio.Event) -> int:
    return await append_load(journal, relay, THREADS, stop, pause_s=0.005)


async def eventually(check: object, timeout: float) -> bool:
    assert callable(check)
    try:
        async with asyncio.timeout(timeout):
            while not check():
                await asyncio.sleep(0.1)
    except TimeoutError:
        return False
    return True


@pytest.mark.chaos
async def test_a_broker_killed_mid_load_makes_no_processor_skip_records(
    journal: Journal, tmp_path: Path, kafka_broker_kind: str
) -> None:
    if kafka_broker_kind != "kafka":
        pytest.skip("needs Apache Kafka (Tansu keeps no data across a restart)")
    broker = ApacheKafkaServer(tmp_path / "kafka")
    await broker.start()
    port = broker.port
    topics = Topics(f"k{uuid.uuid4().hex[:6]}.")
    await ensure_topics(broker.address, topics, 2, 1)
    settings = Settings(
        kafka_bootstrap=broker.address,
        topic_prefix=topics.prefix,
        partitions=2,
        data_dir=tmp_path / "data",
    )
    bus = Bus(broker.address, request_timeout_s=2)
    relay = JournalRelay(journal, bus, topics, batch_size=200, max_backoff=0.5)
    recorders = {"small": SeqRecorder("small", 50), "big": SeqRecorder("big", 2000)}
    runner = Runner(
        settings,
        {name: factory(r) for name, r in recorders.items()},
        make_metrics(),
        retry=RetryPolicy(attempts=3, first_delay=0.05),
        lag_interval_s=None,
    )
    stop = asyncio.Event()
    loader: asyncio.Task[int] | None = None
    try:
        await relay.start()
        await runner.start()
        await runner.wait_ready(60)
        loader = asyncio.create_task(load(journal, relay, stop))
        await asyncio.sleep(3)
        await broker.kill()  # the JVM dies mid-load; appends go on
        await asyncio.sleep(4)
        broker = ApacheKafkaServer(tmp_path / "kafka", port=port)
        await broker.start()
        await asyncio.sleep(4)
        stop.set()
        appended = await loader
        assert await relay.wait_caught_up(90)
        expected = set(range(1, appended + 1))
        for name, rec in recorders.items():
            done = await eventually(lambda rec=rec: expected <= rec.applied, 90)
            missing = sorted(expected - rec.applied)
            assert done, f"{name} never applied {len(missing)} of {appended}: {missing[:20]}..."
    finally:
        stop.set()
        if loader is not None and not loader.done():
            loader.cancel()
        await runner.stop()
        await relay.stop()
        await bus.stop()
        await broker.stop()
