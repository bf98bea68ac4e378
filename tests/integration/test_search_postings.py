"""Transcript search over posting lists on real chdb: pruning never changes the ranking,
copies of a message (replays, redeliveries before a merge) count once, erasure removes a
thread's postings, a table made before the postings is filled at start, the view's rows are
those of grouping every (message, term), and a replay's deferred postings are filled once by
the seal."""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from dataclasses import replace

from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.engine import Row
from memstream.projections.messages.fusion import idf
from memstream.projections.messages.postings import (
    POSTINGS_TABLE,
    POSTINGS_VIEW,
    POSTINGS_VIEW_VERSION,
    grouped_postings_select,
    one_term_sql,
    postings_table_ddl,
    score_sql,
    term_stats_sql,
)
from memstream.projections.messages.ranking import TermStats, impact_bound, plan, rarest_first
from memstream.projections.messages.sql import SearchSpec, SqlParam, query_words
from memstream.projections.messages.text_table import TEXT_TABLE
from memstream.schemas.records import Caller, Message
from tests.integration.test_transcript_search import explained, m, project, search

WORDS = [f"w{i}" for i in range(60)]


def _corpus(rng: random.Random) -> list[Message]:
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
                key=lambda h: (-float(explained(h)["bm25"]), -h.created_at.timestamp(), -h.offset),
            )
            assert [(h.thread_id, h.offset) for h in by_bm25] == [(t, o) for t, o, _ in reference]
        if caller_user is None:  # private threads stay out of hits and of df
            assert all(h.thread_id not in {"t3", "t7", "t11"} for h in hits)
    assert pruned >= 5  # the max-score path ran, not only the exhaustive one
    assert hinted >= 5  # and some searches took every term in one statement, from hints


async def test_two_word_searches_read_no_term_statistics(message_store: MessageStore) -> None:
    """A one- or two-word search over all threads is one scoring statement and the text
    fetch (no statistics statement: :func:`~.ranking.scores_directly`), and still ranks
    exactly like scoring every candidate, private threads out of hits and of df; three
    words still read the statistics to plan the pruning."""
    rng = random.Random(11)
    await project(message_store, _corpus(rng))
    statements: list[str] = []
    rows = message_store.engine.rows

    async def counted(sql: str, params: Mapping[str, SqlParam]) -> list[Row]:
        statements.append(sql)
        return await rows(sql, params)

    message_store.engine.rows = counted  # type: ignore[method-assign]  # counts the statements
    await message_store.collection_stats("acc", "ag")
    for q in range(12):
        n_words = 1 + q % 3
        words = " ".join(rng.sample(WORDS, n_words))
        caller_user = "u3" if q % 2 == 0 else None
        spec = SearchSpec("acc", "ag", caller_user, query_words(words), 100, explain=True)
        reference = await _exhaustive(message_store, spec)
        n_docs, avg = await message_store.collection_stats("acc", "ag")
        hinted = message_store._plans_every_term(spec, n_docs, avg, 100)  # noqa: SLF001
        statements.clear()
        hits = await message_store.lexical_search(spec)
        stats_read = sum(" FINAL" in sql for sql in statements)
        assert stats_read == (0 if n_words <= 2 or hinted else 1), (words, statements)
        by_bm25 = sorted(
            hits,
            key=lambda h: (-float(explained(h)["bm25"]), -h.created_at.timestamp(), -h.offset),
        )
        assert [(h.thread_id, h.offset) for h in by_bm25] == [(t, o) for t, o, _ in reference]
        if caller_user is None:
            assert all(h.thread_id not in {"t3", "t7", "t11"} for h in hits)


