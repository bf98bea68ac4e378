"""qdrant-client adapter: the production path against a Qdrant server.

Same collection layout, payload, version rule and hybrid query as the qdrant-edge adapter,
expressed in qdrant-client's models. Tested in qdrant-client's local mode
(``AsyncQdrantClient(path=...)`` or ``location=":memory:"``), which runs the same code path
with correct filters and fusion but is slow (≈150 ms per hybrid query at 5k points): a test
and development vehicle, not a default.
"""

from __future__ import annotations

from typing import Any

from qdrant_client import AsyncQdrantClient, models

from memstream.errors import PermanentInfraError, RetryableInfraError
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


def scope_filter(scope: RecallScope) -> models.Filter:
    """Same filter as the edge adapter's, in qdrant-client models."""
    visible: list[Any] = [
        models.Filter(
            must=[models.FieldCondition(key="visibility", match=models.MatchValue(value="shared"))]
        )
    ]
    if scope.user_id:
        visible.append(
            models.Filter(
                must=[
                    models.FieldCondition(
                        key="visibility", match=models.MatchValue(value="private")
                    ),
                    models.FieldCondition(
                        key="owner", match=models.MatchValue(value=scope.user_id)
                    ),
                ]
            )
        )
    must: list[Any] = [
        models.FieldCondition(key="account_id", match=models.MatchValue(value=scope.account_id)),
        models.FieldCondition(key="agent_id", match=models.MatchValue(value=scope.agent_id)),
        models.Filter(should=visible),
        models.Filter(
            should=[
                models.IsEmptyCondition(is_empty=models.PayloadField(key="expires_at")),
                models.FieldCondition(key="expires_at", range=models.Range(gt=scope.now_epoch)),
            ]
        ),
    ]
    if scope.category:
        must.append(
            models.FieldCondition(key="category", match=models.MatchValue(value=scope.category))
        )
    return models.Filter(must=must)


def field_schemas(tuning: IndexTuning) -> list[tuple[str, Any]]:
    """The payload indexes of a collection, as the edge adapter creates them: ``is_tenant``
    on the tenant fields, per-value graphs only for the graph fields."""
    out: list[tuple[str, Any]] = [
        (
            f,
            models.KeywordIndexParams(
                type=models.KeywordIndexType.KEYWORD,
                is_tenant=True if f in tuning.tenant_fields else None,
                enable_hnsw=tuning.builds_graph(f),
            ),
        )
        for f in KEYWORD_FIELDS
    ]
    out += [
        (
            f,
            models.FloatIndexParams(
                type=models.FloatIndexType.FLOAT, enable_hnsw=tuning.builds_graph(f)
            ),
        )
        for f in FLOAT_FIELDS
    ]
    out += [
        (
            f,
            models.IntegerIndexParams(
                type=models.IntegerIndexType.INTEGER,
                lookup=True,
                range=True,
                enable_hnsw=tuning.builds_graph(f),
            ),
        )
        for f in INTEGER_FIELDS
    ]
    return out


