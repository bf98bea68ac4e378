"""The stream runtime against a real broker: fan-out, dead letters, retry, lag.

One Runner (three processors, each its own consumer group) is shared by the
module; each test writes events with its own marker and only looks at those.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from memstream.errors import InvalidRequest, RetryableInfraError
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.metrics import Metrics, make_metrics
from memstream.infra.settings import Settings
from memstream.schemas.events import Envelope, encode, thread_event
from memstream.schemas.records import JSONValue
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.consumer import commit_stamp, group_id
from memstream.streams.dlq import DeadLetter, list_dead_letters, retry_dead_letters
from memstream.streams.lag import LagRow, consumer_lag, max_lag, processor_groups
from memstream.streams.processor import EventMeta, Processor, Received, RetryPolicy
from memstream.streams.runner import ProcessorFactory, Runner
from tests.kafka_helpers import produce

PARTITIONS = 2


def factory(processor: Processor) -> ProcessorFactory:
    """A factory the Runner may call any number of times: this one instance, every time."""
    return lambda: processor


class Recorder(Processor):
    """Records event ids; ``data.fail`` makes it crash ("crash", unless healed) or fail
    transiently ("flaky": RetryableInfraError on the first two attempts)."""

    topic = JOURNAL

    def __init__(self, name: str, batch_max: int = 1) -> None:
        self.name = name
        self.batch_max = batch_max
        self.batch_within_s = 0.2
        self.seen: list[str] = []
        self.metas: dict[str, EventMeta] = {}
        self.healed: set[str] = set()
        self.attempts: dict[str, int] = {}

    def _apply(self, env: Envelope, meta: EventMeta) -> None:
        self.attempts[env.id] = self.attempts.get(env.id, 0) + 1
        fail = env.data.get("fail")
        if fail == "crash" and env.id not in self.healed:
            raise RuntimeError(f"handler crashed on {env.id}")
        if fail == "flaky" and self.attempts[env.id] <= 2:
            raise RetryableInfraError("store briefly away")

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        self._apply(envelope, meta)
        self.seen.append(envelope.id)
        self.metas[envelope.id] = meta

    async def handle_batch(self, items: Sequence[Received]) -> None:
        for it in items:  # all-or-nothing, like a batch insert
            self._apply(it.envelope, it.meta)
        for it in items:
            self.seen.append(it.envelope.id)
            self.metas[it.envelope.id] = it.meta


class Pipeline:
    def __init__(self, bootstrap: str, topics: Topics, runner: Runner, metrics: Metrics) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.runner = runner
        self.metrics = metrics

    def proc(self, name: str) -> Recorder:
        p = self.runner.get(name).processor
        assert isinstance(p, Recorder)
        return p


def event(thread: str, **data: JSONValue) -> Envelope:
    return thread_event(
        "thread.created", "acct", "agent", thread, ts=1, data=dict(data), event_id=uuid.uuid4().hex
    )


async def eventually(check: object, timeout: float = 20.0) -> None:
    assert callable(check)
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def fresh_topics(bootstrap: str, data_dir: Path) -> tuple[Topics, Settings]:
    """Topics of a prefix of their own on the broker, and settings naming them."""
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await ensure_topics(bootstrap, topics, PARTITIONS, 1)
    settings = Settings(
        kafka_bootstrap=bootstrap,
        topic_prefix=topics.prefix,
        partitions=PARTITIONS,
        data_dir=data_dir,
    )
    return topics, settings


@pytest.fixture(scope="module")
async def pipeline(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    topics, settings = await fresh_topics(kafka_bootstrap, tmp_path_factory.mktemp("streams"))
    metrics = make_metrics()
    recorders = {"a": Recorder("a"), "b": Recorder("b"), "batch": Recorder("batch", batch_max=10)}
    runner = Runner(
        settings,
        {name: factory(r) for name, r in recorders.items()},
        metrics,
        retry=RetryPolicy(attempts=3, first_delay=0.01),
        lag_interval_s=None,
    )
    await runner.start()
    try:
        await runner.wait_ready(60)
        yield Pipeline(kafka_bootstrap, topics, runner, metrics)
    finally:
        await runner.stop()


async def test_every_processor_sees_every_event_of_a_shared_topic(pipeline: Pipeline) -> None:
    events = [event(f"fan-{i}") for i in range(20)]
    await produce(
        pipeline.bootstrap,
        pipeline.topics.journal,
        [(e.thread_id or "", encode(e)) for e in events],
    )
    ids = {e.id for e in events}
    for name in ("a", "b", "batch"):
        p = pipeline.proc(name)
        await eventually(lambda p=p: ids <= set(p.seen))
    # Each processor is its own consumer group.
    assert {h.group_id for h in pipeline.runner.hosted} == {
        group_id(pipeline.runner.settings, n) for n in ("a", "b", "batch")
    }


async def test_poison_records_go_to_dlq_with_origin_and_processing_continues(
    pipeline: Pipeline,
) -> None:
    before, after = event("poison-1"), event("poison-1")
    unknown = b'{"v":1,"type":"no.such.type","id":"x","ts":1,"account_id":"a","agent_id":"g"}'
    records = [
        ("poison-1", encode(before)),
        ("poison-1", b"\x00not json"),
        ("poison-1", unknown),
        ("poison-1", encode(after)),
    ]
    offsets = await produce(pipeline.bootstrap, pipeline.topics.journal, records)
    a = pipeline.proc("a")
    await eventually(lambda: after.id in a.seen)
    assert a.seen.index(before.id) < a.seen.index(after.id)
    partition = a.metas[after.id].partition

    async def dead() -> list[tuple[int, str]]:
        letters = await list_dead_letters(pipeline.bootstrap, pipeline.topics, None, processor="a")
        return [
            (d.origin_offset, d.error)
            for d in letters
            if d.origin_topic == pipeline.topics.journal
            and d.origin_partition == partition
            and d.origin_offset in offsets[1:3]
        ]

    found: list[tuple[int, str]] = []
    async with asyncio.timeout(20):
        while len(found) < 2:
            found = await dead()
    assert sorted(o for o, _ in found) == offsets[1:3]
    errors = dict(found)
    assert "DecodeError" in errors[offsets[1]] and "field $" in errors[offsets[1]]
    assert "field type" in errors[offsets[2]]
    assert (
        pipeline.metrics.sample(
            "memstream_processor_errors_total", {"processor": "a", "kind": "decode"}
        )
        or 0
    ) >= 2


async def test_retry_for_one_processor_is_applied_by_that_processor_only(
    pipeline: Pipeline,
) -> None:
    crash, nxt = event("crash-only-a", fail="crash"), event("crash-only-a")
    await produce(
        pipeline.bootstrap,
        pipeline.topics.journal,
        [("crash-only-a", encode(crash)), ("crash-only-a", encode(nxt))],
    )
    a, b = pipeline.proc("a"), pipeline.proc("b")
    await eventually(lambda: nxt.id in a.seen and nxt.id in b.seen)
    letters: list[DeadLetter] = []
    async with asyncio.timeout(20):
        while len({d.processor for d in letters}) < 2:
            letters = [
                d
                for d in await list_dead_letters(pipeline.bootstrap, pipeline.topics, None)
                if crash.id in d.payload
            ]
    for p in (a, b):
        p.healed.add(crash.id)
    report = await retry_dead_letters(pipeline.bootstrap, pipeline.topics, None, processor="a")
    assert [d.processor for d in report.republished if crash.id in d.payload] == ["a"]
    await eventually(lambda: crash.id in a.seen)
    # b consumed the re-published record too (same topic) but skipped it: a marker sent
    # after it reaches b, the retried record never does
    after = event("crash-only-a")
    await produce(pipeline.bootstrap, pipeline.topics.journal, [("crash-only-a", encode(after))])
    await eventually(lambda: after.id in b.seen)
    assert crash.id not in b.seen and a.seen.count(crash.id) == 1


async def test_handler_crash_goes_to_dlq_and_retry_republishes(pipeline: Pipeline) -> None:
    crash, nxt = event("crash-1", fail="crash"), event("crash-1")
    await produce(
        pipeline.bootstrap,
        pipeline.topics.journal,
        [("crash-1", encode(crash)), ("crash-1", encode(nxt))],
    )
    a, b = pipeline.proc("a"), pipeline.proc("b")
    await eventually(lambda: nxt.id in a.seen and nxt.id in b.seen)
    assert crash.id not in a.seen

    letters: list[DeadLetter] = []
    async with asyncio.timeout(20):
        while len(letters) < 2:
            letters = [
                d
                for d in await list_dead_letters(pipeline.bootstrap, pipeline.topics, None)
                if crash.id in d.payload
            ]
    assert {d.processor for d in letters} >= {"a", "b"}
    assert all("RuntimeError: handler crashed" in d.error for d in letters)
    assert all(d.key == "crash-1" for d in letters)

    for p in (a, b):
        p.healed.add(crash.id)
    report = await retry_dead_letters(pipeline.bootstrap, pipeline.topics, [d.id for d in letters])
    # Dead-lettered by two processors, re-published once, seen again by both.
    assert len(report.republished) == 1 and report.missing == []
    await eventually(lambda: crash.id in a.seen and crash.id in b.seen)
    assert a.seen.count(crash.id) == 1

    with pytest.raises(InvalidRequest) as e:
        await retry_dead_letters(pipeline.bootstrap, pipeline.topics, [])
    assert e.value.field == "ids"
    report = await retry_dead_letters(pipeline.bootstrap, pipeline.topics, ["dlq:nope"])
    assert report.missing == ["dlq:nope"] and not report.republished


async def test_retryable_errors_are_retried_not_dead_lettered(pipeline: Pipeline) -> None:
    flaky = event("flaky-1", fail="flaky")
    await produce(pipeline.bootstrap, pipeline.topics.journal, [("flaky-1", encode(flaky))])
    a = pipeline.proc("a")
    await eventually(lambda: flaky.id in a.seen)
    assert a.attempts[flaky.id] == 3
    letters = await list_dead_letters(pipeline.bootstrap, pipeline.topics, None)
    assert not [d for d in letters if flaky.id in d.payload]


async def test_a_failing_batch_dead_letters_only_the_bad_record(pipeline: Pipeline) -> None:
    good = [event("batch-1") for _ in range(5)]
    bad = event("batch-1", fail="crash")
    batch = [*good[:2], bad, *good[2:]]
    await produce(
        pipeline.bootstrap, pipeline.topics.journal, [("batch-1", encode(e)) for e in batch]
    )
    p = pipeline.proc("batch")
    await eventually(lambda: {e.id for e in good} <= set(p.seen))
    assert bad.id not in p.seen
    letters: list[DeadLetter] = []
    async with asyncio.timeout(20):
        while not letters:
            letters = [
                d
                for d in await list_dead_letters(
                    pipeline.bootstrap, pipeline.topics, None, processor="batch"
                )
                if bad.id in d.payload
            ]
    assert len(letters) == 1


async def test_runner_group_lag_reaches_zero_with_true_end_offsets(pipeline: Pipeline) -> None:
    events = [event(f"lag-{i}") for i in range(12)]
    await produce(
        pipeline.bootstrap,
        pipeline.topics.journal,
        [(e.thread_id or "", encode(e)) for e in events],
    )
    a = pipeline.proc("a")
    await eventually(lambda: {e.id for e in events} <= set(a.seen))
    groups = processor_groups(pipeline.runner.settings, {"a": JOURNAL})
    rows: list[LagRow] = []
    async with asyncio.timeout(20):
        while not rows or max_lag(rows) > 0:
            await asyncio.sleep(0.3)
            rows = await consumer_lag(pipeline.bootstrap, groups)
    assert len(rows) == PARTITIONS
    assert all(r.committed == r.end_offset for r in rows)
    # End offsets are the true record counts of the topic.
    consumer = AIOKafkaConsumer(bootstrap_servers=pipeline.bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(pipeline.topics.journal, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        total = 0
        while True:
            got = await consumer.getmany(timeout_ms=500)
            if not got:
                break
            total += sum(len(v) for v in got.values())
    finally:
        await consumer.stop()
    assert sum(r.end_offset for r in rows) == total


async def _lag_matches_known_counts(bootstrap: str, *, keeps_commit_metadata: bool = True) -> None:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await ensure_topics(bootstrap, topics, PARTITIONS, 1)
    # Several records per producer batch: Tansu's ListOffsets is wrong for these.
    await produce(bootstrap, topics.journal, [("k", f"v{i}".encode()) for i in range(7)])
    group = f"{topics.prefix}g"
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        rows = await consumer_lag(bootstrap, {group: [topics.journal]})
        full = [r for r in rows if r.end_offset == 7]
        assert len(full) == 1, rows  # one key: every record on one partition
        assert full[0].committed is None and full[0].lag == 7
        tp = TopicPartition(topics.journal, full[0].partition)
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(3, "")})
        rows = await consumer_lag(bootstrap, {group: [topics.journal]}, last_commit={group: 0.0})
        by_p = {r.partition: r for r in rows}
        assert (by_p[tp.partition].committed, by_p[tp.partition].lag) == (3, 4)
        assert max_lag(rows) == 4
        assert by_p[tp.partition].since_commit_s is not None
        # without the caller's record, "since commit" comes from the commit's metadata,
        # as our consumers write it: readable from any process (memstream lag)
        await consumer.commit({tp: OffsetAndMetadata(4, commit_stamp(time.time() - 5))})
        rows = await consumer_lag(bootstrap, {group: [topics.journal]})
        since = {r.partition: r for r in rows}[tp.partition].since_commit_s
        if keeps_commit_metadata:
            assert since is not None and 4.5 <= since <= 60
        else:  # Tansu drops a commit's metadata: "since commit" stays unknown there
            assert since is None
    finally:
        await consumer.stop()


async def test_lag_matches_known_counts(kafka_bootstrap: str) -> None:
    await _lag_matches_known_counts(kafka_bootstrap)


@pytest.mark.tansu
async def test_lag_matches_known_counts_on_tansu(tansu_bootstrap: str) -> None:
    await _lag_matches_known_counts(tansu_bootstrap, keeps_commit_metadata=False)


async def test_unknown_processor_name_is_refused(pipeline: Pipeline) -> None:
    with pytest.raises(InvalidRequest) as e:
        Runner(
            pipeline.runner.settings, {"a": lambda: Recorder("a")}, make_metrics(), names=["nope"]
        )
    assert e.value.field == "processors"


async def _own_topic(bootstrap: str, tmp: pytest.TempPathFactory) -> tuple[Topics, Settings]:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await ensure_topics(bootstrap, topics, PARTITIONS, 1)
    settings = Settings(
        kafka_bootstrap=bootstrap,
        topic_prefix=topics.prefix,
        partitions=PARTITIONS,
        data_dir=tmp.mktemp("streams-own"),
    )
    return topics, settings


async def test_a_restarted_processor_resumes_after_what_it_handled(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    topics, settings = await _own_topic(kafka_bootstrap, tmp_path_factory)
    first = [event("resume") for _ in range(10)]  # one key: one partition, one order
    await produce(kafka_bootstrap, topics.journal, [("resume", encode(e)) for e in first])
    before = Recorder("r", batch_max=4)
    runner = Runner(settings, {"r": lambda: before}, make_metrics(), lag_interval_s=None)
    await runner.start()
    try:
        await eventually(lambda: {e.id for e in first} <= set(before.seen), 60)
    finally:
        await runner.stop()  # commits what was handled
    assert before.seen == [e.id for e in first]  # in log order, once each

    later = [event("resume") for _ in range(5)]
    await produce(kafka_bootstrap, topics.journal, [("resume", encode(e)) for e in later])
    after = Recorder("r", batch_max=4)
    runner = Runner(settings, {"r": lambda: after}, make_metrics(), lag_interval_s=None)
    await runner.start()
    try:
        await eventually(lambda: {e.id for e in later} <= set(after.seen), 60)
    finally:
        await runner.stop()
    assert after.seen == [e.id for e in later]


async def test_a_second_group_member_takes_partitions_without_loss_or_rehandling(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    topics, settings = await _own_topic(kafka_bootstrap, tmp_path_factory)
    first = [event(f"rb-{i}") for i in range(20)]
    await produce(kafka_bootstrap, topics.journal, [(e.thread_id or "", encode(e)) for e in first])
    one, two = Recorder("r"), Recorder("r")
    runner_one = Runner(settings, {"r": lambda: one}, make_metrics(), lag_interval_s=None)
    runner_two = Runner(settings, {"r": lambda: two}, make_metrics(), lag_interval_s=None)
    await runner_one.start()
    try:
        await eventually(lambda: {e.id for e in first} <= set(one.seen), 60)
        await runner_two.start()
        hosted_one, hosted_two = runner_one.get("r"), runner_two.get("r")

        def split() -> bool:
            a = hosted_one.consumer.assignment()
            b = hosted_two.consumer.assignment()
            return len(a) == 1 and len(b) == 1 and not a & b

        await eventually(split, 60)
        later = [event(f"rb-{i}") for i in range(20, 40)]
        await produce(
            kafka_bootstrap, topics.journal, [(e.thread_id or "", encode(e)) for e in later]
        )
        await eventually(lambda: {e.id for e in later} <= set(one.seen) | set(two.seen), 60)
    finally:
        await runner_two.stop()
        await runner_one.stop()
    # Both members did work after the split, and what the first handled before the
    # rebalance was committed: the second member never handles it again.
    assert set(two.seen) & {e.id for e in later} and set(one.seen) & {e.id for e in later}
    assert not set(two.seen) & {e.id for e in first}
    assert len(one.seen) == len(set(one.seen)) and len(two.seen) == len(set(two.seen))


class Holding(Recorder):
    """Takes its records and never returns from the handler: its group commits nothing."""

    def __init__(self, name: str, topic: str) -> None:
        super().__init__(name)
        self.topic = topic
        self.held = asyncio.Event()

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        self.held.set()
        await asyncio.Event().wait()


async def test_the_lag_gauge_reads_every_hosted_group_in_one_refresh(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The runner's ``memstream_consumer_lag``: a group that drained its topic reads 0 and a
    stuck group on another topic reads what it has not committed, both from one refresh."""
    topics, settings = await fresh_topics(kafka_bootstrap, tmp_path_factory.mktemp("lag-gauge"))
    metrics = make_metrics()
    drained, stuck = Recorder("drained"), Holding("stuck", "summaries")
    runner = Runner(
        settings,
        {"drained": factory(drained), "stuck": factory(stuck)},
        metrics,
        lag_interval_s=0.2,
    )
    await runner.start()
    try:
        await runner.wait_ready(60)
        journal = [event(f"lag-{i}") for i in range(12)]
        summaries = [event(f"lag-{i}") for i in range(7)]
        await produce(
            kafka_bootstrap, topics.journal, [(e.thread_id or "", encode(e)) for e in journal]
        )
        await produce(
            kafka_bootstrap, topics.summaries, [(e.thread_id or "", encode(e)) for e in summaries]
        )
        await eventually(lambda: len(drained.seen) == len(journal))

        def gauge(name: str, topic: str) -> float | None:
            values = [
                metrics.registry.get_sample_value(
                    "memstream_consumer_lag",
                    {"group": runner.get(name).group_id, "topic": topic, "partition": str(p)},
                )
                for p in range(PARTITIONS)
            ]
            return None if None in values else sum(v for v in values if v is not None)

        # a refresh after the drained group's commit reads 0 for it and 7 for the stuck one
        await eventually(
            lambda: gauge("drained", topics.journal) == 0 and gauge("stuck", topics.summaries) == 7
        )
        assert stuck.held.is_set()
        # each group is read on its own topic only
        assert gauge("drained", topics.summaries) is None
        assert gauge("stuck", topics.journal) is None
    finally:
        await runner.stop()
