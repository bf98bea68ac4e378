"""The pure part of the batch consumer: how a poll becomes a batch and offsets to commit."""

from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from memstream.infra.settings import Settings
from memstream.streams.consumer import (
    first_gaps,
    flatten_poll,
    group_id,
    lowest_offsets,
    raw_record,
)
from memstream.streams.processor import EventMeta, RawRecord, new_raw_record


def kafka_rec(
    partition: int, offset: int, value: bytes | None = b"v"
) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        "t.journal", partition, offset, 1_700_000_000_123, 0, b"k", value, None, 1, 1, []
    )


def rec(partition: int, offset: int) -> RawRecord:
    """A record as the consumer's fetcher hands it over (``streams.fetched_records``)."""
    return raw_record(kafka_rec(partition, offset))


def test_a_poll_keeps_each_partitions_order_and_commits_after_its_last_record() -> None:
    p0, p1 = TopicPartition("t.journal", 0), TopicPartition("t.journal", 1)
    into: list[RawRecord] = []
    offsets: dict[TopicPartition, int] = {}
    flatten_poll({p0: [rec(0, 5), rec(0, 6)], p1: [rec(1, 9)]}, into, offsets)
    flatten_poll({p0: [rec(0, 7)], p1: []}, into, offsets)  # a top-up poll
    assert [(r.meta.partition, r.meta.offset) for r in into] == [(0, 5), (0, 6), (1, 9), (0, 7)]
    assert offsets == {p0: 8, p1: 10}


def test_a_record_keeps_its_origin_and_gets_seconds() -> None:
    r = raw_record(kafka_rec(3, 42, value=None))
    assert (r.meta.topic, r.meta.partition, r.meta.offset, r.meta.key) == (
        "t.journal",
        3,
        42,
        b"k",
    )
    assert r.meta.timestamp == 1_700_000_000.123
    assert r.value == b""  # a tombstone reaches the dispatcher as bytes (and is dead-lettered)


def test_the_fast_record_constructor_builds_what_the_dataclasses_build() -> None:
    args = ("t.journal", 3, 42, None, None, "counters", b"v")
    fast = new_raw_record(*args)
    assert fast == RawRecord(EventMeta(*args[:6]), b"v")
    assert hash(fast) == hash(RawRecord(EventMeta(*args[:6]), b"v"))


def test_group_names_drop_the_prefix_separator() -> None:
    assert group_id(Settings(topic_prefix="memstream."), "counters") == "memstream-counters"
    assert group_id(Settings(topic_prefix=""), "counters") == "memstream-counters"


def test_a_poll_past_the_expected_offset_is_a_gap() -> None:
    p0, p1, p2 = (TopicPartition("t.journal", i) for i in range(3))
    polled = {p0: [rec(0, 5)], p1: [rec(1, 60), rec(1, 61)], p2: [rec(2, 3)]}
    # p0 continues, p1 jumped 50 records ahead, p2 re-delivers (behind: not a gap), p3 unknown
    gaps = first_gaps(polled, {p0: 5, p1: 10, p2: 7})
    assert gaps == {p1: (10, 60)}
    assert first_gaps({p1: []}, {p1: 10}) == {}


def test_a_dropped_batch_is_sought_back_to_its_lowest_offset_per_partition() -> None:
    into: list[RawRecord] = []
    offsets: dict[TopicPartition, int] = {}
    # a batch whose top-up came after a rebalance re-read p0 from an older committed offset
    flatten_poll({TopicPartition("t.journal", 0): [rec(0, 100), rec(0, 101)]}, into, offsets)
    flatten_poll({TopicPartition("t.journal", 0): [rec(0, 80)]}, into, offsets)
    flatten_poll({TopicPartition("t.journal", 1): [rec(1, 7)]}, into, offsets)
    assert lowest_offsets(into) == {
        TopicPartition("t.journal", 0): 80,
        TopicPartition("t.journal", 1): 7,
    }
