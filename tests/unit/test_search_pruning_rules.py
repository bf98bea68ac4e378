"""The pure rules of transcript search's ranking over posting lists
(:mod:`memstream.projections.messages.ranking`): the bound on a term's contribution holds
for every message, the max-score check only passes when no other message can enter the
best k, the proximity bonus as the scan over ``messages`` computed it, and the final order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memstream.projections.messages.fusion import bm25
from memstream.projections.messages.ranking import (
    TermStats,
    every_term_essential,
    exact_with,
    impact_bound,
    plan,
    proximity,
    rarest_first,
    rerank,
    scores_directly,
    single_term_stats,
)

K1, B = 1.2, 0.75


@given(
    df=st.integers(1, 10_000),
    extra=st.integers(0, 10_000),
    max_tf=st.integers(1, 50),
    tf=st.integers(1, 50),
    min_len=st.integers(1, 500),
    longer=st.integers(0, 500),
    avg_len=st.floats(1.0, 200.0),
)
def test_the_bound_is_never_below_a_message_s_contribution(
    df: int, extra: int, max_tf: int, tf: int, min_len: int, longer: int, avg_len: float
) -> None:
    n_docs = float(df + extra)
    tf = min(tf, max_tf)
    length = max(min_len + longer, tf)
    got = bm25([tf], [float(df)], n_docs, length, avg_len, K1, B)
    assert got <= impact_bound(TermStats(df, max_tf, min_len), n_docs, avg_len, K1, B) + 1e-12


@given(
    df=st.integers(1, 10_000),
    extra=st.integers(0, 10_000),
    tf=st.integers(1, 50),
    length=st.integers(1, 1_000),
    slack=st.floats(0.0, 2.0),
    avg_len=st.floats(1.0, 200.0),
)
def test_the_bound_from_the_highest_tf_part_is_never_below_a_message_s_contribution(
    df: int, extra: int, tf: int, length: int, slack: float, avg_len: float
) -> None:
    n_docs = float(df + extra)
    length = max(length, tf)
    part = tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / avg_len))
    got = bm25([tf], [float(df)], n_docs, length, avg_len, K1, B)
    stats = TermStats(df, 1, 10_000, max_part=part + slack)  # max_tf/min_len then unused
    assert got <= impact_bound(stats, n_docs, avg_len, K1, B) * (1 + 1e-12)


def test_terms_no_one_holds_are_left_out_and_the_rarest_come_first() -> None:
    stats = {"common": TermStats(900, 3, 5), "rare": TermStats(4, 1, 9), "mid": TermStats(80, 2, 7)}
    assert rarest_first(["common", "missing", "rare", "mid"], stats) == ["rare", "mid", "common"]
    assert rarest_first(["missing"], stats) == []


def test_the_first_prefix_holds_k_messages_and_bounds_the_rest_below_its_idf() -> None:
    stats = {"a": TermStats(40, 1, 10), "b": TermStats(70, 1, 10), "c": TermStats(5_000, 1, 10)}
    order = ["a", "b", "c"]
    bounds = {"a": 5.0, "b": 4.0, "c": 0.5}
    # a alone holds 40 < 100 messages; a+b hold 110 and c's bound is small
    assert plan(order, stats, bounds, 100, 10_000.0) == ["a", "b"]
    assert plan(order, stats, {**bounds, "c": 50.0}, 100, 10_000.0) == order
    assert plan(order, stats, bounds, 1_000_000, 10_000.0) == order


def test_a_prefix_expected_to_hold_the_rest_in_2k_messages_counts_both_idfs() -> None:
    # rare alone: idf ~4.75 < common's bound 5.6; 8,593 x 3.3 % = 282 >= 200 messages are
    # expected to hold both, scoring about 4.75 + 3.41 > 5.6
    stats = {"rare": TermStats(8_593, 2, 5), "common": TermStats(32_839, 3, 4)}
    bounds = {"rare": 7.0, "common": 5.6}
    assert plan(["rare", "common"], stats, bounds, 100, 1_000_000.0) == ["rare"]
    # 400 x 3.3 % = 13 expected together: the single idf (~7.8) must beat the bound alone
    few = {**stats, "rare": TermStats(400, 2, 5)}
    assert plan(["rare", "common"], few, {**bounds, "common": 8.0}, 100, 1_000_000.0) == [
        "rare",
        "common",
    ]


def test_hints_say_whether_the_plan_takes_every_term() -> None:
    stats = {"rare": TermStats(8_593, 2, 5, 1.4), "common": TermStats(32_839, 3, 4, 1.6)}
    words = ["common", "rare", "absent"]
    hints = {**stats, "absent": TermStats(0, 0, 0, 0.0)}
    # 282 messages expected to hold both: the rare term alone is essential
    assert not every_term_essential(words, hints, 1_000_000.0, 14.0, K1, B, 100)
    # 3,000 x 3.3 % = 98 together; idf 5.81 below the common bound 3.42 x 1.8
    few = {
        **hints,
        "rare": TermStats(3_000, 2, 5, 1.4),
        "common": TermStats(32_839, 3, 4, 1.8),
    }
    assert every_term_essential(words, few, 1_000_000.0, 14.0, K1, B, 100)


@given(
    df=st.integers(1, 5_000),
    tfs=st.lists(st.integers(1, 5), min_size=1, max_size=300),
    length=st.integers(5, 40),
)
def test_a_one_word_search_s_scores_give_back_its_tf_parts(
    df: int, tfs: list[int], length: int
) -> None:
    n_docs, avg = 10_000.0, 14.0
    scores = sorted(
        (bm25([tf], [float(df)], n_docs, length, avg, K1, B) for tf in tfs), reverse=True
    )
    got = single_term_stats(df, scores, n_docs)
    top = max(tfs) * (K1 + 1) / (max(tfs) + K1 * (1 - B + B * length / avg))
    assert abs((got.max_part or 0) - top) <= 1e-9 * top
    assert single_term_stats(0, [], n_docs).df == 0


def test_the_check_passes_only_when_the_rest_cannot_reach_the_kth_score() -> None:
    order = ["rare", "mid", "common"]
    bounds = {"rare": 9.0, "mid": 3.0, "common": 1.0}
    assert exact_with(order, 3, bounds, None) == 0  # every term essential: always exact
    assert exact_with(order, 1, bounds, 4.5) == 0  # 3 + 1 < 4.5
    assert exact_with(order, 1, bounds, 4.0) == 2  # a tie could enter: add mid, then 1 < 4
    assert exact_with(order, 1, bounds, 0.5) == 3  # even common alone could enter
    assert exact_with(order, 1, bounds, None) == 3  # fewer than k found: all terms


def test_proximity_is_the_share_of_consecutive_pairs_close_in_order() -> None:
    words = ["support", "group", "tuesday"]
    assert proximity(words, [[2], [3], [9]], 3) == 0.5  # support->group at +1
    assert proximity(words, [[2], [5], [8]], 3) == 1.0  # +3 and +3
    assert proximity(words, [[6], [5], []], 3) == 0.0  # out of order, and absent
    assert proximity(["one"], [[1]], 3) == 0.0


def test_rerank_orders_by_relevance_then_newest_then_offset_then_thread() -> None:
    words = ["a", "b"]
    rows = [
        ("t2", 1, 100, 2.0, [1, 1], 10, [[1], [2]]),  # together: 2.0 x 1.5 = 3.0
        ("t1", 5, 300, 3.0, [1, 0], 10, [[1], []]),  # 3.0, newer
        ("t3", 4, 300, 3.0, [1, 0], 10, [[1], []]),  # 3.0, same time, lower offset
        ("t0", 4, 300, 3.0, [1, 0], 10, [[1], []]),  # same but thread t0 < t3
        ("t4", 9, 999, 1.0, [1, 0], 10, [[1], []]),
    ]
    ranked = rerank(words, rows, 3, 0.5, 4)
    assert [(r.thread_id, r.offset) for r in ranked] == [("t1", 5), ("t0", 4), ("t3", 4), ("t2", 1)]
    assert ranked[3].relevance == 3.0 and ranked[3].proximity == 1.0


def test_only_searches_of_three_words_or_more_over_all_threads_plan_pruning() -> None:
    # one thread, or one or two words: every candidate scored, no statistics statement
    assert all(scores_directly(n, one_thread=True) for n in range(1, 6))
    assert scores_directly(1, one_thread=False)
    assert scores_directly(2, one_thread=False)
    assert not any(scores_directly(n, one_thread=False) for n in range(3, 8))
