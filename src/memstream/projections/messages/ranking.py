"""Transcript search's ranking rules over posting lists (pure: no I/O).

The search (``MessageStore.lexical_search``) runs in three steps: the exact statistics of
the query's terms (:func:`~.postings.term_stats_sql`), BM25's best ``k`` messages
(:func:`~.postings.score_sql`), then the proximity bonus and the final order
(:func:`rerank`). This module decides the second step's shape and does the third.

**Pruning (max-score).** A message's BM25 is a sum of one contribution per query term it
holds, and a term's contribution is at most :func:`impact_bound` (its idf at its highest tf
in its shortest message). Sort the terms rarest first; the *essential* terms are a prefix,
the others are the common rest. A message holding none of the essential terms scores at
most the sum of the rest's bounds. So when BM25's ``k``-th best among the messages holding
an essential term scores *more* than that sum, no other message can enter the best ``k``
(not even on a tie, which would go to the newer message), and the best ``k`` are exact
while the common terms' postings were read only for the essential candidates.
:func:`plan` picks the prefix; :func:`exact_with` checks the condition on the result, and a
failed check names the prefix that is sure to pass (the ``k``-th score only grows as terms
are added).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from memstream.projections.messages.fusion import idf

BOUND_MARGIN: Final = 1e-9
"""Relative slack on the bound: ClickHouse and Python may round ``log`` a last bit apart."""

DIRECT_MAX_TERMS: Final = 2
"""Queries of at most this many terms skip the statistics statement and score every
candidate, df counted in the same query (:func:`scores_directly`). The statistics read every
posting of every query term (``FINAL``), so with two terms they cost about what scoring all
candidates saves, and the plan takes both terms for most two-word queries anyway. Measured at
1M messages, two words over all threads, against main in 3 same-run A/Bs: p50 0.72-0.73x,
p99 0.67-0.83x; three words scored the same way had p99 0.96-1.35x of pruning, so they
still plan (docs/transcript-search.md, "Two words: one statement")."""


@dataclass(frozen=True, slots=True)
class TermStats:
    """A query term over the visible messages in scope."""

    df: int
    """How many messages hold it."""
    max_tf: int
    """Its highest count in one message."""
    min_len: int
    """The length (in terms) of the shortest message holding it."""
    max_part: float | None = None
    """Its highest *tf part* in one message: ``tf (k1 + 1) / (tf + k1 (1 - b + b len /
    avg))``, BM25's factor after the idf, at that message's tf and length. When known, the
    bound is exactly the term's highest contribution (tighter than ``max_tf`` in
    ``min_len``, which may come from two different messages)."""


def impact_bound(stats: TermStats, n_docs: float, avg_len: float, k1: float, b: float) -> float:
    """The most one term can add to a message's BM25 (never below 0: a message without the
    term gets 0 from it)."""
    if stats.df <= 0:
        return 0.0
    if stats.max_part is not None:
        return max(0.0, idf(n_docs, float(stats.df)) * stats.max_part)
    tf = float(stats.max_tf)
    norm = k1 * (1 - b + b * stats.min_len / max(avg_len, 1.0))
    return max(0.0, idf(n_docs, float(stats.df)) * tf * (k1 + 1) / (tf + norm))


def rarest_first(words: Sequence[str], stats: Mapping[str, TermStats]) -> list[str]:
    """The query terms some visible message holds, rarest first (ties: query order)."""
    held = [w for w in words if w in stats and stats[w].df > 0]
    return sorted(held, key=lambda w: stats[w].df)


def plan(
    order: Sequence[str],
    stats: Mapping[str, TermStats],
    bounds: Mapping[str, float],
    k: int,
    n_docs: float,
) -> list[str]:
    """The first essential prefix to try: the shortest prefix of the rarest terms held by at
    least ``k`` messages together (fewer cannot fill the best ``k``) whose rest's bounds
    sum below what the ``k``-th best score is likely to reach: the idf of its commonest term
    (about what a message holding that term once scores), or, when the prefix's messages
    are expected (terms independent) to hold one of the rest in ``2k`` messages, that idf
    plus the idf of the commonest of the rest (such messages hold both). All terms when none
    is. Only a guess: :func:`exact_with` checks the result, and a wrong guess costs a second
    scoring, never a wrong ranking."""
    total = 0
    for i, w in enumerate(order):
        total += stats[w].df
        if total < k:
            continue
        rest_terms = order[i + 1 :]
        rest = math.fsum(bounds[v] for v in rest_terms)
        likely = idf(n_docs, float(stats[w].df))
        if rest_terms and n_docs > 0:
            none_of_rest = math.prod(max(0.0, 1 - stats[v].df / n_docs) for v in rest_terms)
            if total * (1 - none_of_rest) >= 2 * k:
                likely += idf(n_docs, float(stats[rest_terms[-1]].df))
        if rest < likely:
            return list(order[: i + 1])
    return list(order)


def scores_directly(n_terms: int, one_thread: bool) -> bool:
    """Whether a search scores every candidate in one statement (df counted in the query)
    instead of reading the terms' statistics to plan max-score pruning: one thread holds
    few messages, and a query of at most :data:`DIRECT_MAX_TERMS` terms gains less from
    pruning than the statistics cost. Exact either way: only the cost differs."""
    return one_thread or n_terms <= DIRECT_MAX_TERMS


def every_term_essential(
    words: Sequence[str],
    hints: Mapping[str, TermStats],
    n_docs: float,
    avg_len: float,
    k1: float,
    b: float,
    k: int,
) -> bool:
    """Whether :func:`plan` would make every held term essential, from ``hints`` (a term's
    statistics as a previous search saw them; approximate). Then the statistics statement
    is pure overhead: scoring every candidate with df counted in the same query is exact
    whatever the hints say, so a stale hint can only pick the slower path, never change a
    ranking."""
    order = rarest_first(words, hints)
    bounds = {w: impact_bound(hints[w], n_docs, avg_len, k1, b) for w in order}
    return len(plan(order, hints, bounds, k, n_docs)) == len(order)


def single_term_stats(df: int, scores: Sequence[float], n_docs: float) -> TermStats:
    """A one-word query's term statistics recovered from its best scores (BM25 of one term
    is its idf times the tf part; ``scores`` best first): a hint for
    :func:`every_term_essential`, not exact to the last bit."""
    if df <= 0 or not scores:
        return TermStats(0, 0, 0, 0.0)
    term_idf = idf(n_docs, float(df))
    if term_idf <= 0:
        return TermStats(df, 0, 0, 0.0)
    return TermStats(df, 0, 0, scores[0] / term_idf)


def exact_with(
    order: Sequence[str],
    n_essential: int,
    bounds: Mapping[str, float],
    kth_score: float | None,
) -> int:
    """0 when BM25's best ``k`` computed with the first ``n_essential`` terms of ``order``
    as essential are the exact best ``k`` (``kth_score``: the ``k``-th best score found,
    None when fewer than ``k`` messages were found); otherwise the number of essential
    terms to retry with, which is sure to be exact."""
    if n_essential >= len(order):
        return 0
    if kth_score is None:
        return len(order)
    rest = math.fsum(bounds[w] for w in order[n_essential:])
    if rest * (1 + BOUND_MARGIN) < kth_score:
        return 0
    for n in range(n_essential + 1, len(order) + 1):
        if math.fsum(bounds[w] for w in order[n:]) * (1 + BOUND_MARGIN) < kth_score:
            return n
    return len(order)


def proximity(words: Sequence[str], positions: Sequence[Sequence[int]], window: int) -> float:
    """The share of consecutive query-term pairs (a, b) for which some b follows some a
    within ``window`` positions (``positions[i]``: where ``words[i]`` occurs)."""
    pairs = len(words) - 1
    if pairs <= 0:
        return 0.0
    together = 0
    for i in range(pairs):
        second = set(positions[i + 1])
        if second and any(p + d in second for p in positions[i] for d in range(1, window + 1)):
            together += 1
    return together / pairs


@dataclass(frozen=True, slots=True)
class Scored:
    """One of BM25's best, with its relevance."""

    thread_id: str
    offset: int
    created_ms: int
    bm25: float
    proximity: float
    relevance: float
    tf: tuple[int, ...]
    length: int


def rerank(
    words: Sequence[str],
    rows: Sequence[tuple[str, int, int, float, Sequence[int], int, Sequence[Sequence[int]]]],
    window: int,
    boost: float,
    limit: int,
) -> list[Scored]:
    """The best ``limit`` of BM25's best (``rows``: thread_id, offset, created_ms, bm25, tf,
    length, positions per word), by relevance = bm25 x (1 + boost x proximity), then newest,
    then higher offset, then thread id."""
    scored = []
    for thread_id, offset, created_ms, bm25, tf, length, positions in rows:
        prox = proximity(words, positions, window)
        scored.append(
            Scored(
                thread_id,
                offset,
                created_ms,
                bm25,
                prox,
                bm25 * (1 + boost * prox),
                tuple(tf),
                length,
            )
        )
    scored.sort(key=lambda s: (-s.relevance, -s.created_ms, -s.offset, s.thread_id))
    return scored[:limit]
