"""The pure step of the memory projector: one ``memory.*`` event → one index operation.

- ``memory.stored``, ``memory.replaced``, ``memory.decayed`` → :class:`Upsert` of the entry.
- ``memory.forgotten``, ``memory.expired`` → :class:`Delete` of the entry's point.
- ``memory.recalled`` → nothing: recall counters live in Postgres; the index's ranking does
  not use them, and writing them would re-embed nothing but still cost a write per recall.
- any other event type → nothing.

Both operations carry the entry's ``version``; adapters apply them only if the stored point
is older (:func:`should_apply`), so a redelivered or replayed event is a no-op.
A malformed event raises :class:`~memstream.schemas.events.DecodeError` (to the DLQ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from memstream.projections.memory_index.layout import (
    PointIdentity,
    identity_of,
    point_id,
)
from memstream.schemas.events import Envelope, entry_of
from memstream.schemas.records import MemoryEntry

UPSERT_TYPES: Final = frozenset({"memory.stored", "memory.replaced", "memory.decayed"})
DELETE_TYPES: Final = frozenset({"memory.forgotten", "memory.expired"})


@dataclass(frozen=True, slots=True)
class Upsert:
    entry: MemoryEntry

    @property
    def identity(self) -> PointIdentity:
        return identity_of(self.entry)

    @property
    def point_id(self) -> str:
        return point_id(self.identity)

    @property
    def version(self) -> int:
        return self.entry.version


@dataclass(frozen=True, slots=True)
class Delete:
    identity: PointIdentity
    version: int

    @property
    def point_id(self) -> str:
        return point_id(self.identity)


IndexOp = Upsert | Delete


def op_for_event(env: Envelope) -> IndexOp | None:
    """The index operation an event asks for, or None when it asks for none."""
    if env.type in UPSERT_TYPES:
        return Upsert(entry_of(env))
    if env.type in DELETE_TYPES:
        entry = entry_of(env)
        return Delete(identity_of(entry), entry.version)
    return None


def should_apply(op: IndexOp, stored_version: int | None) -> bool:
    """The version rule both adapters enforce inside Qdrant (as a filter on the write).

    An upsert applies when no point exists or the stored one is strictly older: an equal
    version is the same entry state (a redelivery), so skipping it is idempotent. A delete
    applies when the stored point is not newer than the delete.
    """
    if stored_version is None:
        return isinstance(op, Upsert)
    if isinstance(op, Upsert):
        return stored_version < op.version
    return stored_version <= op.version


def runs(ops: list[IndexOp]) -> list[list[Upsert] | list[Delete]]:
    """Split ops, in event order, into runs of consecutive upserts or deletes.

    Inside an upsert run, only the highest version per point is kept (the last on ties);
    the run is one write. Runs are never merged across a delete, so the outcome equals
    applying every event one by one, even if a key is forgotten and stored again.
    """
    out: list[list[Upsert] | list[Delete]] = []
    ups: dict[str, Upsert] = {}
    dels: list[Delete] = []
    for op in ops:
        if isinstance(op, Upsert):
            if dels:
                out.append(dels)
                dels = []
            prev = ups.get(op.point_id)
            if prev is None or op.version >= prev.version:
                ups[op.point_id] = op
        else:
            if ups:
                out.append(list(ups.values()))
                ups = {}
            dels.append(op)
    if ups:
        out.append(list(ups.values()))
    if dels:
        out.append(dels)
    return out
