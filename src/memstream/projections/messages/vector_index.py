"""The transcript's vector index: the dense side of search in qdrant-edge, beside chdb.

ClickHouse stays the record of every message's vector (``message_vectors``: what a replay
carries over, what a ClickHouse server deployment scans). With embedded chdb, every vector
is also a point of a qdrant-edge shard in ``<root>/<database>/<model>`` (one per generation
and embedding model), keyed by the message's key, with its tenancy ids as payload. A search
asks the shard for the :data:`~.sql.DENSE_WINDOW` nearest visible messages and for the
similarity of BM25's candidates, instead of scanning every vector of the agent in SQL
(measured: ClickHouse's exact scan cost ~1.1-1.6 µs a vector, 1,096 ms at 1M; the shard's
exact scan ~0.15-0.2 µs: docs/transcript-search.md, "Dense side: the vector index").

Guarantees:

- **Exact where a scan is cheap, measured where it is not.** An agent of at most
  ``TUNING.exact_scan_kb`` of vectors (100,000 at 384-d) is scored exactly (qdrant-edge's
  SIMD scan of the agent's points, found through the ``agent_id`` payload index): the same
  messages and similarities as the SQL scan (tested). A larger agent walks its own HNSW
  graph (``m = 0``, ``payload_m`` on ``agent_id``) with every filter inside the walk; its
  quality against the exact scan at 100k and 1M is measured by ``bench/transcript_vectors.py``.
  Points not in a graph yet are scanned.
- **Graphs are built in a child process** (:meth:`VectorIndex.build`, behind the vector
  loop, once :data:`OPTIMIZE_AFTER` points are in none; :mod:`memstream.projections.edge_slot`):
  qdrant-edge's ``optimize()`` holds the GIL for the whole build, which in the serving
  process would freeze every request for minutes at 1M. The child builds a copy; searches
  and writes go on with the shard in use, and the copy takes over with the writes made
  meanwhile applied to it.
- **Idempotent writes.** A point's id is derived from the message's key, so a redelivered
  or re-embedded vector overwrites itself. The vector loop upserts here *before* it inserts
  into ``message_vectors``: a crash between the two leaves a point whose row the next step
  embeds and writes again, never a row without its point.
- **Filled from the record.** A shard missing, interrupted while filling (a marker file),
  or holding fewer points than ``message_vectors`` has vectors of its model is filled from
  ClickHouse at start (``MessageStore.ensure_schema``) and by a replay's seal (the switch
  then adds only the vectors that came since, ``messages.carry``); searches scan ClickHouse
  meanwhile (:attr:`VectorIndex.ready`), never an incomplete shard.
- **Privacy in the query.** The account, agent and thread scope are filter conditions of the
  scan itself. So are the caller's hidden threads (other users' private threads,
  ``MessageStore._hidden_threads``) in an exact scan; a walk over an agent with at most
  :data:`POST_FILTER_MAX_HIDDEN` of its points hidden asks for more than ``k`` without
  that condition and drops the hidden ones (:meth:`VectorIndex.nearest_blocking`); where
  fewer than ``k`` visible ones are left, it walks again with the condition. No point of a
  hidden thread leaves this module either way (tested; the bench counts leaks). Why: the
  condition, checked at every step of the walk (with ACORN), cost more than the walk itself
  at 1M (p50 / p99 17.9 / 55.6 against 7.9 / 17.0 ms without it, 1,000 of 10,000 threads
  hidden).
- **qdrant-edge holds the GIL** for the whole of a query and of a write, on whatever thread
  calls it (measured on the 1M shard: a Python thread beside a loop of walks ran ~26 % of
  the time, beside exact scans not at all; an earlier note here said queries release it).
  So fills write :data:`UPSERT_CHUNK` points at a time, and ``memstream up`` keeps its
  shards in a child process (:mod:`.vector_process`, :func:`open_vector_index`'s
  ``process``), where the walk takes the child's GIL and not the server's.
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np
from qdrant_edge import (
    AcornSearchParams,
    CountRequest,
    EdgeShard,
    FieldCondition,
    Filter,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Point,
    QuantizationSearchParams,
    Query,
    QueryRequest,
    SearchParams,
    UpdateOperation,
)

from memstream.projections.edge_slot import ShardSlot, shard_config
from memstream.projections.memory_index.tuning import IndexTuning
from memstream.projections.messages.text_table import text_key

DENSE: Final = "dense"
FILLING: Final = "filling"
"""A marker file in a shard's directory: the shard is being (or waits to be) filled from
ClickHouse; searches scan ClickHouse meanwhile."""
_POINT_NS: Final = uuid.UUID("5b0c6a2e-4f6b-4d87-9a43-2f1d1c6c7e10")

TUNING: Final = IndexTuning(
    m=0,
    ef_construct=100,
    payload_m=16,
    full_scan_kb=10_000,
    hnsw_ef=1024,
    tenant_fields=("agent_id",),
    graph_fields=("agent_id",),
    acorn_max_selectivity=1.0,
    exact_scan_kb=150_000,
    quantization="int8",
    oversampling=2.0,
)
"""One HNSW graph per agent (``m = 0``, ``payload_m = 16`` on ``agent_id``), no
collection-wide graph: every search filters on one agent. Agents of up to 150,000 KB of
vectors (100,000 at 384-d, 25,000 at 1,536-d) are scanned exactly (p50 20 / p99 29-35 ms
at 100k, measured); larger ones walk their graph with ``hnsw_ef = 1024`` and ACORN, the
smallest setting within 0.02 hit@5 of the exact scan at 1M in two builds (gaps 0.020 and
0.010; ACORN off needed 4096). The walk scores on an int8 copy of the vectors and re-scores
its best 2 x k on the float32 ones (the similarities it returns are the float32 ones): at
1M, p50 17.9 against 31.2 ms on float32 at the same overlap with the exact top 50 (0.994)
and hit@5 gap (<= 0.010); oversampling 1 lost overlap (0.931). A shard made before the int8
copy keeps walking its float32 vectors until it is rebuilt (a replay makes a fresh one).
``bench/transcript_vectors.py`` (docs/transcript-search.md)."""

EXACT: Final = SearchParams(exact=True, quantization=QuantizationSearchParams(ignore=True))
"""Every filtered point scored on its float32 vector (an int8 copy, if any, unused)."""

POST_FILTER_MAX_HIDDEN: Final = 0.4
"""The largest share of an agent's points in the caller's hidden threads (Qdrant's estimate
from the payload indexes) for which a walk leaves the hidden-thread condition out and drops
hidden hits instead (see the module docstring). Above it, hidden hits would crowd the
visible ones out of any affordable over-fetch: the walk keeps the condition. The estimate
runs low for long lists (measured at 1M: 0.087 for a true 0.100 with 1,000 hidden threads,
0.597 for 0.9999 with 9,999), hence a bound well under the share where a post-filter stops
paying, and the fallback below."""
SHARE_TTL_S: Final = 30.0
"""How long a hidden share (and a post-filter that had to walk again) is remembered per
agent and hidden-thread list: estimating it for 10,000 hidden threads costs ~5 ms."""
SHARES_MAX: Final = 4_096
POST_FILTER_EF: Final = 1536
"""``hnsw_ef`` of a post-filtered walk: the hidden points it meets take places among its
candidates, so it keeps more than the walk with the condition (1024) to find the visible
nearest as well. At 1M (1,000 of 10,000 threads hidden), overlap with the exact top 50 0.995
and hit@5 gap 0.015, against 0.994 and 0.015 for the walk with the condition; at 1024 it
gave 0.987 and 0.020 (``bench/transcript_vectors.py --post-filter``)."""
OVER_FETCH: Final = 1.5
"""How many more hits than ``k / (1 - hidden share)`` a post-filtered walk asks for, so
that the hidden threads nearest the query (a copy of the answer in another user's thread)
rarely leave fewer than ``k`` visible."""

OPTIMIZE_AFTER: Final = 20_000
"""Points not yet in an HNSW graph that make :meth:`VectorIndex.maintain` build one."""
UPSERT_CHUNK: Final = 1_000
"""Points per write of a fill (a write holds the GIL: ~50 ms for 1,000 at 384-d)."""


@dataclass(frozen=True, slots=True)
class VectorRow:
    """One message's vector as the index holds it."""

    account_id: str
    agent_id: str
    thread_id: str
    offset: int
    vector: Sequence[float] | np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class DenseQuery:
    """The dense side of one search: the ``k`` nearest visible messages to ``vector``, and
    the similarity of the messages at ``keys`` (BM25's candidates) that have a vector."""

    account_id: str
    agent_id: str
    vector: Sequence[float]
    k: int
    thread_id: str | None = None
    hidden_threads: Sequence[str] = ()
    keys: Sequence[tuple[str, int]] = ()
    exact: bool | None = None
    """None: the tuning decides by the agent's size (``exact_scan_kb``); True: score every
    filtered point (the reference benches and tests compare the walk with); False: walk the
    agent's HNSW graph where one was built (points in none are scanned)."""


def by_similarity(dense: dict[tuple[str, int], float]) -> dict[tuple[str, int], float]:
    """The dense side in the SQL scan's order (similarity, then thread and offset): the
    fusion keeps the dense side's order among equal scores."""
    return dict(sorted(dense.items(), key=lambda kv: (-kv[1], kv[0])))


def point_id(account_id: str, agent_id: str, thread_id: str, offset: int) -> str:
    """The point id of a message: a UUID derived from its key."""
    return str(uuid.uuid5(_POINT_NS, text_key(account_id, agent_id, thread_id, offset)))


def model_dir(model: str) -> str:
    """A model name as a directory name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", model) or "_"


def _agent_filter(account_id: str, agent_id: str) -> list[Any]:
    return [
        FieldCondition("account_id", match=MatchValue(account_id)),
        FieldCondition("agent_id", match=MatchValue(agent_id)),
    ]


def query_filter(q: DenseQuery, *, hidden: bool = True) -> Filter:
    """account AND agent [AND thread] AND NOT one of the caller's hidden threads (``hidden``
    False: without that last condition, for a walk whose hits are post-filtered)."""
    must = _agent_filter(q.account_id, q.agent_id)
    if q.thread_id is not None:
        must.append(FieldCondition("thread_id", match=MatchValue(q.thread_id)))
    must_not: list[Any] = []
    if q.hidden_threads and hidden:
        must_not.append(FieldCondition("thread_id", match=MatchAny(list(q.hidden_threads))))
    return Filter(must=must, must_not=must_not or None)


def over_fetch(k: int, hidden_share: float) -> int:
    """Hits a post-filtered walk asks for to keep ``k`` visible ones (:data:`OVER_FETCH`)."""
    return math.ceil(k / (1.0 - hidden_share) * OVER_FETCH) + 8


class DenseIndex(Protocol):
    """What the store, the vector loop and replays use of a vector index: a
    :class:`VectorIndex` in this process, or one in a child
    (:class:`~.vector_process.VectorIndexProcess`)."""

    path: Path

    @property
    def filling(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    def mark_filling(self) -> None: ...

    async def upsert(self, rows: Sequence[VectorRow]) -> None: ...

    async def delete_threads(self, threads: Sequence[tuple[str, str, str]]) -> int: ...

    async def rewrite(self) -> bool: ...

    async def fill(self, batches: Callable[[], AsyncIterator[list[VectorRow]]]) -> int: ...

    async def count(self, account_id: str | None = None, agent_id: str | None = None) -> int: ...

    async def nearest(self, q: DenseQuery) -> dict[tuple[str, int], float]: ...

    async def maintain(self, *, force: bool = False) -> bool: ...

    async def build(self, *, force: bool = False) -> bool: ...

    def info(self) -> Any: ...

    async def close(self) -> None: ...


class FilledFromRecord:
    """What a vector index keeps in its directory itself, wherever its shard is served: the
    filling marker (searches read ClickHouse while it is there) and the fill under it. For
    :class:`VectorIndex` and :class:`~.vector_process.VectorIndexProcess`."""

    path: Path

    @property
    def closed(self) -> bool:
        raise NotImplementedError

    async def upsert(self, rows: Sequence[VectorRow]) -> None:
        raise NotImplementedError

    @property
    def filling(self) -> bool:
        return (self.path / FILLING).exists()

    @property
    def ready(self) -> bool:
        """Whether searches may read this shard (it holds every vector of the record)."""
        return not self.filling and not self.closed

    def mark_filling(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / FILLING).touch()

    async def fill(self, batches: Callable[[], AsyncIterator[list[VectorRow]]]) -> int:
        """Upsert every row ``batches`` yields, under the filling marker (removed at the end:
        the shard then answers searches). Returns the rows written."""
        self.mark_filling()
        n = 0
        async for rows in batches():
            for i in range(0, len(rows), UPSERT_CHUNK):
                await self.upsert(rows[i : i + UPSERT_CHUNK])
            n += len(rows)
        (self.path / FILLING).unlink(missing_ok=True)
        return n


class VectorIndex(FilledFromRecord):
    """One qdrant-edge shard of message vectors (see the module docstring), in a
    :class:`~memstream.projections.edge_slot.ShardSlot` (which builds its graphs in a child
    process). Every call blocks in qdrant-edge, so each runs in a worker thread; the shard is
    created by the first write (its dimensions are the first vector's)."""

    def __init__(self, path: Path, tuning: IndexTuning = TUNING) -> None:
        self.path = path
        self.tuning = tuning
        self.build_after = OPTIMIZE_AFTER
        self.post_filter_max_hidden: float | None = POST_FILTER_MAX_HIDDEN
        """:data:`POST_FILTER_MAX_HIDDEN` (None: every walk keeps the hidden-thread
        condition; benches compare the two)."""
        self.post_filter_ef = POST_FILTER_EF
        self.post_filtered = 0
        """Walks answered by the post-filter; :attr:`refiltered`: of them, walked again with
        the condition (too few visible hits)."""
        self.refiltered = 0
        self._shares: dict[tuple[str, str, int, int], tuple[float, float]] = {}
        self.slot = ShardSlot(path)
        self._left_unindexed = 0
        self._closed = False

    # --- state -----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def _get(self) -> EdgeShard | None:
        return self.slot.get()

    def _setup(self) -> list[UpdateOperation]:
        return [
            UpdateOperation.create_field_index(
                name,
                KeywordIndexParams(
                    is_tenant=True if name in self.tuning.tenant_fields else None,
                    enable_hnsw=self.tuning.builds_graph(name),
                ),
            )
            for name in ("account_id", "agent_id", "thread_id")
        ]

    # --- writes ----------------------------------------------------------------------------
    def _upsert_blocking(self, rows: Sequence[VectorRow]) -> None:
        self.slot.create(shard_config(len(rows[0].vector), self.tuning, dense=DENSE), self._setup())
        upsert = UpdateOperation.upsert_points(
            [
                Point(
                    point_id(r.account_id, r.agent_id, r.thread_id, r.offset),
                    # numpy rows are taken as they are (the stubs list only lists)
                    {DENSE: r.vector},  # type: ignore[dict-item]
                    {
                        "account_id": r.account_id,
                        "agent_id": r.agent_id,
                        "thread_id": r.thread_id,
                        "offset": r.offset,
                    },
                )
                for r in rows
            ]
        )
        self.slot.write(lambda sh: sh.update(upsert))

    async def upsert(self, rows: Sequence[VectorRow]) -> None:
        """Write ``rows`` (durable on return: the shard's WAL)."""
        if rows:
            await asyncio.to_thread(self._upsert_blocking, rows)

    def _delete_blocking(self, threads: Sequence[tuple[str, str, str]]) -> int:
        shard = self._get()
        if shard is None:
            return 0
        by_agent: dict[tuple[str, str], list[str]] = {}
        for a, g, t in threads:
            by_agent.setdefault((a, g), []).append(t)
        deleted = 0
        for (a, g), ts in by_agent.items():
            flt = Filter(
                must=[*_agent_filter(a, g), FieldCondition("thread_id", match=MatchAny(ts))]
            )
            deleted += int(shard.count(CountRequest(exact=True, filter=flt)))
            delete = UpdateOperation.delete_points_by_filter(flt)
            self.slot.write(lambda sh, op=delete: sh.update(op))  # type: ignore[misc]
        return deleted

    async def delete_threads(self, threads: Sequence[tuple[str, str, str]]) -> int:
        """Delete every point of the ``(account, agent, thread)`` threads (erasure); returns
        how many there were."""
        if not threads:
            return 0
        return await asyncio.to_thread(self._delete_blocking, threads)

    async def rewrite(self) -> bool:
        """Rewrite the shard from its live points in a child process and switch to it
        (:meth:`ShardSlot.rewrite`): deleted points' vectors leave the files (erasure).
        True if it switched."""
        if self._closed:
            return False
        done = await self.slot.rewrite()
        if done:
            self._left_unindexed = await asyncio.to_thread(self.slot.unindexed)
        return done

    # --- reads -----------------------------------------------------------------------------
    def _count_blocking(self, account_id: str | None, agent_id: str | None) -> int:
        shard = self._get()
        if shard is None:
            return 0
        if account_id is None or agent_id is None:
            return int(shard.count(CountRequest(exact=True)))
        flt = Filter(must=_agent_filter(account_id, agent_id))
        return int(shard.count(CountRequest(exact=False, filter=flt)))

    async def count(self, account_id: str | None = None, agent_id: str | None = None) -> int:
        """Points in the shard (exact), or of one agent (estimated from the payload index,
        no point read)."""
        return await asyncio.to_thread(self._count_blocking, account_id, agent_id)

    def scans_exactly(self, q: DenseQuery) -> bool:
        """Whether ``q`` scores every filtered point (see :attr:`DenseQuery.exact`)."""
        if q.exact is not None:
            return q.exact
        if q.thread_id is not None:
            return True  # one thread: its points through the thread_id index
        points = self._count_blocking(q.account_id, q.agent_id)
        return self.tuning.scans_exactly(points, len(q.vector))

    def _params(self, q: DenseQuery) -> SearchParams:
        return EXACT if self.scans_exactly(q) else self._walk(self.tuning.hnsw_ef)

    def _walk(self, ef: int | None) -> SearchParams:
        acorn = self.tuning.acorn_max_selectivity
        over = self.tuning.oversampling
        return SearchParams(
            hnsw_ef=ef,
            acorn=AcornSearchParams(enable=True, max_selectivity=acorn) if acorn else None,
            quantization=(
                QuantizationSearchParams(ignore=True)
                if over is None
                else QuantizationSearchParams(rescore=True, oversampling=over)
            ),
        )

    def _share_key(self, q: DenseQuery) -> tuple[str, str, int, int]:
        hidden = q.hidden_threads
        return (q.account_id, q.agent_id, len(hidden), hash(tuple(hidden)))

    def _hidden_share(self, shard: EdgeShard, q: DenseQuery) -> float:
        """The share of the agent's points in ``q``'s hidden threads, estimated from the
        payload indexes (no point read); remembered for :data:`SHARE_TTL_S` (1.0 after a
        post-filter of the same list had to walk again)."""
        key = self._share_key(q)
        now = time.monotonic()
        known = self._shares.get(key)
        if known is not None and now - known[0] < SHARE_TTL_S:
            return known[1]
        share = self._estimate_share(shard, q)
        if len(self._shares) >= SHARES_MAX:
            self._shares.clear()
        self._shares[key] = (now, share)
        return share

    def _estimate_share(self, shard: EdgeShard, q: DenseQuery) -> float:
        total = self._count_blocking(q.account_id, q.agent_id)
        if not total:
            return 1.0
        hidden = FieldCondition("thread_id", match=MatchAny(list(q.hidden_threads)))
        flt = Filter(must=[*_agent_filter(q.account_id, q.agent_id), hidden])
        return min(1.0, shard.count(CountRequest(exact=False, filter=flt)) / total)

    @staticmethod
    def _query(
        shard: EdgeShard, vector: list[float], limit: int, flt: Filter, params: SearchParams
    ) -> list[Any]:
        """The ``limit`` points nearest ``vector`` among those ``flt`` lets through."""
        return list(
            shard.query(
                QueryRequest(
                    limit=limit,
                    query=Query.Nearest(vector, using=DENSE),
                    filter=flt,
                    params=params,
                    with_payload=True,
                )
            )
        )

    def _nearest_hits(self, shard: EdgeShard, q: DenseQuery, vector: list[float]) -> list[Any]:
        """The ``k`` nearest visible points of ``q``: a walk or a scan with every condition,
        or a post-filtered walk (module docstring, "Privacy in the query")."""
        params = self._params(q)
        limit = self.post_filter_max_hidden
        if q.hidden_threads and params is not EXACT and limit is not None:
            share = self._hidden_share(shard, q)
            if share <= limit:
                self.post_filtered += 1
                hidden = set(q.hidden_threads)
                wider = self._walk(self.post_filter_ef)
                flt = query_filter(q, hidden=False)
                got = self._query(shard, vector, over_fetch(q.k, share), flt, wider)
                visible = [h for h in got if str((h.payload or {})["thread_id"]) not in hidden]
                if len(visible) >= q.k:
                    return visible[: q.k]
                self.refiltered += 1  # the next walks with this list keep the condition
                self._shares[self._share_key(q)] = (time.monotonic(), 1.0)
        return self._query(shard, vector, q.k, query_filter(q), params)

    def nearest_blocking(self, q: DenseQuery) -> dict[tuple[str, int], float]:
        """``{(thread_id, offset): cosine similarity}`` of the ``k`` nearest visible messages
        and of those at ``keys`` that are visible and have a vector, in the calling thread."""
        shard = self._get()
        if shard is None:
            return {}
        vector = [float(x) for x in q.vector]
        out: dict[tuple[str, int], float] = {}
        hits = self._nearest_hits(shard, q, vector) if q.k > 0 else []
        for h in hits:
            p = h.payload or {}
            out[(str(p["thread_id"]), int(p["offset"]))] = float(h.score)
        if q.keys:
            for key, score in self._similarities(shard, q, vector).items():
                out.setdefault(key, score)  # a walk's hit keeps the walk's score
        return by_similarity(out)

    @staticmethod
    def _similarities(
        shard: EdgeShard, q: DenseQuery, vector: list[float]
    ) -> dict[tuple[str, int], float]:
        """The cosine similarity of the messages at ``q.keys`` that are visible and have a
        vector. Their points are read by id (an id derives from the message's account,
        agent, thread and offset, so it names no point of another agent) after the keys of
        hidden threads and, for a thread's search, of other threads are dropped; scored
        here, a dot product of unit vectors as Qdrant's cosine (within 2e-7). A filtered
        exact query by id cost 8.2 ms p50 at 1M for 50 keys, this 1.3-2.4 ms."""
        hidden = set(q.hidden_threads)
        wanted: dict[int | uuid.UUID | str, tuple[str, int]] = {
            uuid.UUID(point_id(q.account_id, q.agent_id, t, o)): (t, o)
            for t, o in q.keys
            if t not in hidden and (q.thread_id is None or t == q.thread_id)
        }
        if not wanted:
            return {}
        keys, rows = [], []
        for p in shard.retrieve(list(wanted), False, [DENSE]):
            named = p.vector
            row = named.get(DENSE) if isinstance(named, dict) else None
            if p.id in wanted and row is not None:
                keys.append(wanted[p.id])
                rows.append(row)
        if not rows:
            return {}
        unit = np.asarray(vector, dtype=np.float32)
        unit /= max(float(np.linalg.norm(unit)), 1e-12)
        scores = np.asarray(rows, dtype=np.float32) @ unit
        return {key: float(score) for key, score in zip(keys, scores, strict=True)}

    async def nearest(self, q: DenseQuery) -> dict[tuple[str, int], float]:
        return await asyncio.to_thread(self.nearest_blocking, q)

    # --- upkeep ----------------------------------------------------------------------------
    def maintain_blocking(self, force: bool = False) -> bool:
        """:meth:`maintain` in the calling thread."""
        if not force and self.slot.unindexed() < self.build_after:
            return False
        return self.slot.optimize_here()

    async def maintain(self, *, force: bool = False) -> bool:
        """Build the HNSW graphs in this process, once at least :attr:`build_after` points
        are in none (``force``: whatever their number). True if segments were rebuilt. For
        benches: the build holds the GIL throughout (module docstring); a serving process
        calls :meth:`build`."""
        return await asyncio.to_thread(self.maintain_blocking, force)

    async def build(self, *, force: bool = False) -> bool:
        """Build the HNSW graphs in a child process, once at least :attr:`build_after` more
        points are in none than the last build left (``force``: whatever their number), and
        switch to the result
        (:meth:`ShardSlot.build`); searches and writes go on meanwhile. True if it
        switched."""
        if self._closed:
            return False
        unindexed = await asyncio.to_thread(self.slot.unindexed)
        if not force and unindexed - self._left_unindexed < self.build_after:
            return False
        built = await self.slot.build()
        # what the optimizer leaves in no graph (segments below its indexing threshold) is
        # not built again until as many more points come
        self._left_unindexed = await asyncio.to_thread(self.slot.unindexed)
        return built

    def info(self) -> Any:
        """Segments, points and indexed vectors (None before the first write): how a bench
        or test checks that the graph was built."""
        shard = self._get()
        return None if shard is None else shard.info()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self.slot.close)


