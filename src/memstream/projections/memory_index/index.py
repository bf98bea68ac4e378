"""The memory index: embeds entries and queries, and drives an :class:`IndexBackend`.

Two users:

- the memory projector calls :meth:`MemoryIndex.apply` with the operations of a batch of
  ``memory`` events (see ``rules.py``): upserts are embedded in one embedder call (through the
  cache), then written; deletes are written as they come. Runs keep event order.
- the recall service calls :meth:`MemoryIndex.query` (its ``MemoryIndexPort``): one hybrid
  query, returning ``((owner, key), fused score)`` best first. Postgres stays the authority: the
  caller re-applies visibility and expiry to the rows it fetches.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from datetime import datetime

from qdrant_edge import Bm25

from memstream.infra.embeddings import Embedder
from memstream.projections.erased import ErasedEntries
from memstream.projections.memory_index.layout import (
    RecallScope,
    collection_name,
    document_text,
    identity_of,
    payload_of,
)
from memstream.projections.memory_index.port import IndexBackend, IndexPoint, SparseVec
from memstream.projections.memory_index.rules import Delete, IndexOp, Upsert, runs
from memstream.schemas.limits import RECALL_MAX_LIMIT
from memstream.schemas.records import MemoryEntry


class MemoryIndex:
    """Hybrid (dense + BM25) index of memory entries, one collection per (account, environment).

    Guarantees: applying the same operations again (redelivery, replay) leaves the same
    points; an operation older than the stored point is a no-op; ``query`` never returns
    entries of another account or agent, another user's private entries, or entries expired
    at ``now``.
    """

    def __init__(
        self,
        backend: IndexBackend,
        embedder: Embedder,
        *,
        environment: str,
        prefetch_limit: int = 100,
    ) -> None:
        self.backend = backend
        self.embedder = embedder
        self.environment = environment
        self._prefetch = prefetch_limit
        self._bm25 = Bm25()
        # erased entry states are never indexed (nor embedded) again, replay included
        self.erased = ErasedEntries()
        self._written_since_optimize: dict[str, int] = defaultdict(int)

    def collection(self, account_id: str) -> str:
        return collection_name(account_id, self.environment)

    def _sparse_doc(self, text: str) -> SparseVec:
        v = self._bm25.embed_document(text)
        return SparseVec(list(v.indices), list(v.values))

    def _sparse_query(self, text: str) -> SparseVec:
        v = self._bm25.embed_query(text)
        return SparseVec(list(v.indices), list(v.values))

    async def apply(self, ops: list[IndexOp]) -> int:
        """Apply operations in order; returns the number of points written or deleted
        (before the version rule, which Qdrant applies)."""
        done = 0
        for run in runs(ops):
            if run and isinstance(run[0], Upsert):
                done += await self._upsert([op for op in run if isinstance(op, Upsert)])
            else:
                done += await self._delete([op for op in run if isinstance(op, Delete)])
        return done

    async def _upsert(self, ups: list[Upsert]) -> int:
        if len(self.erased):
            await self.erased.refresh()
            ups = [u for u in ups if not self.erased.covers(u.identity, u.version)]
            if not ups:
                return 0
        vectors = await self.embedder.embed([document_text(u.entry) for u in ups])
        by_coll: dict[str, list[IndexPoint]] = defaultdict(list)
        for u, dense in zip(ups, vectors, strict=True):
            by_coll[self.collection(u.entry.account_id)].append(
                IndexPoint(
                    point_id=u.point_id,
                    dense=dense,
                    sparse=self._sparse_doc(document_text(u.entry)),
                    payload=payload_of(u.entry),
                    version=u.version,
                )
            )
        for name, points in by_coll.items():
            await self.backend.ensure_collection(name, self.embedder.dimensions)
            await self.backend.upsert(name, points)
            self._written_since_optimize[name] += len(points)
        return len(ups)

    async def maintain(self, min_new_points: int = 1_000) -> list[str]:
        """Build the HNSW graph of collections that took at least ``min_new_points`` writes
        since their last build, or that were re-tuned when opened (their graph predates
        the index's tuning), off the event loop; returns the collections optimized.

        qdrant-edge searches by brute force until ``optimize()`` runs (about 10 ms per query
        at 10k 384-d points, under 1 ms after), and never runs it by itself; a Qdrant server
        has its own optimizer, so this is a no-op there. On qdrant-edge the build runs in a
        child process beside the collection in use (``EdgeIndex.build``: ``optimize()``
        holds the GIL for the whole build, which froze every request of the process for its
        length); queries and writes keep working meanwhile.
        """
        optimize = getattr(self.backend, "optimize", None)
        build = getattr(self.backend, "build", None)  # qdrant-edge: in a child process
        if optimize is None:
            self._written_since_optimize.clear()
            return []
        done = []
        pending_of = getattr(self.backend, "pending_rebuilds", None)  # qdrant-edge's
        pending: set[str] = set(await pending_of()) if pending_of is not None else set()
        for name in pending:
            self._written_since_optimize.setdefault(name, 0)
        for name, count in list(self._written_since_optimize.items()):
            if count < min_new_points and name not in pending:
                continue
            self._written_since_optimize[name] = 0
            if build is not None:
                await build(name)
            else:
                await asyncio.to_thread(optimize, name)
            done.append(name)
        return done

    async def erase(self, tombstones: list[MemoryEntry]) -> tuple[int, int]:
        """Erasure: delete the points of these deleted entries (each with its tombstone
        version, so the version rule holds) and their cached embeddings. Returns (points
        asked to delete, cached vectors dropped)."""
        ops: list[IndexOp] = [Delete(identity_of(e), e.version) for e in tombstones]
        points = await self.apply(ops)
        forget = getattr(self.embedder, "forget", None)
        cached = 0
        if forget is not None and tombstones:
            cached = int(await forget([document_text(e) for e in tombstones]))
        return points, cached

    async def purge(self, account_id: str) -> bool:
        """Take the deleted points of the account's collection off its files (erasure): on
        qdrant-edge a delete only marks a point, whose vector and BM25 terms stay in the
        segment and the WAL, so the collection is rewritten from its live points in a child
        process (``EdgeIndex.rewrite``). A Qdrant server vacuums by itself: a no-op there.
        True if a rewrite ran."""
        rewrite = getattr(self.backend, "rewrite", None)  # qdrant-edge's
        if rewrite is None:
            return False
        return bool(await rewrite(self.collection(account_id)))

    async def _delete(self, dels: list[Delete]) -> int:
        by_coll: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for d in dels:
            by_coll[self.collection(d.identity.account_id)].append((d.point_id, d.version))
        for name, items in by_coll.items():
            await self.backend.delete(name, items)
        return len(dels)

    async def query(
        self,
        account_id: str,
        agent_id: str,
        user_id: str | None,
        query_text: str,
        limit: int,
        category: str | None,
        now: datetime,
    ) -> list[tuple[tuple[str, str], float]]:
        """Ranked ``((owner, key), relevance)`` of entries visible to the caller, best first;
        the relevance is the DBSF-fused score over the dense and sparse lists, in [0, 1].

        Implements ``memstream.agents_ctx.memory.ports.MemoryIndexPort``: the account and
        agent are the caller's, so ``(owner, key)`` completes the entry identity.
        """
        if not query_text.strip():
            return []
        limit = max(1, min(limit, RECALL_MAX_LIMIT))
        (dense,) = await self.embedder.embed_query([query_text])
        scope = RecallScope(
            account_id=account_id,
            agent_id=agent_id,
            user_id=user_id,
            now_epoch=now.timestamp(),
            category=category,
        )
        sparse = self._sparse_query(query_text)
        hits = await self.backend.hybrid_query(
            self.collection(account_id),
            dense,
            sparse,
            scope,
            limit,
            max(self._prefetch, limit),
        )
        lists = 2 if sparse.indices else 1
        return [
            ((ident.owner, ident.key), min(1.0, max(0.0, score / lists))) for ident, score in hits
        ]

    async def close(self) -> None:
        await self.backend.close()
