"""The replay's bulk read (librdkafka) against the suite's broker and Tansu: exactly the
records of the range asked, in log order per partition, and an error (not a hang) when the
range is not there."""

from __future__ import annotations

import pytest

from memstream.errors import RetryableInfraError
from memstream.infra.kafka import ensure_topics, high_watermarks
from memstream.infra.kafka.range_reader import RangeBatch, RangeReader
from memstream.projections.replay_sources import TopicSource
from memstream.schemas.topics import Topics
from tests.kafka_helpers import produce, read_topic

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def read_all(
    reader: RangeReader, start: dict[int, int], end: dict[int, int]
) -> list[RangeBatch]:
    return [b async for b in reader.read(start, end, batch=7)]


async def test_reads_exactly_the_range_in_log_order_per_partition(
    kafka_bootstrap: str, unique_topics: Topics
) -> None:
    await check_range(kafka_bootstrap, unique_topics)


async def test_reads_the_range_from_tansu_too(tansu_bootstrap: str, unique_topics: Topics) -> None:
    await check_range(tansu_bootstrap, unique_topics)


async def check_range(bootstrap: str, unique_topics: Topics) -> None:
    await ensure_topics(bootstrap, unique_topics, 3, 1)
    topic = unique_topics.journal
    await produce(bootstrap, topic, [(f"k{i % 5}", f"v{i}".encode()) for i in range(60)])
    ends = await high_watermarks(bootstrap, topic)
    await produce(bootstrap, topic, [("k0", b"after the end")])  # not in the range
    expected = await _per_partition(bootstrap, topic, ends)
    start = dict.fromkeys(ends, 2)  # a resumed replay: from a checkpoint
    batches = await read_all(RangeReader([bootstrap], topic), start, ends)

    got: dict[int, list[bytes]] = {p: [] for p in ends}
    nexts: dict[int, int] = {}
    # values come in consume order; per partition they must follow the log
    values = [v for b in batches for v in b.values]
    for v in values:
        p = next(p for p, vs in expected.items() if v in vs)
        got[p].append(v)
    for b in batches:
        nexts.update(b.next)
    assert b"after the end" not in values
    assert got == {p: vs[2:] for p, vs in expected.items()}
    assert nexts == ends
    assert all(len(b.values) <= 7 for b in batches)  # the batch size asked


async def _per_partition(
    bootstrap: str, topic: str, ends: dict[int, int]
) -> dict[int, list[bytes]]:
    parts = await read_topic(bootstrap, topic)
    return {p: [v for _, v in recs][: ends[p]] for p, recs in parts.items()}


async def test_a_range_past_the_log_end_raises_instead_of_waiting_for_ever(
    kafka_bootstrap: str, unique_topics: Topics
) -> None:
    await ensure_topics(kafka_bootstrap, unique_topics, 1, 1)
    topic = unique_topics.journal
    await produce(kafka_bootstrap, topic, [("k", b"only")])
    # the replay's source (before: an aiokafka loop that polled for ever)
    source = TopicSource(kafka_bootstrap, topic, timeout=1.0)
    with pytest.raises(RetryableInfraError, match="short of their end"):
        _ = [b async for b in source.read({0: 0}, {0: 5}, 10)]


async def test_an_empty_range_reads_nothing(kafka_bootstrap: str, unique_topics: Topics) -> None:
    assert (
        await read_all(RangeReader([kafka_bootstrap], unique_topics.journal), {0: 3}, {0: 3}) == []
    )
