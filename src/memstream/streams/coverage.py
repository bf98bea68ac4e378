"""What each projection has actually applied, so a silently skipped range shows as a gap.

Consumer lag (``memstream lag``) compares a group's *committed* offset with the end of the
partition. A committed offset that moved past records the processor never applied (an offset
reset, a position moved by hand, a bug like issue 12's defect 1) reads as lag 0 while the
projection misses a whole range. Coverage closes that hole: every processor records, per
partition of its input topic, the offsets it **applied** (handled, or durably
dead-lettered) as a short list of half-open ranges ``[lo, hi)``, kept in Postgres.

The **gap** of a partition is the number of offsets in ``[log start, committed)`` that no
range covers: records the relay put on the topic from the journal (or the outbox), that the
group claims to be past, and that the projection never applied. It is exported per
projection as ``memstream_projection_gap{projection}`` (each process the partitions it
holds; sum across processes) and shown by ``memstream lag`` (``gap`` column, ``--json``,
``--max-gap``). A gap is repaired by re-reading the range (seek the group back to it, e.g.
``kafka-consumer-groups --reset-offsets``): re-applied offsets fill the holes and the gap
reads 0 again; or by ``memstream replay`` of the projection.

Rules (the consumer applies them, :class:`PartitionCoverage` holds them):

- ranges are recorded only after the batch's effect is durable, and written to the store
  *before* the offsets are committed, so a crash re-delivers records that may already be
  covered (merging is idempotent), never the other way round;
- a partition the group never committed starts a new coverage (a fresh group, or a broker
  that lost its log and with it the group's offsets, whose topic starts again at 0);
- a partition with a committed offset but no coverage yet (a deployment from before
  coverage existed) is seeded with ``[log start, committed)``: what was committed before is
  trusted, skips from then on are seen;
- if the store is down, ranges stay queued in memory (they merge, so the queue stays
  small) and commits go on; a crash during such an outage can show a false gap for what
  was applied but not yet recorded (re-read the range to clear it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Protocol

__all__ = [
    "MAX_RANGES",
    "CoverageStore",
    "PartitionKey",
    "Ranges",
    "holes",
    "merge",
    "ranges_of",
]

Ranges = list[tuple[int, int]]
"""Sorted, disjoint, non-adjacent half-open offset ranges ``[(lo, hi), ...]``."""

PartitionKey = tuple[str, str, int]
"""(consumer group, topic, partition)."""

#: At most this many ranges are kept per partition (the oldest holes are forgotten first:
#: merged into their neighbours). Holes are rare; this only bounds a pathological case.
MAX_RANGES: Final = 1_000


# --- pure rules ------------------------------------------------------------------------------
def ranges_of(offsets: Iterable[int]) -> Ranges:
    """The offsets as ranges: ``[3, 4, 5, 9]`` -> ``[(3, 6), (9, 10)]``."""
    out: Ranges = []
    for off in sorted(set(offsets)):
        if out and out[-1][1] == off:
            out[-1] = (out[-1][0], off + 1)
        else:
            out.append((off, off + 1))
    return out


def merge(ranges: Sequence[tuple[int, int]], new: Iterable[tuple[int, int]]) -> Ranges:
    """``ranges`` and ``new`` as one sorted list of disjoint, non-adjacent ranges (empty
    ranges dropped). Keeps at most :data:`MAX_RANGES` (the lowest holes filled first)."""
    items = sorted((lo, hi) for lo, hi in (*ranges, *new) if hi > lo)
    out: Ranges = []
    for lo, hi in items:
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    while len(out) > MAX_RANGES:
        (a, _), (_, d) = out[0], out[1]
        out[0:2] = [(a, d)]
    return out


def holes(ranges: Sequence[tuple[int, int]], lo: int, hi: int) -> int:
    """How many offsets of ``[lo, hi)`` no range covers."""
    if hi <= lo:
        return 0
    covered = 0
    for a, b in ranges:
        covered += max(0, min(b, hi) - max(a, lo))
    return (hi - lo) - covered


# --- the store -------------------------------------------------------------------------------
class CoverageStore(Protocol):
    """Where applied ranges live (``infra.coverage_store.PgCoverage``)."""

    async def load(self, keys: Sequence[PartitionKey]) -> dict[PartitionKey, Ranges]:
        """The ranges of each key that has any (a key never recorded is absent)."""
        ...

    async def save(self, ranges: Mapping[PartitionKey, Ranges]) -> None:
        """Replace each key's ranges (the partition's owner holds the whole list)."""
        ...

    async def load_groups(self, groups: Sequence[str]) -> dict[PartitionKey, Ranges]:
        """Every key of ``groups`` (for ``memstream lag``)."""
        ...


class PartitionCoverage:
    """One consumer's coverage of the partitions it holds (see module doc for the rules).

    ``applied`` after a batch is durable, ``flush`` before a commit, ``assigned``/``revoked``
    from the rebalance listener, ``gap()`` for the gauge. Holds no I/O but ``flush`` and
    ``assigned``.
    """

    def __init__(self, store: CoverageStore, group: str) -> None:
        self.store = store
        self.group = group
        self._ranges: dict[tuple[str, int], Ranges] = {}
        self._start: dict[tuple[str, int], int] = {}
        self._upto: dict[tuple[str, int], int] = {}  # next offset this member expects
        self._dirty: set[tuple[str, int]] = set()
        self._changes = 0  # bumped on every change: a flush keeps what changed during it
        self._changed_at: dict[tuple[str, int], int] = {}
        #: Applied before the partition's coverage was loaded (the fetcher can start before
        #: the rebalance listener finishes): merged in when it is.
        self._early: dict[tuple[str, int], Ranges] = {}

    def _touch(self, tp: tuple[str, int]) -> None:
        self._changes += 1
        self._changed_at[tp] = self._changes
        self._dirty.add(tp)

    def _key(self, tp: tuple[str, int]) -> PartitionKey:
        return (self.group, tp[0], tp[1])

    async def assigned(
        self,
        parts: Mapping[tuple[str, int], tuple[int | None, int]],
    ) -> None:
        """``{(topic, partition): (committed or None, log start)}`` of newly held partitions.
        Raises whatever the store raises (the caller logs it; coverage of those partitions
        is then unknown and no gap is reported for them)."""
        loaded = await self.store.load([self._key(tp) for tp in parts])
        for tp, (committed, start) in parts.items():
            self._start[tp] = start
            have = loaded.get(self._key(tp))
            if committed is None:
                ranges: Ranges = []  # a new coverage (new group, or a rebuilt topic)
                self._upto[tp] = start
            elif have is None:
                ranges = [(start, committed)] if committed > start else []
                self._upto[tp] = committed
            else:
                ranges = have
                self._upto[tp] = committed
            early = self._early.pop(tp, [])
            if early:
                self._upto[tp] = max(self._upto[tp], early[-1][1])
            self._ranges[tp] = merge(ranges, early)
            if early or have is None:
                self._touch(tp)

    def revoked(self, tps: Iterable[tuple[str, int]]) -> None:
        for tp in tps:
            self._ranges.pop(tp, None)
            self._start.pop(tp, None)
            self._upto.pop(tp, None)
            self._early.pop(tp, None)
            self._dirty.discard(tp)

    def applied(self, offsets: Mapping[tuple[str, int], Sequence[int]]) -> None:
        """Offsets whose effect is durable, per held partition."""
        for tp, offs in offsets.items():
            if not offs:
                continue
            if tp not in self._ranges:  # its coverage is not loaded yet
                self._early[tp] = merge(self._early.get(tp, []), ranges_of(offs))
                continue
            self._ranges[tp] = merge(self._ranges[tp], ranges_of(offs))
            self._upto[tp] = max(self._upto.get(tp, 0), max(offs) + 1)
            self._touch(tp)

    async def flush(self) -> None:
        """Write changed partitions' ranges. If the store raises, they stay queued."""
        if not self._dirty:
            return
        mark = self._changes
        done = {tp for tp in self._dirty if tp in self._ranges}
        await self.store.save({self._key(tp): list(self._ranges[tp]) for tp in done})
        # what changed while the write was in flight stays queued for the next flush
        self._dirty -= {tp for tp in done if self._changed_at.get(tp, 0) <= mark}

    def gap(self) -> int:
        """Offsets below what this member is past, on the partitions it holds, never applied."""
        return sum(
            holes(r, self._start.get(tp, 0), self._upto.get(tp, 0))
            for tp, r in self._ranges.items()
        )
