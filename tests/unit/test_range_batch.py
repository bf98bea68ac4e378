"""The replay's bulk read cut to its range (``infra.kafka.range_reader.range_batch``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memstream.errors import RetryableInfraError
from memstream.infra.kafka.range_reader import range_batch


@dataclass
class Rec:
    """What a confluent-kafka ``Message`` answers, for the pure rule."""

    p: int
    off: int
    v: bytes | None = b"x"
    err: object | None = None

    def error(self) -> object | None:
        return self.err

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.off

    def value(self) -> bytes | None:
        return self.v


def test_records_at_or_past_the_stop_are_left_out_and_finish_their_partition() -> None:
    got = range_batch(
        [Rec(0, 8, b"a"), Rec(1, 3, b"b"), Rec(0, 9, b"c"), Rec(0, 10, b"late"), Rec(1, 4, b"d")],
        {0: 10, 1: 20},
    )
    assert got.values == [b"a", b"b", b"c", b"d"]
    assert got.next == {0: 10, 1: 5}
    assert got.finished == {0}


def test_a_partition_already_finished_or_not_asked_for_gives_nothing() -> None:
    got = range_batch([Rec(2, 0), Rec(0, 1, b"kept")], {0: 5})
    assert got.values == [b"kept"]
    assert got.next == {0: 2}
    assert got.finished == set()


def test_a_first_record_past_the_stop_finishes_the_partition_at_its_stop() -> None:
    # nothing left below the stop (a compacted tail): the range is read all the same
    got = range_batch([Rec(0, 12)], {0: 10})
    assert got.values == []
    assert got.next == {0: 10}
    assert got.finished == {0}


def test_a_tombstone_is_kept_as_empty_bytes() -> None:
    assert range_batch([Rec(0, 0, None)], {0: 5}).values == [b""]


def test_a_record_carrying_a_broker_error_raises_a_retryable_error() -> None:
    with pytest.raises(RetryableInfraError, match="leader not available"):
        range_batch([Rec(0, 0), Rec(0, -1, None, "leader not available")], {0: 5})
