"""Transcript search over posting lists on real chdb: pruning never changes the ranking,
copies of a message (replays, redeliveries before a merge) count once, erasure removes a
thread's postings, and a table made before the postings is filled at start."""

from __future__ import annotations

import random
from dataclasses import replace

from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.fusion import idf
from memstream.projections.messages.postings import POSTINGS_TABLE, score_sql, term_stats_sql
from memstream.projections.messages.ranking import TermStats, impact_bound, plan, rarest_first
from memstream.projections.messages.sql import SearchSpec, query_words
from memstream.schemas.records import Caller
from tests.integration.test_transcript_search import m, project, search

WORDS = [f"w{i}" for i in range(60)]


def _corpus(rng: random.Random) -> list:  # type: ignore[type-arg]
    """1,200 turns over 12 threads, three of them private, words Zipf-like (w0 in most
    turns, w59 in a few), lengths 3 to 40 words, some words repeated."""
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    msgs = []
    for t in range(12):
        for o in range(100):
            n = rng.randint(3, 40)
            text = " ".join(rng.choices(WORDS, weights, k=n))
            user = f"u{t}" if t % 4 == 3 else None
            msgs.append(m(f"t{t}", o, "user", text, user=user, minutes=t * 100 + o))
    return msgs


async def _exhaustive(store: MessageStore, spec: SearchSpec) -> list[tuple[str, int, float]]:
    """BM25's best 100 with every term essential (no pruning): the reference."""
    n_docs, avg = await store.collection_stats(spec.account_id, spec.agent_id)
    sql, params = score_sql(store.database, spec, None, (n_docs, avg), spec.words, 100)
    rows = await store.engine.rows(sql, params)
    return [(str(r[0]), int(str(r[1])), float(str(r[3]))) for r in rows]


async def test_pruned_search_ranks_like_scoring_every_candidate(
    message_store: MessageStore,
) -> None:
    rng = random.Random(7)
    await project(message_store, _corpus(rng))
    pruned = hinted = 0
    for q in range(40):
        words = " ".join(rng.sample(WORDS, rng.randint(1, 4)))
        caller_user = "u3" if q % 3 == 0 else None
        spec = SearchSpec("acc", "ag", caller_user, query_words(words), 100, explain=True)
        # what the pruned search would plan (to know the pruning was exercised)
        n_docs, avg = await message_store.collection_stats("acc", "ag")
        sql, params = term_stats_sql(message_store.database, spec, avg)
        stats = {
            str(t): TermStats(int(str(d)), int(str(f)), int(str(ln)), float(str(x)))
            for t, d, f, ln, x in await message_store.engine.rows(sql, params)
        }
        order = rarest_first(spec.words, stats)
        bounds = {w: impact_bound(stats[w], n_docs, avg, 1.2, 0.75) for w in order}
        planned = plan(order, stats, bounds, 100, n_docs)
        pruned += len(planned) < len(order)

        reference = await _exhaustive(message_store, spec)
        # twice: the second time every term has a hint (words recur, so the first time
        # may too), and a plan taking every term skips the statistics statement
        for _ in range(2):
            one_statement = message_store._plans_every_term(spec, n_docs, avg, 100)  # noqa: SLF001
            hinted += one_statement
            hits = await message_store.lexical_search(spec)
            # the same best 100 by BM25, in the same order (before the proximity bonus)
            by_bm25 = sorted(
                hits,
                key=lambda h: (-float(h.explain["bm25"]), -h.created_at.timestamp(), -h.offset),  # type: ignore[index,arg-type]
            )
            assert [(h.thread_id, h.offset) for h in by_bm25] == [(t, o) for t, o, _ in reference]
        if caller_user is None:  # private threads stay out of hits and of df
            assert all(h.thread_id not in {"t3", "t7", "t11"} for h in hits)
    assert pruned >= 5  # the max-score path ran, not only the exhaustive one
    assert hinted >= 5  # and some searches took every term in one statement, from hints


