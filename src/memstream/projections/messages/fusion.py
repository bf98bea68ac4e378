"""Fusing transcript search's two scores (BM25 and dense similarity) into one relevance. Pure.

Every candidate (BM25's best and the dense side's best) carries both scores. Each is mapped
to [0, 1] and the relevance is their weighted mean, in [0, 1]:

- BM25 by **query coverage**: the score over the query's total term weight (the sum of the
  query terms' idf, :func:`query_weight`), clipped to 1. A message that holds only the
  query's most common word (a speaker's name in half the turns) gets a small value, one that
  holds its rare words a large one, whatever the other candidates are.
- Dense similarity by its distribution over the candidates (the rule Qdrant calls DBSF,
  also used by memory recall): ``(s - (mu - 3 sd)) / 6 sd`` clipped, with the mean and
  standard deviation of the candidates' similarities; a message without a vector yet gets 0.
  Embedding similarities sit in a narrow band (0.75-0.9 for e5), which this spreads out.

Both keep score gaps (unlike reciprocal-rank fusion). Measured against the alternatives
(DBSF on both sides, max-normalised BM25, RRF) in docs/transcript-search.md.

Deterministic: the same scores give the same order (ties by the caller's key order).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

DENSE_WEIGHT: Final = 0.5
"""The dense list's share of the fused relevance (BM25 has the rest)."""


def idf(n_docs: float, df: float) -> float:
    """BM25's idf, as :func:`~memstream.projections.messages.sql.search_sql` computes it."""
    return math.log(1 + (n_docs - df + 0.5) / (df + 0.5))


def bm25(
    tfs: Sequence[int],
    dfs: Sequence[float],
    n_docs: float,
    length: int,
    avg_len: float,
    k1: float,
    b: float,
) -> float:
    """BM25 of one message, the formula of :func:`~.sql.search_sql` (for the dense side's
    candidates that BM25's best did not include; without the proximity bonus)."""
    norm = k1 * (1 - b + b * length / max(avg_len, 1.0))
    return math.fsum(
        idf(n_docs, df) * tf * (k1 + 1) / (tf + norm) for tf, df in zip(tfs, dfs, strict=True) if tf
    )


def query_weight(n_docs: float, dfs: Sequence[float]) -> float:
    """The query's total term weight: the sum of its terms' idf (a term in no message has
    the highest idf, so a query of unknown words weighs most)."""
    return math.fsum(idf(n_docs, df) for df in dfs)


def coverage(bm25: float, weight: float) -> float:
    """BM25 as a share of the query's weight, in [0, 1]."""
    return 0.0 if weight <= 0 else min(1.0, max(0.0, bm25 / weight))


def normalise(scores: Sequence[float]) -> list[float]:
    """Each score mapped to [0, 1] by the list's mean and standard deviation (3 sigma)."""
    if not scores:
        return []
    mu = math.fsum(scores) / len(scores)
    sd = math.sqrt(math.fsum((s - mu) ** 2 for s in scores) / len(scores))
    if sd <= 1e-12:
        return [1.0 if s > 0 else 0.0 for s in scores]
    lo = mu - 3 * sd
    return [min(1.0, max(0.0, (s - lo) / (6 * sd))) for s in scores]


@dataclass(frozen=True, slots=True)
class Fused(Generic[K]):
    key: K
    relevance: float
    lexical: float
    """BM25's coverage of the query (0: no query term)."""
    dense: float
    """The normalised dense similarity (0: no vector)."""


def fuse(
    lexical: Mapping[K, float], dense: Mapping[K, float], dense_weight: float = DENSE_WEIGHT
) -> list[Fused[K]]:
    """Every key of either mapping with its fused relevance, best first (stable for ties).
    ``lexical``: BM25 coverage in [0, 1] (:func:`coverage`); ``dense``: raw similarities."""
    lex_n = {k: min(1.0, max(0.0, v)) for k, v in lexical.items()}
    dense_n = dict(zip(dense, normalise(list(dense.values())), strict=True))
    keys = list(dict.fromkeys([*lexical, *dense]))
    out = [
        Fused(
            key=k,
            relevance=(1 - dense_weight) * lex_n.get(k, 0.0) + dense_weight * dense_n.get(k, 0.0),
            lexical=lex_n.get(k, 0.0),
            dense=dense_n.get(k, 0.0),
        )
        for k in keys
    ]
    order = {k: i for i, k in enumerate(keys)}
    out.sort(key=lambda f: (-f.relevance, order[f.key]))
    return out
