"""Coverage rules (streams.coverage): applied offsets as ranges, and the gap a skipped range
leaves below the committed offset, which consumer lag alone reads as 0."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from memstream.streams.coverage import (
    MAX_RANGES,
    PartitionCoverage,
    PartitionKey,
    Ranges,
    holes,
    merge,
    ranges_of,
)


def test_offsets_become_ranges() -> None:
    assert ranges_of([5, 3, 4, 9, 9]) == [(3, 6), (9, 10)]
    assert ranges_of([]) == []


def test_merge_is_idempotent_and_fills_holes() -> None:
    r = merge([], [(0, 10)])
    assert merge(r, [(0, 10)]) == [(0, 10)]  # a redelivered batch changes nothing
    r = merge(r, [(20, 30)])
    assert r == [(0, 10), (20, 30)]
    assert merge(r, [(10, 20)]) == [(0, 30)]  # adjacent ranges join
    assert merge(r, [(5, 25)]) == [(0, 30)]
    assert merge(r, [(7, 7)]) == r  # empty range ignored


def test_merge_keeps_at_most_max_ranges() -> None:
    many = [(2 * i, 2 * i + 1) for i in range(MAX_RANGES + 5)]
    out = merge([], many)
    assert len(out) == MAX_RANGES
    assert out[-1] == many[-1]  # the newest holes are kept


def test_holes_counts_unapplied_offsets_in_a_window() -> None:
    assert holes([(0, 10), (20, 30)], 0, 30) == 10
    assert holes([(0, 10), (20, 30)], 5, 25) == 10
    assert holes([(0, 30)], 0, 30) == 0
    assert holes([], 3, 3) == 0
    assert holes([(0, 10)], 0, 15) == 5


class MemStore:
    def __init__(self) -> None:
        self.rows: dict[PartitionKey, Ranges] = {}
        self.fail = False

    async def load(self, keys: Sequence[PartitionKey]) -> dict[PartitionKey, Ranges]:
        return {k: list(self.rows[k]) for k in keys if k in self.rows}

    async def save(self, ranges: Mapping[PartitionKey, Ranges]) -> None:
        if self.fail:
            raise OSError("down")
        self.rows.update({k: list(v) for k, v in ranges.items()})

    async def load_groups(self, groups: Sequence[str]) -> dict[PartitionKey, Ranges]:
        return {k: v for k, v in self.rows.items() if k[0] in groups}


@pytest.mark.asyncio
async def test_an_offset_reset_past_records_shows_as_a_gap_until_re_read() -> None:
    store = MemStore()
    tp = ("t", 0)
    cov = PartitionCoverage(store, "g")
    await cov.assigned({tp: (None, 0)})  # a new group
    cov.applied({tp: list(range(100))})
    await cov.flush()
    assert cov.gap() == 0

    # someone moves the committed offset from 100 to 150; a new member takes over
    cov = PartitionCoverage(store, "g")
    await cov.assigned({tp: (150, 0)})
    assert cov.gap() == 50
    cov.applied({tp: list(range(150, 200))})
    assert cov.gap() == 50  # applying later records does not hide it

    # repaired by re-reading the range
    cov.applied({tp: list(range(100, 150))})
    assert cov.gap() == 0
    await cov.flush()
    assert store.rows[("g", "t", 0)] == [(0, 200)]


@pytest.mark.asyncio
async def test_seeding_and_restart_rules() -> None:
    store = MemStore()
    a, b = ("t", 0), ("t", 1)
    cov = PartitionCoverage(store, "g")
    # committed before coverage existed: trusted; never committed: starts empty
    await cov.assigned({a: (40, 10), b: (None, 0)})
    assert cov.gap() == 0
    await cov.flush()
    assert store.rows[("g", "t", 0)] == [(10, 40)] and store.rows[("g", "t", 1)] == []

    # a store outage keeps the ranges queued; nothing is lost once it is back
    store.fail = True
    cov.applied({a: [40, 41]})
    with pytest.raises(OSError):
        await cov.flush()
    store.fail = False
    await cov.flush()
    assert store.rows[("g", "t", 0)] == [(10, 42)]

    cov.revoked([a])
    cov.applied({a: [99]})  # no longer held: ignored
    await cov.flush()
    assert store.rows[("g", "t", 0)] == [(10, 42)]
    assert cov.gap() == 0


@pytest.mark.asyncio
async def test_records_applied_before_the_coverage_is_loaded_are_kept() -> None:
    # aiokafka can fetch (and the processor apply) before the rebalance listener has loaded
    # the partition's coverage: those offsets must not be lost (they would read as a gap)
    store = MemStore()
    tp = ("t", 1)
    cov = PartitionCoverage(store, "g")
    cov.applied({tp: list(range(0, 30))})
    await cov.assigned({tp: (None, 0)})
    cov.applied({tp: list(range(30, 50))})
    await cov.flush()
    assert store.rows[("g", "t", 1)] == [(0, 50)] and cov.gap() == 0