async def test_term_statistics_give_each_term_s_highest_single_term_score(
    message_store: MessageStore,
) -> None:
    """idf x max_part is a term's best score alone: the bound the plan relies on is reached,
    for every caller (private threads counted only for their users)."""
    await project(message_store, _corpus(random.Random(11)))
    n_docs, avg = await message_store.collection_stats("acc", "ag")
    for caller_user in (None, "u3"):
        spec = SearchSpec("acc", "ag", caller_user, ("w0", "w9", "w40", "w59"), 10)
        sql, params = term_stats_sql(message_store.database, spec, avg)
        rows = await message_store.engine.rows(sql, params)
        assert {str(r[0]) for r in rows} == set(spec.words)
        for t, df, _tf, _ln, top in rows:
            one = replace(spec, words=(str(t),))
            sql, params = score_sql(
                message_store.database, one, None, (n_docs, avg), one.words, 10_000
            )
            scores = [float(str(r[3])) for r in await message_store.engine.rows(sql, params)]
            assert len(scores) == int(str(df))
            best = idf(n_docs, float(str(df))) * float(str(top))
            assert abs(scores[0] - best) <= 1e-9 * scores[0]


async def test_copies_of_a_message_count_once(chdb_engine: ChdbEngine) -> None:
    import uuid

    once = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    twice = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    msgs = [
        m("a", 0, "user", "lisbon flights in may"),
        m("a", 1, "assistant", "lisbon is sunny, flights are cheap"),
        m("b", 0, "user", "flights to porto"),
    ]
    for store in (once, twice):
        await store.ensure_schema()
        await project(store, msgs)
    await project(twice, msgs)  # a replay on top, before any merge
    spec = SearchSpec("acc", "ag", None, query_words("lisbon flights"), 10, explain=True)
    a, b = await once.lexical_search(spec), await twice.lexical_search(spec)
    assert [(h.thread_id, h.offset) for h in a] == [(h.thread_id, h.offset) for h in b]
    for hits in (a, b):  # each message counted once in the query terms' statistics
        assert hits[0].explain is not None and hits[0].explain["terms"] == {
            "lisbon": {"tf": 1, "df": 2},
            "flight": {"tf": 1, "df": 3},
        }
    # (the agent's message count, a cached count() of rows, still counts copies until a
    # merge, as before the posting lists)
    scoped = replace(spec, thread_id="a")
    assert [h.offset for h in await twice.lexical_search(scoped)] == [
        h.offset for h in await once.lexical_search(scoped)
    ]


async def test_erasure_removes_the_thread_s_postings(message_store: MessageStore) -> None:
    await project(
        message_store,
        [m("gone", 0, "user", "secret kumquat recipe"), m("kept", 0, "user", "kumquat jam")],
    )
    await message_store.erase_thread("acc", "ag", "gone")
    rows = await message_store.engine.rows(
        f"SELECT count() FROM {message_store.database}.{POSTINGS_TABLE} "
        "WHERE thread_id = {t:String}",
        {"t": "gone"},
    )
    assert int(str(rows[0][0])) == 0
    assert await search(message_store, Caller("acc", "ag", None), query="kumquat") == [("kept", 0)]
    assert await search(message_store, Caller("acc", "ag", None), query="secret recipe") == []


async def test_a_table_without_postings_is_filled_at_start(message_store: MessageStore) -> None:
    await project(message_store, [m("old", 0, "user", "we adopted kittens last spring")])
    db = message_store.database
    # the layout before the posting lists: no view, no table
    await message_store.engine.command(f"DROP VIEW {db}.message_terms_mv")
    await message_store.engine.command(f"DROP TABLE {db}.{POSTINGS_TABLE}")
    await message_store.ensure_schema()
    assert await search(message_store, query="kitten") == [("old", 0)]
    await project(message_store, [m("new", 0, "user", "kittens again")])  # the view is back
    assert set(await search(message_store, query="kitten")) == {("new", 0), ("old", 0)}