_OPEN: dict[Path, DenseIndex] = {}
_OPEN_LOCK = threading.Lock()


def open_vector_index(path: Path, *, process: bool = False) -> DenseIndex:
    """The process's one vector index at ``path`` (a shard has one owner): a
    :class:`VectorIndex` here, or with ``process`` one in a child process of its own
    (:class:`~.vector_process.VectorIndexProcess`). The first to open a path decides."""
    path = path.resolve()
    with _OPEN_LOCK:
        index = _OPEN.get(path)
        if index is None or index.closed:
            if process:
                from memstream.projections.messages.vector_process import VectorIndexProcess

                index = VectorIndexProcess(path)
            else:
                index = VectorIndex(path)
            _OPEN[path] = index
        return index


async def close_vector_indexes(root: Path) -> None:
    """Close every vector index this process opened under ``root``."""
    root = root.resolve()
    with _OPEN_LOCK:
        mine = [p for p in _OPEN if p.is_relative_to(root)]
        indexes = [_OPEN.pop(p) for p in mine]
    for index in indexes:
        await index.close()


async def drop_vector_indexes(path: Path) -> None:
    """Close and delete every vector index under ``path`` (a dropped generation's)."""
    await close_vector_indexes(path)
    await asyncio.to_thread(shutil.rmtree, path.resolve(), True)