async def test_one_word_scores_like_the_general_statement_with_unmerged_copies(
    message_store: MessageStore,
) -> None:
    """A one-word search's statement (``one_term_sql``: no per-message arrays, tf from the
    posting's array size) gives the rows of the general scoring statement exactly: same
    messages, order, BM25, tf, length and df, for a caller with and without private threads,
    over all threads and in one thread, while a redelivered copy of the corpus is not merged
    yet (each message still counted and scored once)."""
    rng = random.Random(5)
    corpus = _corpus(rng)
    await project(message_store, corpus)
    await project(message_store, corpus[::3])  # redelivered: copies until a merge
    n_docs, avg = await message_store.collection_stats("acc", "ag")
    copies = await message_store.engine.rows(
        f"SELECT count() - uniqExact(term, thread_id, `offset`) FROM {message_store.database}"
        ".message_terms WHERE account_id = 'acc'",
        {},
    )
    assert int(str(copies[0][0])) > 0  # the copies are there, unmerged
    compared = 0
    sample = WORDS[:6] + WORDS[20:24] + WORDS[-6:]  # common, middling and rare words
    for word in sample:
        for caller_user in (None, "u3"):
            for thread in (None, "t3", "t4"):
                spec = SearchSpec("acc", "ag", caller_user, (word,), 10, thread_id=thread)
                sql, params = score_sql(
                    message_store.database, spec, None, (n_docs, avg), (word,), 100
                )
                general = await message_store.engine.rows(sql, params)
                sql, params = one_term_sql(message_store.database, spec, (n_docs, avg), 100)
                one = await message_store.engine.rows(sql, params)

                def key(rows: list[Row]) -> list[tuple[str, int, int, float, str, int, str]]:
                    return [
                        (str(r[0]), int(str(r[1])), int(str(r[2])), round(float(str(r[3])), 9))
                        + (str(r[4]), int(str(r[5])), str(r[7]))
                        for r in rows
                    ]

                assert key(one) == key(general), (word, caller_user, thread)
                compared += bool(general)
    assert compared >= 3 * len(sample)


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


async def test_many_threads_are_erased_together_and_only_they(
    message_store: MessageStore,
) -> None:
    """One erasure of several threads (a user's): their rows go from every table, the
    count is theirs, ids with quotes and backslashes are quoted, another agent's thread of
    the same id and the other threads stay; erasing again removes nothing."""
    odd = "t'; DROP TABLE messages; --\\"
    msgs = [
        m(t, o, "user", f"kumquat {t} turn {o}", user="u1")
        for t in ("a", "b", odd, "kept")
        for o in range(3)
    ]
    await project(message_store, msgs)
    other_agent = [replace(x, agent_id="ag2") for x in msgs if x.thread_id == "a"]
    await project(message_store, other_agent)
    gone = [("acc", "ag", "a"), ("acc", "ag", "b"), ("acc", "ag", odd), ("acc", "ag", "a")]
    assert await message_store.erase_threads(gone) == 9
    assert await message_store.erase_threads(gone) == 0
    db = message_store.database
    for table in ("messages", POSTINGS_TABLE, "thread_users", TEXT_TABLE):
        left = await message_store.engine.rows(
            f"SELECT DISTINCT agent_id, thread_id FROM {db}.{table} ORDER BY 1, 2", {}
        )
        assert [(str(r[0]), str(r[1])) for r in left] == [("ag", "kept"), ("ag2", "a")]
    hits = await search(message_store, Caller("acc", "ag", "u1"), query="kumquat turn")
    assert set(hits) == {("kept", 0), ("kept", 1), ("kept", 2)}


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


async def _postings(store: MessageStore) -> list[tuple[object, ...]]:
    return await store.engine.rows(
        f"SELECT account_id, agent_id, term, thread_id, `offset`, created_at, doc_len, "
        f"positions FROM {store.database}.{POSTINGS_TABLE} FINAL "
        "ORDER BY account_id, agent_id, term, thread_id, `offset`",
        {},
    )


