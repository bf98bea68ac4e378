"""The transcript's vector index in a process of its own (``memstream up``'s default).

qdrant-edge holds the GIL for the whole of a query, so in the serving process a search's
walk over a large agent stopped the event loop for its length (docs/transcript-search.md,
"what a search stopped"). :class:`VectorIndexProcess` has
:class:`~.vector_index.VectorIndex`'s interface (:class:`~.vector_index.DenseIndex`) and
keeps one in a child process (:class:`~memstream.projections.served.Served`: the same
answers; a dead child fails its calls retryably and the next call starts another; no
orphan). The on-disk filling marker is a file: read and written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from memstream.projections.memory_index.tuning import IndexTuning
from memstream.projections.messages.vector_index import (
    TUNING,
    DenseQuery,
    FilledFromRecord,
    VectorIndex,
    VectorRow,
)
from memstream.projections.served import Served, ShardInfo

CALLS: Final = frozenset(
    {"upsert", "delete_threads", "rewrite", "count", "nearest", "maintain", "build", "info"}
)
"""What the child answers (:class:`_Hosted`'s methods)."""


class _Hosted(VectorIndex):
    """The child's index: :class:`VectorIndex` with answers that cross the pipe."""

    def info(self) -> ShardInfo | None:
        return ShardInfo.of(super().info())


class VectorIndexProcess(FilledFromRecord):
    """A :class:`~.vector_index.VectorIndex` kept by a child process (module docstring); its
    filling marker and fill are :class:`~.vector_index.FilledFromRecord`'s, here."""

    def __init__(self, path: Path, tuning: IndexTuning = TUNING) -> None:
        self.path = path
        self.tuning = tuning
        self._served = Served(_Hosted, (path, tuning), label=f"vector index {path}", calls=CALLS)

    @property
    def closed(self) -> bool:
        return self._served.closed

    @property
    def pid(self) -> int | None:
        """The child's process id (None when none runs): what a test kills."""
        return self._served.pid

    async def upsert(self, rows: Sequence[VectorRow]) -> None:
        """Write ``rows`` (durable on return: the shard's WAL, in the child)."""
        if rows:
            await self._served.call("upsert", list(rows))

    async def delete_threads(self, threads: Sequence[tuple[str, str, str]]) -> int:
        """Delete every point of the ``(account, agent, thread)`` threads (erasure); returns
        how many there were."""
        if not threads:
            return 0
        return int(await self._served.call("delete_threads", list(threads)))

    async def rewrite(self) -> bool:
        """:meth:`VectorIndex.rewrite`, in the child: deleted points leave the files."""
        return bool(await self._served.call("rewrite"))

    async def count(self, account_id: str | None = None, agent_id: str | None = None) -> int:
        return int(await self._served.call("count", account_id, agent_id))

    async def nearest(self, q: DenseQuery) -> dict[tuple[str, int], float]:
        result: dict[tuple[str, int], float] = await self._served.call("nearest", q)
        return result

    async def maintain(self, *, force: bool = False) -> bool:
        """:meth:`VectorIndex.maintain`, in the child (its GIL, not this process's)."""
        return bool(await self._served.call("maintain", force=force))

    async def build(self, *, force: bool = False) -> bool:
        return bool(await self._served.call("build", force=force))

    def info(self) -> ShardInfo | None:
        """Segments, points and indexed vectors (None before the first write); blocks."""
        result: ShardInfo | None = self._served.call_blocking("info")
        return result

    async def close(self) -> None:
        """Close the shard in the child, then let the child go."""
        await self._served.close()
