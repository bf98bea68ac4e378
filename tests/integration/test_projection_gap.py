"""Issue 12: a range a projection silently skipped shows as a gap, not as lag 0.

A processor applies the journal topic, stops; its committed offsets are then moved past
records it never applied (what an offset reset, or defect 1 before its fix, does). Lag reads
0 but the gap (``memstream lag``'s column, ``memstream_projection_gap``) names the skipped
records, on real Kafka and Postgres. Re-reading the range (the group sought back) repairs it
and the gap reads 0 again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from memstream.infra.coverage_store import PgCoverage
from memstream.infra.journal import Journal
from memstream.infra.kafka import Bus, ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.schemas.events import message_of
from memstream.schemas.records import NewMessage, ThreadRef
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.journal_relay import JournalRelay
from memstream.streams.lag import consumer_lag, max_gap, max_lag
from memstream.streams.processor import Processor, Received
from memstream.streams.runner import Runner

pytestmark = pytest.mark.asyncio(loop_scope="session")

THREADS = [ThreadRef("acct", "agent", f"g{i}") for i in range(4)]


class SeqRecorder(Processor):
    topic = JOURNAL
    name = "gapcheck"
    batch_max = 100
    batch_within_s = 0.05

    def __init__(self) -> None:
        self.applied: set[int] = set()

    async def handle_batch(self, items: Sequence[Received]) -> None:
        for it in items:
            self.applied.add(message_of(it.envelope).seq)


async def append(journal: Journal, relay: JournalRelay, rounds: int) -> None:
    for r in range(rounds):
        await asyncio.gather(
            *(journal.append(ref, [NewMessage(role="user", content=f"m{r}")]) for ref in THREADS)
        )
    relay.notify()
    assert await relay.wait_caught_up(30)


async def move_offsets(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit ``offsets`` for ``group`` from outside (as an operator's reset would)."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        c.assign(list(offsets))
        await c.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
    finally:
        await c.stop()


async def settled(runner_rec: SeqRecorder, want: int, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while len(runner_rec.applied) < want:
            await asyncio.sleep(0.1)


async def test_a_skipped_range_is_a_gap_until_it_is_re_read(
    journal: Journal,
    kafka_bootstrap: str,
    unique_topics: Topics,
    pg_pool: asyncpg.Pool,
    tmp_path: Path,
) -> None:
    topics = unique_topics
    await ensure_topics(kafka_bootstrap, topics, 2, 1)
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        partitions=2,
        data_dir=tmp_path / "data",
    )
    coverage = PgCoverage(pg_pool)
    bus = Bus(kafka_bootstrap)
    relay = JournalRelay(journal, bus, topics, batch_size=200)
    await relay.start()
    group = f"{topics.prefix.rstrip('.')}-gapcheck"
    groups = {group: [topics.journal]}

    async def run_until(rec: SeqRecorder, want: int) -> Runner:
        metrics = make_metrics()
        runner = Runner(
            settings, {"gapcheck": lambda: rec}, metrics, lag_interval_s=None, coverage=coverage
        )
        await runner.start()
        await runner.wait_ready(60)
        await settled(rec, want)
        await asyncio.sleep(1.5)  # one commit interval: offsets and coverage are written
        return runner

    try:
        await append(journal, relay, 50)  # 200 messages
        first = SeqRecorder()
        runner = await run_until(first, 200)
        await runner.stop()
        rows = await consumer_lag(
            kafka_bootstrap, groups, coverage=await coverage.load_groups([group])
        )
        assert max_lag(rows) == 0 and max_gap(rows) == 0, rows
        before = {TopicPartition(r.topic, r.partition): r.end_offset for r in rows}

        # 40 more records, then the group's offsets are moved past them while it is down
        await append(journal, relay, 10)
        rows = await consumer_lag(kafka_bootstrap, groups)
        skipped = {TopicPartition(r.topic, r.partition): r.end_offset for r in rows}
        assert sum(skipped.values()) - sum(before.values()) == 40
        await move_offsets(kafka_bootstrap, group, skipped)
        await append(journal, relay, 5)  # and 20 after the skip, applied normally

        second = SeqRecorder()
        runner = await run_until(second, 20)
        try:
            rows = await consumer_lag(
                kafka_bootstrap, groups, coverage=await coverage.load_groups([group])
            )
            assert max_lag(rows) == 0, rows  # lag alone says all is well...
            assert sum(r.gap or 0 for r in rows) == 40, rows  # ...the gap says what is missing
            gauge = runner.metrics.projection_gap.labels("gapcheck")._value.get()
            assert gauge == 40
            assert len(second.applied) == 20  # it really never applied the 40
        finally:
            await runner.stop()

        # repair: seek the group back to where it stopped; the re-read fills the holes
        await move_offsets(kafka_bootstrap, group, before)
        third = SeqRecorder()
        runner = await run_until(third, 60)
        try:
            rows = await consumer_lag(
                kafka_bootstrap, groups, coverage=await coverage.load_groups([group])
            )
            assert max_lag(rows) == 0 and max_gap(rows) == 0, rows
            assert runner.metrics.projection_gap.labels("gapcheck")._value.get() == 0
        finally:
            await runner.stop()
    finally:
        await relay.stop()
        await bus.stop()


async def test_lag_reads_coverage_after_the_committed_offsets(
    kafka_bootstrap: str, unique_topics: Topics
) -> None:
    """A processor writes its ranges before it commits. ``memstream lag`` read coverage
    first, so a processor committing between the two reads showed a false gap (seen while a
    rebuilt broker was re-applied, tests/integration/test_fresh_broker.py). Now coverage is
    loaded after the committed offsets: here the processor progresses while it is loaded."""
    from aiokafka import AIOKafkaProducer

    topics = unique_topics
    await ensure_topics(kafka_bootstrap, topics, 1, 1)
    tp = TopicPartition(topics.journal, 0)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(topics.journal, b"x%d" % i, partition=0)
    finally:
        await producer.stop()
    group = f"{topics.prefix.rstrip('.')}-order"
    await move_offsets(kafka_bootstrap, group, {tp: 10})
    key = (group, topics.journal, 0)

    async def progress_then_load() -> dict[tuple[str, str, int], list[tuple[int, int]]]:
        # the processor applies 10..20 (ranges first), then commits 20
        await move_offsets(kafka_bootstrap, group, {tp: 20})
        return {key: [(0, 20)]}

    [row] = await consumer_lag(
        kafka_bootstrap, {group: [topics.journal]}, load_coverage=progress_then_load
    )
    assert row.committed == 10 and row.gap == 0, row  # read before: no false gap
    [row] = await consumer_lag(
        kafka_bootstrap, {group: [topics.journal]}, coverage={key: [(0, 10)]}
    )
    assert row.committed == 20 and row.gap == 10  # the stale coverage the old order read