async def test_postings_are_the_rows_of_grouping_every_message_term(
    message_store: MessageStore,
) -> None:
    """The view's SQL (sort and split each message's terms, no GROUP BY) gives exactly the
    rows that grouping ``ARRAY JOIN terms`` by (message, term) gave: repeated words, words
    that stem alike, a message with no term at all."""
    rng = random.Random(11)
    msgs = _corpus(rng)[:300] + [
        m("x", 0, "user", "flights flight flying FLIGHTS, lisbon lisbon"),
        m("x", 1, "assistant", "... !!! ..."),  # no term
        m("x", 2, "user", "Ünïcode ünïcode naïve café cafés"),
    ]
    await project(message_store, msgs)
    db = message_store.database
    reference = f"t_{uuid.uuid4().hex[:12]}"
    await message_store.engine.command(postings_table_ddl(db, reference))
    await message_store.engine.command(
        f"INSERT INTO {db}.{reference} {grouped_postings_select(f'{db}.messages')}"
    )
    grouped = await message_store.engine.rows(
        f"SELECT account_id, agent_id, term, thread_id, `offset`, created_at, doc_len, "
        f"positions FROM {db}.{reference} FINAL "
        "ORDER BY account_id, agent_id, term, thread_id, `offset`",
        {},
    )
    ours = await _postings(message_store)
    assert len(ours) > 1_000
    assert ours == grouped
    assert not [r for r in ours if r[3] == "x" and r[4] == 1]  # no posting for no term


async def test_deferred_postings_are_filled_once_by_the_seal(chdb_engine: ChdbEngine) -> None:
    """A replay's target: loaded without the view (no postings yet), sealed into the same
    postings as a table written through the view; a second seal changes nothing, and later
    inserts go through the view."""
    msgs = _corpus(random.Random(3))[:200]
    live = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    target = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    await live.ensure_schema()
    await target.ensure_schema(defer_postings=True)
    await target.ensure_schema(defer_postings=True)  # a resumed replay: still deferred
    for store in (live, target):
        await project(store, msgs[:150])
    assert await _postings(target) == []
    await target.seal_postings()
    await target.seal_postings()
    for store in (live, target):
        await project(store, msgs[150:])  # the hand-over's and the live projector's writes
    assert await _postings(target) == await _postings(live)
    total = await target.engine.rows(
        f"SELECT count() FROM {target.database}.{POSTINGS_TABLE}", {}
    )  # each posting once, even before a merge
    assert int(str(total[0][0])) == len(await _postings(live))
    await target.ensure_schema(defer_postings=True)  # sealed stays sealed
    await project(target, [m("z", 0, "user", "zebra")])
    assert await search(target, query="zebra") == [("z", 0)]


async def test_a_view_of_an_earlier_release_is_upgraded_at_start(
    message_store: MessageStore,
) -> None:
    """A deployment whose view still runs the grouping SQL (no version comment) gets the
    current SQL in place at its next start: the same postings, before and after, and nothing
    of its stored messages lost."""
    db = message_store.database
    await project(message_store, [m("old", 0, "user", "kittens kittens in the spring")])
    await message_store.engine.command(f"DROP VIEW {db}.{POSTINGS_VIEW}")
    await message_store.engine.command(
        f"CREATE MATERIALIZED VIEW {db}.{POSTINGS_VIEW} TO {db}.{POSTINGS_TABLE} "
        f"AS {grouped_postings_select(f'{db}.messages')}"
    )
    await project(message_store, [m("mid", 0, "user", "a kitten, then another kitten")])
    before = await _view(message_store)
    assert before[0] == "" and "GROUP BY" in before[1]
    await message_store.ensure_schema()
    await message_store.ensure_schema()  # idempotent: already current
    after = await _view(message_store)
    assert after[0] == POSTINGS_VIEW_VERSION and "GROUP BY" not in after[1]
    await project(message_store, [m("new", 0, "user", "kittens again, kitten")])
    assert set(await search(message_store, query="kitten")) == {
        ("old", 0),
        ("mid", 0),
        ("new", 0),
    }
    postings = [r for r in await _postings(message_store) if r[2] == "kitten"]
    assert [(r[3], list(r[7])) for r in postings] == [  # type: ignore[call-overload]  # a Row cell: the positions array
        ("mid", [2, 5]),
        ("new", [1, 3]),
        ("old", [1, 2]),
    ]


async def _view(store: MessageStore) -> tuple[str, str]:
    rows = await store.engine.rows(
        "SELECT comment, as_select FROM system.tables WHERE database = {d:String} "
        "AND name = {v:String}",
        {"d": store.database, "v": POSTINGS_VIEW},
    )
    return str(rows[0][0]), str(rows[0][1])
