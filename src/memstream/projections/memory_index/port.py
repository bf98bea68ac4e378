"""The interface both index adapters implement (qdrant-edge and qdrant-client).

Adapters receive vectors already computed (dense from the embedder, sparse from
``qdrant_edge.Bm25``) so both paths index byte-identical data. Every write enforces the
version rule of :func:`~memstream.projections.memory_index.rules.should_apply` inside Qdrant
(a filter on the write), so concurrent or replayed writers cannot move a point backwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from memstream.projections.memory_index.layout import PointIdentity, RecallScope
from memstream.schemas.records import JSONObject

FUSION: Final = "dbsf"
"""Dense and sparse results are fused by distribution-based score fusion (Qdrant's DBSF):
each list's scores are normalised by that list's mean +/- 3 standard deviations and the
normalised scores are summed. Unlike reciprocal-rank fusion (whose fused scores differ by
~2 % between neighbouring ranks whatever the scores were), a clearly better match keeps a
clearly higher score, so the importance boost only decides near-ties. The index divides
the sum by the number of lists, so recall ranks a relevance in [0, 1]."""


@dataclass(frozen=True, slots=True)
class SparseVec:
    indices: list[int]
    values: list[float]


@dataclass(frozen=True, slots=True)
class IndexPoint:
    """One point to write: deterministic id, both vectors, payload (with ``version``)."""

    point_id: str
    dense: list[float]
    sparse: SparseVec
    payload: JSONObject
    version: int


class IndexBackend(Protocol):
    """A Qdrant deployment holding memory collections. All methods are coroutine-safe."""

    async def ensure_collection(self, name: str, dimensions: int) -> None:
        """Create the collection (dense ``dimensions`` cosine + sparse BM25 with IDF, payload
        indexes) if absent. Raises PermanentInfraError if it exists with another size."""
        ...

    async def upsert(self, name: str, points: list[IndexPoint]) -> None:
        """Insert each point, or replace the stored one only if its version is lower."""
        ...

    async def delete(self, name: str, deletes: list[tuple[str, int]]) -> None:
        """Delete each ``(point_id, version)`` whose stored version is not higher."""
        ...

    async def hybrid_query(
        self,
        name: str,
        dense: list[float],
        sparse: SparseVec,
        scope: RecallScope,
        limit: int,
        prefetch_limit: int,
    ) -> list[tuple[PointIdentity, float]]:
        """Dense and sparse prefetches fused with RRF in Qdrant, filtered by ``scope``.
        A missing collection yields ``[]``."""
        ...

    async def versions(self, name: str, point_ids: list[str]) -> dict[str, int]:
        """Stored version per existing point id (absent ids are left out)."""
        ...

    async def count(self, name: str) -> int: ...

    async def drop_collection(self, name: str) -> None: ...

    async def close(self) -> None: ...
