"""How the memory index's approximate search is built and searched. Pure: no I/O.

The values of :data:`TUNING` were chosen by ``bench/recall_scale.py`` (docs/recall-index.md,
"Recall at scale"); :data:`LEGACY` is what collections were built with before, kept so the
bench can measure both in one run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal


@dataclass(frozen=True, slots=True)
class IndexTuning:
    """HNSW build and search parameters of one collection.

    - ``m``, ``ef_construct``: the HNSW graph (edges per node, build-time candidates).
    - ``payload_m``: edges per node of the extra per-value graphs Qdrant builds for indexed
      keyword fields (``None``: same as ``m``). These are what keep a filtered search on the
      graph: a filter on ``agent_id`` walks that agent's own links.
    - ``full_scan_kb``: below this many kilobytes of vectors matching the filter (estimated
      from the payload indexes), Qdrant scores the filtered points exactly instead of walking
      the graph; also the size under which no per-value graph is built. In KB of float32
      vectors: 1,536 B per 384-d vector, 6 KB per 1,536-d one.
    - ``hnsw_ef``: candidates kept while walking the graph for the dense prefetch (``None``:
      Qdrant's default, ``ef_construct``, no fewer than the prefetch limit).
    - ``tenant_fields``: keyword fields indexed with ``is_tenant`` (points stored grouped by
      that value, and the query planner knows the field partitions the data).
    - ``graph_fields``: the payload fields Qdrant builds per-value graphs for (``None``:
      every indexed field, Qdrant's default). Each one costs a graph build per value larger
      than ``full_scan_kb``; a field that never narrows a search (one value per collection,
      a unique key) only costs.
    - ``acorn_max_selectivity``: use ACORN (the walk also steps through neighbours of points
      the filter rejects) when the filter keeps at most this share of the segment's points
      (``None``: never; 1.0: always). It reaches a point whose graph neighbours are all
      filtered out, e.g. an entry whose exact duplicates are other users' private copies.
    - ``indexing_threshold_kb``: a segment holding more vectors than this is given an HNSW
      graph by ``optimize()`` (``None``: Qdrant's default, 10,000 KB ≈ 6,700 vectors at
      384-d); tests lower it to build graphs on small data.
    - ``exact_scan_kb``: an agent whose dense vectors take at most this many KB is scored
      exactly at query time (the dense prefetch scans the agent's points through the
      ``agent_id`` index instead of walking its graph; BM25 is exact either way). Decided
      per query from the agent's point count (:meth:`scans_exactly`), so it needs no
      rebuild. In KB of float32 vectors, like ``full_scan_kb``: the cost of a scan is its
      bytes, so the same budget covers 4x fewer 1,536-d entries than 384-d ones
      (``None``: never).
    - ``quantization``: ``"int8"`` keeps a scalar-quantized (int8) copy of every dense
      vector in RAM beside the float32 one (set when the shard is created); ``None``: none.
    - ``oversampling``: with an int8 copy, a walk scores candidates on it and re-scores the
      best ``limit x oversampling`` of them on the float32 vectors (``None``: walk on the
      float32 vectors, the int8 copy unused). Read at query time. Exact scans always score
      the float32 vectors.
    """

    m: int
    ef_construct: int
    payload_m: int | None
    full_scan_kb: int
    hnsw_ef: int | None
    tenant_fields: tuple[str, ...]
    graph_fields: tuple[str, ...] | None = None
    indexing_threshold_kb: int | None = None
    acorn_max_selectivity: float | None = None
    exact_scan_kb: int | None = None
    quantization: Literal["int8"] | None = None
    oversampling: float | None = None

    def builds_graph(self, field: str) -> bool:
        return self.graph_fields is None or field in self.graph_fields

    def scans_exactly(self, points: int, dimensions: int) -> bool:
        """Whether an agent of ``points`` entries of ``dimensions``-d vectors is scored
        exactly (see ``exact_scan_kb``)."""
        return self.exact_scan_kb is not None and points * dimensions * 4 <= (
            self.exact_scan_kb * 1024
        )

    def __post_init__(self) -> None:
        if self.m < 0 or self.ef_construct < 4 or self.full_scan_kb < 0:
            raise ValueError(f"invalid index tuning: {self}")
        if self.hnsw_ef is not None and self.hnsw_ef < 1:
            raise ValueError(f"invalid index tuning: hnsw_ef={self.hnsw_ef}")
        if self.exact_scan_kb is not None and self.exact_scan_kb < 0:
            raise ValueError(f"invalid index tuning: exact_scan_kb={self.exact_scan_kb}")
        if self.oversampling is not None and self.oversampling < 1:
            raise ValueError(f"invalid index tuning: oversampling={self.oversampling}")


LEGACY: Final = IndexTuning(
    m=16,
    ef_construct=100,
    payload_m=None,
    full_scan_kb=10_000,
    hnsw_ef=None,
    tenant_fields=(),
)
"""Qdrant's defaults: what every collection was built with before bench/recall_scale.py."""

TUNING: Final = IndexTuning(
    m=0,
    ef_construct=100,
    payload_m=16,
    full_scan_kb=10_000,
    hnsw_ef=2048,
    tenant_fields=("agent_id",),
    graph_fields=("agent_id",),
    acorn_max_selectivity=1.0,
    exact_scan_kb=30_000,
)
"""One graph per agent, no collection-wide graph; a wider walk at search time.

Every recall filters on one agent, so the graph it walks should hold that agent's points
and no one else's: ``m = 0`` (no global graph) with ``payload_m = 16`` on ``agent_id`` builds
exactly that, for each agent larger than ``full_scan_kb`` (≈6,700 entries at 384-d, ≈1,700
at 1,536-d); smaller agents are scanned exactly through the payload index, which is both
right and fast at that size. No other field gets per-value graphs (the account is the
collection; visibility, owner, category and key never narrow enough to pay for a build).
``hnsw_ef = 2048`` keeps the 100-candidate dense prefetch close to exact up to 100k entries
per agent in every build measured (256 was enough at 10k, not at 100k: hybrid hit@5 0.557
against 0.633 exact; 1,024 missed the 0.02 bound in two builds of five, gap 0.026 and 0.023;
2,048 gave gaps 0.006, 0.000 and 0.006 in three), and ACORN (always) reaches entries whose graph neighbours the filter
rejects: identical vectors are common in memory (the same fact stored privately by many
users, an expired copy and its successor), and HNSW links a point to one of its duplicates
rather than to all of them. Agents of up to ``exact_scan_kb = 30,000`` KB (20,000 entries
at 384-d, 5,000 at 1,536-d) are scored exactly instead: there a scan costs about what the
wide walk does and is exact by construction; at 100k a scan cost 3-4x the walk. Measured by
bench/recall_scale.py against :data:`LEGACY` (docs/recall-index.md, "Recall at scale")."""