class QdrantClientIndex:
    """:class:`~memstream.projections.memory_index.port.IndexBackend` on ``qdrant-client``.

    Build with :meth:`server` (URL + API key) or :meth:`local` (a path or ``":memory:"``).
    Transport failures become ``RetryableInfraError``.
    """

    def __init__(self, client: AsyncQdrantClient, tuning: IndexTuning = TUNING) -> None:
        self._client = client
        self.tuning = tuning
        self._known: dict[str, int] = {}

    @classmethod
    def server(cls, url: str, api_key: str | None = None) -> QdrantClientIndex:
        return cls(AsyncQdrantClient(url=url, api_key=api_key or None))

    @classmethod
    def local(cls, location: str) -> QdrantClientIndex:
        if location == ":memory:":
            return cls(AsyncQdrantClient(location=":memory:"))
        return cls(AsyncQdrantClient(path=location))

    async def _exists(self, name: str) -> bool:
        if name in self._known:
            return True
        try:
            return bool(await self._client.collection_exists(name))
        except Exception as e:  # transport errors differ by client mode
            raise RetryableInfraError(f"qdrant: {e}") from e

    async def ensure_collection(self, name: str, dimensions: int) -> None:
        if self._known.get(name) == dimensions:
            return
        try:
            if await self._client.collection_exists(name):
                info = await self._client.get_collection(name)
                vectors = info.config.params.vectors
                size = vectors[DENSE].size if isinstance(vectors, dict) else None
                if size != dimensions:
                    raise PermanentInfraError(
                        f"collection {name} has {size}-d vectors, embedder gives {dimensions}: "
                        "rebuild the index (memstream replay)"
                    )
            else:
                await self._client.create_collection(
                    name,
                    vectors_config={
                        DENSE: models.VectorParams(size=dimensions, distance=models.Distance.COSINE)
                    },
                    sparse_vectors_config={
                        SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)
                    },
                    hnsw_config=models.HnswConfigDiff(
                        m=self.tuning.m,
                        ef_construct=self.tuning.ef_construct,
                        payload_m=self.tuning.payload_m,
                        full_scan_threshold=self.tuning.full_scan_kb,
                    ),
                )
                for field, kind in field_schemas(self.tuning):
                    await self._client.create_payload_index(name, field, field_schema=kind)
        except PermanentInfraError:
            raise
        except Exception as e:
            raise RetryableInfraError(f"qdrant: {e}") from e
        self._known[name] = dimensions

    async def upsert(self, name: str, points: list[IndexPoint]) -> None:
        if not points:
            return
        await self.ensure_collection(name, len(points[0].dense))
        by_version: dict[int, list[IndexPoint]] = {}
        for p in points:
            by_version.setdefault(p.version, []).append(p)
        try:
            for version, group in by_version.items():
                await self._client.upsert(
                    name,
                    points=[
                        models.PointStruct(
                            id=p.point_id,
                            vector={
                                DENSE: p.dense,
                                SPARSE: models.SparseVector(
                                    indices=p.sparse.indices, values=p.sparse.values
                                ),
                            },
                            payload=p.payload,
                        )
                        for p in group
                    ],
                    # An existing point is replaced only if its stored version is older.
                    update_filter=models.Filter(
                        must=[models.FieldCondition(key="version", range=models.Range(lt=version))]
                    ),
                    wait=True,
                )
        except Exception as e:
            raise RetryableInfraError(f"qdrant upsert: {e}") from e

    async def delete(self, name: str, deletes: list[tuple[str, int]]) -> None:
        if not deletes or not await self._exists(name):
            return
        try:
            for pid, version in deletes:
                await self._client.delete(
                    name,
                    points_selector=models.FilterSelector(
                        filter=models.Filter(
                            must=[
                                models.HasIdCondition(has_id=[pid]),
                                models.FieldCondition(
                                    key="version", range=models.Range(lte=version)
                                ),
                            ]
                        )
                    ),
                    wait=True,
                )
        except Exception as e:
            raise RetryableInfraError(f"qdrant delete: {e}") from e

    async def hybrid_query(
        self,
        name: str,
        dense: list[float],
        sparse: SparseVec,
        scope: RecallScope,
        limit: int,
        prefetch_limit: int,
    ) -> list[tuple[PointIdentity, float]]:
        if not await self._exists(name):
            return []
        flt = scope_filter(scope)
        t = self.tuning
        if t.exact_scan_kb is not None and t.scans_exactly(
            await self._agent_points(name, scope.agent_id), len(dense)
        ):
            params = models.SearchParams(exact=True)  # a small agent: scored exactly
        else:
            params = models.SearchParams(
                hnsw_ef=t.hnsw_ef,
                acorn=models.AcornSearchParams(enable=True, max_selectivity=t.acorn_max_selectivity)
                if t.acorn_max_selectivity is not None
                else None,
            )
        prefetch = [
            models.Prefetch(
                query=dense, using=DENSE, limit=prefetch_limit, filter=flt, params=params
            )
        ]
        if sparse.indices:
            prefetch.append(
                models.Prefetch(
                    query=models.SparseVector(indices=sparse.indices, values=sparse.values),
                    using=SPARSE,
                    limit=prefetch_limit,
                    filter=flt,
                )
            )
        try:
            resp = await self._client.query_points(
                name,
                prefetch=prefetch,
                query=models.FusionQuery(fusion=models.Fusion.DBSF),
                query_filter=flt,
                limit=limit,
                with_payload=True,
            )
        except Exception as e:
            raise RetryableInfraError(f"qdrant query: {e}") from e
        return [(identity_from_payload(p.payload or {}), float(p.score)) for p in resp.points]

    async def _agent_points(self, name: str, agent_id: str) -> int:
        """The agent's point count, estimated from the payload index (``exact=False``)."""
        flt = models.Filter(
            must=[models.FieldCondition(key="agent_id", match=models.MatchValue(value=agent_id))]
        )
        try:
            return int((await self._client.count(name, count_filter=flt, exact=False)).count)
        except Exception as e:
            raise RetryableInfraError(f"qdrant count: {e}") from e

    async def versions(self, name: str, point_ids: list[str]) -> dict[str, int]:
        if not point_ids or not await self._exists(name):
            return {}
        recs = await self._client.retrieve(name, ids=list(point_ids), with_payload=["version"])
        return {str(r.id): int((r.payload or {}).get("version", 0)) for r in recs}

    async def count(self, name: str) -> int:
        if not await self._exists(name):
            return 0
        res = await self._client.count(name, exact=True)
        return int(res.count)

    async def drop_collection(self, name: str) -> None:
        self._known.pop(name, None)
        if await self._client.collection_exists(name):
            await self._client.delete_collection(name)

    async def close(self) -> None:
        await self._client.close()
