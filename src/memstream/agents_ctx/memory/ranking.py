"""Recall ranking and limits: ``score × (0.8 + importance × 0.2)``, limit 5 by default, 20 at most.

Pure. The score comes from the index (dense and sparse scores fused by DBSF, a relevance in
[0, 1]) or from the Postgres keyword search (``ts_rank``); either way the importance boost is
applied here, once, so both recall paths order results by the same rule. On a relevance in
[0, 1] the boost moves a score by at most 20 %: importance decides near-ties, never lifts an
unrelated fact over a clearly relevant one.
"""

from __future__ import annotations

from collections.abc import Iterable

from memstream.errors import InvalidRequest
from memstream.schemas.limits import (
    RECALL_BOOST_BASE,
    RECALL_BOOST_PER_IMPORTANCE,
    RECALL_DEFAULT_LIMIT,
    RECALL_MAX_LIMIT,
)
from memstream.schemas.records import MemoryEntry


def boosted(score: float, importance: float) -> float:
    """The spec's importance boost: an entry of importance 1.0 keeps its score, 0.0 loses 20 %."""
    return score * (RECALL_BOOST_BASE + importance * RECALL_BOOST_PER_IMPORTANCE)


def resolve_limit(limit: object) -> int:
    """None → 5; an integer ≥ 1 → itself, capped at 20; anything else names ``limit``."""
    if limit is None:
        return RECALL_DEFAULT_LIMIT
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidRequest("limit must be an integer", field="limit")
    if limit < 1:
        raise InvalidRequest("limit must be at least 1", field="limit")
    return min(limit, RECALL_MAX_LIMIT)


def rank(
    scored: Iterable[tuple[MemoryEntry, float]], limit: int
) -> list[tuple[MemoryEntry, float]]:
    """Boost each raw score by importance and keep the best ``limit``.

    Ties are broken by more recent ``updated_at``, then key, so the order is deterministic.
    """
    boosted_rows = [(e, boosted(s, e.importance)) for e, s in scored]
    boosted_rows.sort(key=lambda r: (-r[1], -r[0].updated_at.timestamp(), r[0].key))
    return boosted_rows[:limit]
