"""qdrant-edge adapter: the embedded default. Qdrant's engine in this process.

Each collection is one ``EdgeShard`` in its own directory ``<base_dir>/<collection>``, opened
on first use and kept open. One process per base directory (the shard is not shared across
processes; run a Qdrant server for several projector processes). Every shard call blocks,
so it runs in a worker thread. Writes go through the shard's WAL: durable on return.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any, Final

from qdrant_edge import (
    AcornSearchParams,
    CountRequest,
    EdgeConfig,
    EdgeShard,
    FieldCondition,
    Filter,
    FloatIndexParams,
    Fusion,
    HasIdCondition,
    IntegerIndexParams,
    IsEmptyCondition,
    KeywordIndexParams,
    MatchValue,
    Point,
    Prefetch,
    Query,
    QueryRequest,
    RangeFloat,
    SearchParams,
    SparseVector,
    UpdateOperation,
)

from memstream.errors import PermanentInfraError
from memstream.projections.edge_slot import ShardSlot, shard_config
from memstream.projections.memory_index.layout import (
    DENSE,
    FLOAT_FIELDS,
    INTEGER_FIELDS,
    KEYWORD_FIELDS,
    SPARSE,
    PointIdentity,
    RecallScope,
    identity_from_payload,
)
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.projections.memory_index.tuning import TUNING, IndexTuning

_TEMPLATE_PREFIX = ".template-"
"""Folder prefix of the empty collections new ones are copied from (see ``_template``)."""
TEMPLATE_LAYOUT: Final = 1
"""Raise when what ``edge_config`` or ``field_indexes`` make changes in a way the tuning's
repr does not show: older templates are then left unused."""
_ENGINE_VERSION: Final = importlib.metadata.version("qdrant-edge-py")

_TRASH_PREFIX = ".dropped-"
"""Directory prefix of dropped collections awaiting deletion (collection names start with
``mem-``, see ``layout.collection_name``)."""


def scope_filter(scope: RecallScope) -> Filter:
    """account AND agent AND (shared OR private owned by the user) AND not expired [AND category]."""
    visible: list[Any] = [Filter(must=[FieldCondition("visibility", match=MatchValue("shared"))])]
    if scope.user_id:
        visible.append(
            Filter(
                must=[
                    FieldCondition("visibility", match=MatchValue("private")),
                    FieldCondition("owner", match=MatchValue(scope.user_id)),
                ]
            )
        )
    must: list[Any] = [
        FieldCondition("account_id", match=MatchValue(scope.account_id)),
        FieldCondition("agent_id", match=MatchValue(scope.agent_id)),
        Filter(should=visible),
        Filter(
            should=[
                IsEmptyCondition("expires_at"),
                FieldCondition("expires_at", range=RangeFloat(gt=scope.now_epoch)),
            ]
        ),
    ]
    if scope.category:
        must.append(FieldCondition("category", match=MatchValue(scope.category)))
    return Filter(must=must)


def hybrid_request(
    dense: list[float],
    sparse: SparseVec,
    scope: RecallScope,
    limit: int,
    prefetch_limit: int,
    *,
    hnsw_ef: int | None = None,
    acorn_max_selectivity: float | None = None,
    exact: bool = False,
    exact_dense: bool = False,
) -> QueryRequest:
    """The recall query: dense and BM25 prefetches under the scope filter, fused by DBSF.

    ``hnsw_ef`` sets the dense walk's candidate list, ``acorn_max_selectivity`` when it
    uses ACORN (see ``IndexTuning``); ``exact_dense`` scores every filtered point's dense
    vector instead of walking the graph (the BM25 side is exact either way: an inverted
    index); ``exact`` also scans the sparse vectors (the reference the bench and tests
    compare the approximate search with).
    """
    flt = scope_filter(scope)
    acorn = (
        AcornSearchParams(enable=True, max_selectivity=acorn_max_selectivity)
        if acorn_max_selectivity is not None
        else None
    )
    params = (
        SearchParams(exact=True)
        if exact or exact_dense
        else SearchParams(hnsw_ef=hnsw_ef, acorn=acorn)
    )
    prefetches = [
        Prefetch(
            limit=prefetch_limit,
            query=Query.Nearest(dense, using=DENSE),
            filter=flt,
            params=params,
        )
    ]
    if sparse.indices:
        prefetches.append(
            Prefetch(
                limit=prefetch_limit,
                query=Query.Nearest(SparseVector(sparse.indices, sparse.values), using=SPARSE),
                filter=flt,
                params=SearchParams(exact=True) if exact else None,
            )
        )
    return QueryRequest(
        limit=limit,
        prefetches=prefetches,
        query=Fusion.Dbsf(),  # type: ignore[arg-type]  # stub lists Fusion, not Dbsf
        filter=flt,
        with_payload=True,
    )


def edge_config(dimensions: int, tuning: IndexTuning) -> EdgeConfig:
    """A collection's configuration: named dense (cosine) and BM25 (IDF) vectors, and the
    HNSW graph and indexing threshold of ``tuning``."""
    return shard_config(dimensions, tuning, dense=DENSE, sparse=SPARSE)


def field_indexes(tuning: IndexTuning) -> list[UpdateOperation]:
    """One payload index per filter field (keyword, float, integer; ``is_tenant`` on the
    tenant fields; per-value graphs only for ``tuning``'s graph fields). Created before any
    point, so the optimizer builds the per-value graphs a filtered search walks."""
    ops = []
    for f in KEYWORD_FIELDS:
        params: Any = KeywordIndexParams(
            is_tenant=True if f in tuning.tenant_fields else None,
            enable_hnsw=tuning.builds_graph(f),
        )
        ops.append(UpdateOperation.create_field_index(f, params))
    for f in FLOAT_FIELDS:
        ops.append(
            UpdateOperation.create_field_index(
                f, FloatIndexParams(enable_hnsw=tuning.builds_graph(f))
            )
        )
    for f in INTEGER_FIELDS:
        ops.append(
            UpdateOperation.create_field_index(
                f, IntegerIndexParams(lookup=True, range=True, enable_hnsw=tuning.builds_graph(f))
            )
        )
    return ops


class EdgeIndex:
    """:class:`~memstream.projections.memory_index.port.IndexBackend` on qdrant-edge."""

    def __init__(self, base_dir: Path | str, tuning: IndexTuning = TUNING) -> None:
        self._base = Path(base_dir)
        self.tuning = tuning
        # collections re-tuned on open whose HNSW graph is still the old one
        self.pending_rebuild: set[str] = set()
        self._slots: dict[str, ShardSlot] = {}
        self._dims: dict[str, int] = {}
        self._open_lock = threading.Lock()
        self._sweepers: list[threading.Thread] = []
        if self._base.is_dir():  # dropped collections a crash left behind
            self._sweep_later(sorted(self._base.glob(f"{_TRASH_PREFIX}*")))

    @property
    def base_dir(self) -> Path:
        """The folder holding a folder per collection."""
        return self._base

    # --- shards ----------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self._base / name

    def _open(self, name: str, dimensions: int | None) -> EdgeShard | None:
        with self._open_lock:
            slot = self._slots.get(name)
            shard = slot.get() if slot is not None else None
            if shard is not None:
                if dimensions is not None and self._dims.get(name) != dimensions:
                    raise PermanentInfraError(
                        f"collection {name} has {self._dims.get(name)}-d vectors, "
                        f"embedder gives {dimensions}: rebuild the index (memstream replay)"
                    )
                return shard
            slot = ShardSlot(self._path(name))
            shard = slot.get()
            if shard is not None:
                cfg_size = self._stored_size(shard) or dimensions
                if cfg_size is not None and not self._tuned(shard):
                    shard = self._retune(slot, cfg_size)
                    self.pending_rebuild.add(name)
            elif dimensions is None:
                return None
            else:
                shard = slot.create(
                    edge_config(dimensions, self.tuning),
                    field_indexes(self.tuning),
                    template=self._template(dimensions),
                )
                cfg_size = dimensions
            if dimensions is not None and cfg_size is not None and cfg_size != dimensions:
                slot.close()
                raise PermanentInfraError(
                    f"collection {name} has {cfg_size}-d vectors, embedder gives {dimensions}: "
                    "rebuild the index (memstream replay)"
                )
            self._slots[name] = slot
            if cfg_size is not None:
                self._dims[name] = cfg_size
            return shard

    def _template(self, dimensions: int) -> Path:
        """Where an empty collection of ``dimensions`` with this tuning is kept, to be copied
        for the next new collection (``ShardSlot.create``): a copy is ~2x faster than a
        create and its nine payload indexes (0.06 against 0.12 s quiet), which every new
        account and every account of a replay pays. Keyed by all a new shard is made of:
        the dimensions, the tuning, this module's layout and the engine's version."""
        made_of = f"{TEMPLATE_LAYOUT}|{dimensions}|{self.tuning!r}|{_ENGINE_VERSION}"
        return self._base / f"{_TEMPLATE_PREFIX}{hashlib.sha256(made_of.encode()).hexdigest()[:16]}"

    def _slot(self, name: str, dimensions: int | None) -> ShardSlot | None:
        """The collection's slot, its shard opened (or created with ``dimensions``)."""
        if self._open(name, dimensions) is None:
            return None
        return self._slots[name]

    def _tuned(self, shard: EdgeShard) -> bool:
        """Whether a stored collection has this tuning's payload indexes (the marker: the
        ``is_tenant`` flag of ``agent_id``)."""
        info = shard.info().payload_schema.get("agent_id")
        tenant = bool(getattr(info.params, "is_tenant", None)) if info is not None else False
        return tenant == ("agent_id" in self.tuning.tenant_fields)

    def _retune(self, slot: ShardSlot, size: int) -> EdgeShard:
        """Bring a collection built with another tuning to this one: payload indexes
        re-created, HNSW configuration rewritten (and stored: a build's child reads it). The
        graph itself is rebuilt by the next build (``MemoryIndex.maintain`` runs it for
        ``pending_rebuild``)."""
        for op in field_indexes(self.tuning):
            slot.write(lambda sh, op=op: sh.update(op))  # type: ignore[misc]
        return slot.reload(edge_config(size, self.tuning))

    @staticmethod
    def _stored_size(shard: EdgeShard) -> int | None:
        # The persisted config is not exposed; read one vector's length when there is one.
        records, _ = shard.scroll(_scroll(limit=1, with_vector=[DENSE]))
        for r in records:
            vec = r.vector
            dense = vec.get(DENSE) if isinstance(vec, dict) else None
            if isinstance(dense, list):
                return len(dense)
        return None

    async def ensure_collection(self, name: str, dimensions: int) -> None:
        await asyncio.to_thread(self._open, name, dimensions)

    # --- writes ----------------------------------------------------------------------------
    def _upsert_blocking(self, name: str, points: list[IndexPoint]) -> None:
        slot = self._slot(name, len(points[0].dense))
        assert slot is not None
        by_version: dict[int, list[IndexPoint]] = {}
        for p in points:
            by_version.setdefault(p.version, []).append(p)
        for version, group in by_version.items():
            op = UpdateOperation.upsert_points(
                [
                    Point(
                        p.point_id,
                        {
                            DENSE: p.dense,
                            SPARSE: SparseVector(p.sparse.indices, p.sparse.values),
                        },
                        p.payload,
                    )
                    for p in group
                ],
                # Applied to an existing point only if it matches: stored version older.
                condition=Filter(
                    must=[FieldCondition("version", range=RangeFloat(lt=float(version)))]
                ),
            )
            slot.write(lambda sh, op=op: sh.update(op))  # type: ignore[misc]

    async def upsert(self, name: str, points: list[IndexPoint]) -> None:
        if points:
            await asyncio.to_thread(self._upsert_blocking, name, points)

    def _delete_blocking(self, name: str, deletes: list[tuple[str, int]]) -> None:
        slot = self._slot(name, None)
        if slot is None:
            return
        for pid, version in deletes:
            op = UpdateOperation.delete_points_by_filter(
                Filter(
                    must=[
                        HasIdCondition({pid}),
                        FieldCondition("version", range=RangeFloat(lte=float(version))),
                    ]
                )
            )
            slot.write(lambda sh, op=op: sh.update(op))  # type: ignore[misc]

    async def delete(self, name: str, deletes: list[tuple[str, int]]) -> None:
        if deletes:
            await asyncio.to_thread(self._delete_blocking, name, deletes)

    # --- reads -----------------------------------------------------------------------------
    def query_blocking(
        self,
        name: str,
        dense: list[float],
        sparse: SparseVec,
        scope: RecallScope,
        limit: int,
        prefetch_limit: int,
        *,
        exact: bool = False,
        exact_dense: bool | None = None,
    ) -> list[tuple[PointIdentity, float]]:
        """The hybrid query, in the calling thread. ``exact`` scores every point the filter
        lets through instead of walking the HNSW graph: the reference the approximate search
        is measured against (bench/recall_scale.py, tests). ``exact_dense`` (``None``: the
        tuning decides by the agent's size) scores the dense side exactly."""
        shard = self._open(name, None)
        if shard is None:
            return []
        if exact_dense is None:
            exact_dense = self.tuning.exact_scan_kb is not None and self.tuning.scans_exactly(
                self._agent_points(shard, scope.agent_id), len(dense)
            )
        hits = shard.query(
            hybrid_request(
                dense,
                sparse,
                scope,
                limit,
                prefetch_limit,
                hnsw_ef=self.tuning.hnsw_ef,
                acorn_max_selectivity=self.tuning.acorn_max_selectivity,
                exact=exact,
                exact_dense=bool(exact_dense),
            )
        )
        return [(identity_from_payload(h.payload or {}), float(h.score)) for h in hits]

    @staticmethod
    def _agent_points(shard: EdgeShard, agent_id: str) -> int:
        """The agent's point count, estimated from the ``agent_id`` payload index (no point
        is read): what decides an exact scan (``IndexTuning.scans_exactly``)."""
        flt = Filter(must=[FieldCondition("agent_id", match=MatchValue(agent_id))])
        return int(shard.count(CountRequest(exact=False, filter=flt)))

    async def hybrid_query(
        self,
        name: str,
        dense: list[float],
        sparse: SparseVec,
        scope: RecallScope,
        limit: int,
        prefetch_limit: int,
    ) -> list[tuple[PointIdentity, float]]:
        return await asyncio.to_thread(
            self.query_blocking, name, dense, sparse, scope, limit, prefetch_limit
        )

    def _versions_blocking(self, name: str, point_ids: list[str]) -> dict[str, int]:
        shard = self._open(name, None)
        if shard is None or not point_ids:
            return {}
        recs = shard.retrieve(list(point_ids), True, False)
        return {str(r.id): int((r.payload or {}).get("version", 0)) for r in recs}

    async def versions(self, name: str, point_ids: list[str]) -> dict[str, int]:
        return await asyncio.to_thread(self._versions_blocking, name, point_ids)

    def _count_blocking(self, name: str) -> int:
        shard = self._open(name, None)
        return 0 if shard is None else int(shard.count(CountRequest(exact=True)))

    async def count(self, name: str) -> int:
        return await asyncio.to_thread(self._count_blocking, name)

    def _drop_blocking(self, name: str) -> None:
        with self._open_lock:
            slot = self._slots.pop(name, None)
            self._dims.pop(name, None)
            if slot is not None:
                slot.close()
            path = self._path(name)
            if not path.exists():
                return
            # gone at once (an atomic rename), deleted in the background: removing a shard's
            # files takes ~0.5 s each, which a replay's hand-over should not wait for
            trash = self._base / f"{_TRASH_PREFIX}{uuid.uuid4().hex}"
            path.rename(trash)
        self._sweep_later([trash])

    def _sweep_later(self, dirs: list[Path]) -> None:
        if not dirs:
            return
        t = threading.Thread(target=_remove_all, args=(dirs,), name="edge-drop", daemon=True)
        t.start()
        self._sweepers = [x for x in self._sweepers if x.is_alive()] + [t]

    async def drop_collection(self, name: str) -> None:
        """The collection is gone when this returns (its directory renamed away); its files
        are deleted by a background thread (``close`` waits for it; left-overs of a crash
        are deleted when the next ``EdgeIndex`` opens the directory)."""
        await asyncio.to_thread(self._drop_blocking, name)

    async def pending_rebuilds(self) -> set[str]:
        """Collections re-tuned when opened whose graph is still the old one (a copy of
        :attr:`pending_rebuild`): what ``MemoryIndex.maintain`` rebuilds."""
        return set(self.pending_rebuild)

    def optimize(self, name: str) -> bool:
        """Build HNSW for a collection in this process (blocking, holding the GIL throughout:
        every thread of the process waits): for benches and tests. A serving process calls
        :meth:`build`. True if segments were rebuilt."""
        slot = self._slot(name, None)
        built = slot.optimize_here() if slot is not None else False
        self.pending_rebuild.discard(name)
        return built

    async def build(self, name: str) -> bool:
        """Build HNSW for a collection in a child process, beside the shard in use, and
        switch to it (:meth:`ShardSlot.build`): searches and writes go on meanwhile. True
        if it switched."""
        slot = await asyncio.to_thread(self._slot, name, None)
        built = await slot.build() if slot is not None else False
        self.pending_rebuild.discard(name)
        return built

    async def rewrite(self, name: str) -> bool:
        """Rewrite a collection into a fresh shard of its live points, graphs built, in a
        child process (:meth:`ShardSlot.rewrite`): an erasure's deleted points leave the
        files. True if it switched."""
        slot = await asyncio.to_thread(self._slot, name, None)
        done = await slot.rewrite() if slot is not None else False
        if done:
            self.pending_rebuild.discard(name)
        return done

    def info(self, name: str) -> Any:
        """Segments, points, indexed vectors and payload indexes of a collection (``None``
        if it does not exist): how a bench or test checks that HNSW was really built."""
        shard = self._open(name, None)
        return None if shard is None else shard.info()

    def _close_blocking(self) -> None:
        with self._open_lock:
            for slot in self._slots.values():
                slot.close()
            self._slots.clear()
            self._dims.clear()
        for t in self._sweepers:
            t.join()
        self._sweepers.clear()

    async def close(self) -> None:
        await asyncio.to_thread(self._close_blocking)


def _remove_all(dirs: list[Path]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _scroll(*, limit: int, with_vector: list[str]) -> Any:
    from qdrant_edge import ScrollRequest

    return ScrollRequest(limit=limit, with_payload=False, with_vector=with_vector)
