"""Coverage (``streams.coverage``) in Postgres: table ``projection_coverage``, one row per
(group, topic, partition) holding its applied ranges as JSON ``[[lo, hi], ...]``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg
import orjson

from memstream.streams.coverage import PartitionKey, Ranges

__all__ = ["PgCoverage"]


def _ranges(raw: object) -> Ranges:
    data = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    assert isinstance(data, list)
    return [(int(lo), int(hi)) for lo, hi in data]


class PgCoverage:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def load(self, keys: Sequence[PartitionKey]) -> dict[PartitionKey, Ranges]:
        if not keys:
            return {}
        rows = await self._pool.fetch(
            "SELECT c.grp, c.topic, c.part, c.ranges::text AS ranges FROM projection_coverage c"
            " JOIN unnest($1::text[], $2::text[], $3::int[]) AS k(grp, topic, part)"
            " USING (grp, topic, part)",
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
        )
        return {(r["grp"], r["topic"], r["part"]): _ranges(r["ranges"]) for r in rows}

    async def load_groups(self, groups: Sequence[str]) -> dict[PartitionKey, Ranges]:
        rows = await self._pool.fetch(
            "SELECT grp, topic, part, ranges::text AS ranges FROM projection_coverage"
            " WHERE grp = ANY($1::text[])",
            list(groups),
        )
        return {(r["grp"], r["topic"], r["part"]): _ranges(r["ranges"]) for r in rows}

    async def save(self, ranges: Mapping[PartitionKey, Ranges]) -> None:
        if not ranges:
            return
        keys = list(ranges)
        await self._pool.execute(
            "INSERT INTO projection_coverage (grp, topic, part, ranges)"
            " SELECT g, t, p, r::jsonb FROM unnest($1::text[], $2::text[], $3::int[], $4::text[])"
            " AS u(g, t, p, r)"
            " ON CONFLICT (grp, topic, part) DO UPDATE SET ranges = EXCLUDED.ranges,"
            " updated_at = now()",
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
            [orjson.dumps([list(r) for r in ranges[k]]).decode() for k in keys],
        )
