"""The pure fusion of transcript search's BM25 and dense scores: scores keep their gaps,
coverage means a share of the query's weight, the order is deterministic."""

from __future__ import annotations

import math

from memstream.projections.messages.fusion import coverage, fuse, idf, normalise, query_weight


def test_normalise_maps_by_spread_and_handles_ties() -> None:
    out = normalise([0.80, 0.81, 0.82, 0.90])
    assert all(0.0 <= x <= 1.0 for x in out)
    assert out == sorted(out) and out[-1] - out[-2] > out[1] - out[0]  # the gap is kept
    assert normalise([0.7, 0.7]) == [1.0, 1.0]
    assert normalise([0.0, 0.0]) == [0.0, 0.0]  # no match at all stays 0
    assert normalise([]) == []


def test_coverage_is_a_share_of_the_query_weight() -> None:
    n = 1_000.0
    common, rare = idf(n, 500), idf(n, 2)
    weight = query_weight(n, [500, 2])
    assert math.isclose(weight, common + rare)
    assert coverage(common, weight) < 0.15 < 0.8 < coverage(rare, weight)
    assert coverage(10 * weight, weight) == 1.0 and coverage(1.0, 0.0) == 0.0


def test_fuse_dense_decides_when_bm25_matched_only_a_common_word() -> None:
    # four turns share only the speaker's name with the question; the dense side knows
    lexical = {"a": 0.05, "b": 0.05, "c": 0.05, "evidence": 0.05}
    dense = {"a": 0.80, "b": 0.80, "c": 0.81, "evidence": 0.88}
    fused = fuse(lexical, dense)
    assert fused[0].key == "evidence"
    assert 0.0 <= fused[-1].relevance <= fused[0].relevance <= 1.0


def test_fuse_a_clear_keyword_match_beats_a_near_dense_neighbour() -> None:
    lexical = {"keyword": 0.9, "x": 0.0, "y": 0.0, "z": 0.0}
    dense = {"keyword": 0.82, "x": 0.84, "y": 0.80, "z": 0.79}
    assert fuse(lexical, dense)[0].key == "keyword"


def test_fuse_is_deterministic_and_keeps_missing_scores_at_zero() -> None:
    lexical = {"a": 0.5, "b": 0.5}
    dense = {"c": 0.9}
    first = fuse(lexical, dense)
    assert first == fuse(lexical, dense)
    by_key = {f.key: f for f in first}
    assert by_key["c"].lexical == 0.0 and by_key["a"].dense == 0.0
    assert [f.key for f in first] == ["c", "a", "b"]  # a and b tie: the caller's order
