"""The memory index's qdrant-edge collections in a process of its own (``memstream up``'s
default).

qdrant-edge holds the GIL for the whole of a query (docs/transcript-search.md, "what a
search stopped"): a recall's hybrid query in the serving process stopped every other request
for its length (about 3 ms at 10k entries an agent, more for a larger agent's walk).
:class:`EdgeIndexProcess` is an :class:`~.port.IndexBackend` that keeps an
:class:`~.edge.EdgeIndex` in a child process (:class:`~memstream.projections.served.Served`:
the same answers; a dead child fails its calls retryably and the next call starts another on
the same directory; no orphan).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import PointIdentity, RecallScope
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.projections.memory_index.tuning import TUNING, IndexTuning
from memstream.projections.served import Served, ShardInfo

CALLS: Final = frozenset(
    {
        "ensure_collection",
        "upsert",
        "delete",
        "hybrid_query",
        "versions",
        "count",
        "drop_collection",
        "optimize",
        "build",
        "rewrite",
        "info",
        "pending_rebuilds",
    }
)
"""What the child answers (:class:`_Hosted`'s methods)."""


class _Hosted(EdgeIndex):
    """The child's index: :class:`EdgeIndex` with answers that cross the pipe."""

    def info(self, name: str) -> ShardInfo | None:
        return ShardInfo.of(super().info(name))


class EdgeIndexProcess:
    """An :class:`~.edge.EdgeIndex` kept by a child process (module docstring)."""

    def __init__(self, base_dir: Path | str, tuning: IndexTuning = TUNING) -> None:
        self.base_dir = Path(base_dir)
        self._served = Served(
            _Hosted, (self.base_dir, tuning), label=f"memory index {base_dir}", calls=CALLS
        )

    @property
    def pid(self) -> int | None:
        """The child's process id (None when none runs): what a test kills."""
        return self._served.pid

    async def ensure_collection(self, name: str, dimensions: int) -> None:
        await self._served.call("ensure_collection", name, dimensions)

    async def upsert(self, name: str, points: list[IndexPoint]) -> None:
        await self._served.call("upsert", name, points)

    async def delete(self, name: str, deletes: list[tuple[str, int]]) -> None:
        await self._served.call("delete", name, deletes)

    async def hybrid_query(
        self,
        name: str,
        dense: list[float],
        sparse: SparseVec,
        scope: RecallScope,
        limit: int,
        prefetch_limit: int,
    ) -> list[tuple[PointIdentity, float]]:
        hits: list[tuple[PointIdentity, float]] = await self._served.call(
            "hybrid_query", name, list(dense), sparse, scope, limit, prefetch_limit
        )
        return hits

    async def versions(self, name: str, point_ids: list[str]) -> dict[str, int]:
        found: dict[str, int] = await self._served.call("versions", name, point_ids)
        return found

    async def count(self, name: str) -> int:
        return int(await self._served.call("count", name))

    async def drop_collection(self, name: str) -> None:
        await self._served.call("drop_collection", name)

    def optimize(self, name: str) -> bool:
        """:meth:`EdgeIndex.optimize` in the child (blocks: benches and tests)."""
        return bool(self._served.call_blocking("optimize", name))

    async def build(self, name: str) -> bool:
        """:meth:`EdgeIndex.build`: the graph built beside the shard in use, switched to."""
        return bool(await self._served.call("build", name))

    async def rewrite(self, name: str) -> bool:
        """:meth:`EdgeIndex.rewrite`: the collection rewritten from its live points."""
        return bool(await self._served.call("rewrite", name))

    async def pending_rebuilds(self) -> set[str]:
        """Collections re-tuned when opened whose graph is still the old one."""
        pending: set[str] = await self._served.call("pending_rebuilds")
        return pending

    def info(self, name: str) -> ShardInfo | None:
        """Segments, points and indexed vectors of a collection (None if absent); blocks."""
        info: ShardInfo | None = self._served.call_blocking("info", name)
        return info

    async def close(self) -> None:
        await self._served.close()
