"""Transcript search through the lexical index (Tantivy beside chdb) on real engines: it
ranks like scoring every candidate in ClickHouse, privacy holds the moment a thread gains a
user, redeliveries leave one copy, erasure removes a thread, an index is filled at start
(again after an interrupted fill), a replay's target is filled once by its seal and a
dropped generation's index goes with it."""

from __future__ import annotations

import asyncio
import random
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from memstream.errors import InvalidRequest, RetryableInfraError, StoreUnavailable
from memstream.infra.settings import Settings
from memstream.projections.messages import MessageStore, SearchHit, index_root
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.lexical_index import (
    CANDIDATES,
    FILLING,
    LAYOUT,
    IndexQuery,
    IndexRow,
    LexicalIndex,
    close_indexes,
    document_terms,
)
from memstream.projections.messages.postings import POSTINGS_TABLE, POSTINGS_VIEW
from memstream.projections.messages.sql import SearchSpec, query_words
from memstream.projections.replay_sinks import MessagesSink
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Caller, Message
from tests.fixtures.disk import files_holding
from tests.integration.test_search_postings import WORDS, _corpus
from tests.integration.test_transcript_search import explained, m, project, search


async def _pair(chdb_engine: ChdbEngine, root: Path) -> tuple[MessageStore, MessageStore]:
    """The same database through the index and through the posting lists (which a store
    without the index fills from the stored rows at its start: call its ``ensure_schema``
    once the rows are in)."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    indexed = MessageStore(chdb_engine, db, index_root=root)
    await indexed.ensure_schema()
    return indexed, MessageStore(chdb_engine, db)


async def test_with_the_index_there_are_no_posting_lists_until_it_is_turned_off(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """The index serves BM25, so no posting view slows the inserts: a database searched by
    the posting lists before keeps them while its index is filled, then drops them; a start
    without the index fills them again from the stored rows, and both find the same (every
    match: messages of equal score may come in another order)."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    plain = MessageStore(chdb_engine, db)
    await plain.ensure_schema()
    msgs = _corpus(random.Random(3))[:200]
    await project(plain, msgs)
    before = sorted(await search(plain, Caller("acc", "ag", "u3"), query="w4 w11", limit=50))
    assert before

    async def tables() -> set[str]:
        rows = await chdb_engine.rows(
            "SELECT name FROM system.tables WHERE database = {d:String}", {"d": db}
        )
        return {str(r[0]) for r in rows}

    assert {POSTINGS_TABLE, POSTINGS_VIEW} <= await tables()
    root = tmp_path / "tv"
    indexed = MessageStore(chdb_engine, db, index_root=root)
    await indexed.ensure_schema()  # fills the index, then the posting lists go
    assert not {POSTINGS_TABLE, POSTINGS_VIEW} & await tables()
    await project(indexed, msgs[:50])  # redelivered: no view to write postings
    assert (
        sorted(await search(indexed, Caller("acc", "ag", "u3"), query="w4 w11", limit=50)) == before
    )
    await indexed.erase_threads([("acc", "ag", "t5")])  # erasure without the table
    await indexed.optimize()
    await close_indexes(root)
    off = MessageStore(chdb_engine, db)  # MEMSTREAM_TRANSCRIPT_INDEX=clickhouse
    await off.ensure_schema()
    assert {POSTINGS_TABLE, POSTINGS_VIEW} <= await tables()
    callers = [Caller("acc", "ag", user) for user in ("u3", None)]
    wants = [sorted(await search(off, c, query="w4 w11", limit=50)) for c in callers]
    assert all(want and all(t != "t5" for t, _ in want) for want in wants), wants
    again = MessageStore(chdb_engine, db, index_root=root)
    await again.ensure_schema()  # the index turned on again: they go again
    assert not {POSTINGS_TABLE, POSTINGS_VIEW} & await tables()
    for caller, want in zip(callers, wants, strict=True):
        assert sorted(await search(again, caller, query="w4 w11", limit=50)) == want
    await close_indexes(root)


def _ranked(hits: list[SearchHit]) -> list[tuple[str, int, float]]:
    return [(h.thread_id, h.offset, round(h.relevance, 9)) for h in hits]


async def test_the_index_ranks_like_the_posting_lists(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """Zipf words over 12 threads (three private), a redelivered copy of a third of the
    turns: every search answers the same hits, relevance and order through both paths
    when its matches fit the candidates, and the same relevance at every rank when they
    do not (common words); df in explain the same, never counting hidden threads."""
    rng = random.Random(7)
    msgs = _corpus(rng)
    indexed, postings = await _pair(chdb_engine, tmp_path / "tv")
    await project(indexed, msgs)
    await project(indexed, msgs[::3])  # redelivered
    await postings.ensure_schema()  # its posting lists, filled from the rows (copies too)
    exact = beyond = 0
    for q in range(60):
        words = " ".join(rng.sample(WORDS, rng.randint(1, 4)))
        user = ("u3", None, "u7")[q % 3]
        thread = f"t{q % 12}" if q % 4 == 0 else None
        spec = SearchSpec("acc", "ag", user, query_words(words), 10, thread_id=thread, explain=True)
        mine, theirs = await indexed.lexical_search(spec), await postings.lexical_search(spec)
        assert [explained(h)["terms"] for h in mine] == [explained(h)["terms"] for h in theirs]
        n_docs, avg = await indexed.collection_stats("acc", "ag")
        index = indexed.lexical_index()
        assert index is not None
        hidden = await indexed._hidden_threads("acc", "ag", user or "")  # noqa: SLF001
        found = await index.best(
            IndexQuery(
                "acc", "ag", thread, spec.words, hidden, (n_docs, avg), 100, (1.2, 0.75), user or ""
            )
        )
        assert not found.stale  # the readers kept every hidden thread out by themselves
        if found.exact:
            exact += 1
            assert _ranked(mine) == _ranked(theirs), words
        else:
            beyond += 1
            assert [r for _, _, r in _ranked(mine)] == [r for _, _, r in _ranked(theirs)], words
        for h in mine:  # private threads only for their users
            assert h.thread_id not in {"t3", "t7", "t11"} or h.thread_id == f"t{(user or 'x')[1:]}"
    assert exact >= 10 and beyond >= 10  # both regimes ran (candidates: CANDIDATES)
    assert CANDIDATES >= 100


async def test_a_thread_that_gains_a_user_is_hidden_at_once(indexed_store: MessageStore) -> None:
    """A thread with anonymous turns becomes alice's with her first turn: from then on
    neither bob nor an anonymous caller finds any of its turns (the privacy filter's owner
    map follows the write), and alice finds them all."""
    await project(
        indexed_store, [m("t", 0, "user", "pelican migration"), m("u", 0, "user", "pelican")]
    )
    anon = Caller("acc", "ag", None)
    assert {t for t, _ in await search(indexed_store, anon, query="pelican")} == {"t", "u"}
    await project(indexed_store, [m("t", 1, "user", "more about the pelican", user="alice")])
    for caller in (anon, Caller("acc", "ag", "bob")):
        assert await search(indexed_store, caller, query="pelican migration") == [("u", 0)]
    alice = Caller("acc", "ag", "alice")
    assert sorted(await search(indexed_store, alice, query="pelican")) == [
        ("t", 0),
        ("t", 1),
        ("u", 0),
    ]


async def test_redelivered_bulk_batches_leave_one_copy(indexed_store: MessageStore) -> None:
    """The bulk path (raw journal records) writes the index too; the same batch twice,
    then again inside a bigger one, leaves one document per message."""
    msgs = [m(f"t{i % 5}", i, "user", f"walrus {WORDS[i % 60]}", minutes=i) for i in range(1_200)]
    values = [encode(message_appended(x, ts=1)) for x in msgs]
    for batch in (values[:1_100], values[:1_100], values):
        assert await indexed_store.write_journal_batch(batch) is not None
    index = indexed_store.lexical_index()
    assert index is not None and await index.count() == 1_200  # deleted copies not counted
    hits = await search(indexed_store, query="walrus", limit=50)
    assert len(hits) == len(set(hits)) == 50
    spec = SearchSpec("acc", "ag", None, query_words("walrus"), 10, explain=True)
    (top, *_) = await indexed_store.lexical_search(spec)
    assert explained(top)["terms"]["walrus"]["df"] == 1_200


async def test_an_upsert_replaces_each_message_once_whatever_its_batch_holds(
    tmp_path: Path,
) -> None:
    """The index deletes a batch's keys with one query before adding it: a message twice in
    one batch keeps its last copy (as a delete before each add did), a message written
    again replaces its document, and one whose new text has no term leaves the index."""
    index = LexicalIndex(tmp_path / "ix")
    await index.fill(_no_batches)
    first = [IndexRow("acc", "ag", "t", i, 1_000 + i, f"otter {i}") for i in range(4)]
    assert await index.upsert(first) == 4
    again = [
        IndexRow("acc", "ag", "t", 0, 1_000, "heron first copy"),
        IndexRow("acc", "ag", "t", 0, 1_000, "heron second copy"),
        IndexRow("acc", "ag", "t", 1, 1_001, "..."),  # no term any more
        IndexRow("acc", "ag", "t", 2, 1_002, "otter 2"),  # the same again
    ]
    assert await index.upsert(again) == 2
    assert await index.count() == 3  # 0 (second copy), 2, 3
    docs = await index.documents("acc", "ag", [r.key for r in first], [])
    assert sorted((d.offset, d.terms) for d in docs) == [
        (0, ["heron", "second", "copy"]),
        (2, ["otter", "2"]),
        (3, ["otter", "3"]),
    ]
    await index.close()


async def _no_batches() -> AsyncIterator[list[IndexRow]]:
    return
    yield


async def test_a_fill_over_unmerged_copies_leaves_one_document_per_message(
    chdb_engine: ChdbEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ClickHouse holds a redelivered batch's copies until it merges them; a fill reads in
    key order without FINAL and keeps a message's first copy (in steps of 97 here, so steps
    end among copies): one document per message, the same df as the writes gave."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    store = MessageStore(chdb_engine, db, index_root=tmp_path / "ix")
    await store.ensure_schema()
    msgs = [m(f"t{i % 5}", i, "user", f"walrus {WORDS[i % 60]}", minutes=i) for i in range(600)]
    values = [encode(message_appended(x, ts=1)) for x in msgs]
    for batch in (values[:500], values[:500], values, values[100:]):
        assert await store.write_journal_batch(batch) is not None
    stored = await chdb_engine.rows(f"SELECT count() FROM {db}.messages", {})
    assert int(str(stored[0][0])) > 600  # the copies are there, unmerged
    await close_indexes(tmp_path / "ix")
    shutil.rmtree(tmp_path / "ix")
    monkeypatch.setattr("memstream.projections.messages.store.INDEX_FILL_BATCH", 97)
    again = MessageStore(chdb_engine, db, index_root=tmp_path / "ix")
    await again.ensure_schema()
    index = again.lexical_index()
    assert index is not None and await index.count() == 600
    spec = SearchSpec("acc", "ag", None, query_words("walrus"), 10, explain=True)
    (top, *_) = await again.lexical_search(spec)
    assert explained(top)["terms"]["walrus"]["df"] == 600
    await close_indexes(tmp_path / "ix")


async def test_erasure_removes_the_thread_from_the_index(indexed_store: MessageStore) -> None:
    await project(
        indexed_store,
        [m("a", 0, "user", "secret narwhal", user="u1"), m("b", 0, "user", "narwhal facts")],
    )
    u1 = Caller("acc", "ag", "u1")
    assert sorted(await search(indexed_store, u1, query="narwhal")) == [("a", 0), ("b", 0)]
    await indexed_store.erase_threads([("acc", "ag", "a")])
    assert await search(indexed_store, u1, query="narwhal") == [("b", 0)]
    assert await search(indexed_store, u1, query="secret") == []
    index = indexed_store.lexical_index()
    assert index is not None  # nor is its stored text read back by key
    docs = await index.documents("acc", "ag", ["acc/ag/a/0", "acc/ag/b/0"], [])
    assert [(d.thread_id, d.record.content) for d in docs] == [("b", "narwhal facts")]


async def _indexed(index: LexicalIndex, msgs: list[Message]) -> list[tuple[str, int]]:
    """Which of ``msgs`` the index holds a document of, read back by key."""
    keys = [f"acc/ag/{x.thread_id}/{x.offset}" for x in msgs]
    return sorted((d.thread_id, d.offset) for d in await index.documents("acc", "ag", keys, []))


async def _text_table_dirs(store: MessageStore) -> list[Path]:
    rows = await store.engine.rows(
        "SELECT data_paths FROM system.tables WHERE database = {d:String} AND name = 'message_text'",
        {"d": store.database},
    )
    paths = rows[0][0]
    return [Path(str(p)) for p in (paths if isinstance(paths, list) else [paths])]


async def test_erased_text_leaves_the_files_of_the_index_and_the_text_table(
    indexed_store: MessageStore,
) -> None:
    """A delete only marks a Tantivy document (its text stays in its segment's files until
    a merge rewrites it) and a RocksDB value (until a compaction): read from the disk, the
    erased message's words were still there. After the erasure they are in no file of the
    index or the text table, while the messages that shared its segment are still found,
    once each."""
    canary = f"zq{uuid.uuid4().hex[:10]}xv"
    keep = [m(f"k{i % 4}", i, "user", f"harmless walrus note {i}") for i in range(120)]
    gone = m("gone", 0, "user", f"my secret {canary} code", user="u1")
    await project(indexed_store, [*keep[:60], gone, *keep[60:]])  # one batch: one segment
    index = indexed_store.lexical_index()
    assert index is not None
    text_dirs = await _text_table_dirs(indexed_store)
    assert files_holding(canary.encode(), index.path)  # the check sees what is there
    assert files_holding(canary.encode(), *text_dirs)
    await indexed_store.erase_threads([("acc", "ag", "gone")])
    assert files_holding(canary.encode(), index.path) == []
    assert files_holding(canary.encode(), *text_dirs) == []
    u1 = Caller("acc", "ag", "u1")
    assert await search(indexed_store, u1, query=canary) == []
    assert len(await search(indexed_store, u1, query="harmless walrus", limit=50)) == 50
    assert await _indexed(index, keep) == sorted((x.thread_id, x.offset) for x in keep)
    assert await index.count() == 120


async def test_messages_written_during_a_purge_are_kept_once(
    indexed_store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A purge rewrites the index in steps, each one call on the writer's thread; batches
    projected between its steps (new threads, and new messages of threads it has already
    rewritten or not yet) are all found afterwards, once each, and nothing erased comes
    back."""
    monkeypatch.setattr("memstream.projections.messages.lexical_index.PURGE_STEP", 30)
    first = [m(f"t{i % 12}", i, "user", f"walrus tale {i}") for i in range(240)]
    await project(indexed_store, [*first, m("gone", 0, "user", "walrus secret")])
    index = indexed_store.lexical_index()
    assert index is not None
    assert await index.delete_threads(["acc/ag/gone"]) == 1
    purge = asyncio.ensure_future(index.purge())
    later: list[Message] = []
    for step in range(8):
        batch = [
            m(f"t{(step + j) % 14}", 1_000 + step * 10 + j, "user", f"walrus late {j}")
            for j in range(10)
        ]
        later += batch
        await project(indexed_store, batch)
        await asyncio.sleep(0)
    assert await purge >= 240
    assert await _indexed(index, [*first, *later]) == sorted(
        (x.thread_id, x.offset) for x in [*first, *later]
    )
    assert await index.count() == len(first) + len(later)  # no copies
    assert await search(indexed_store, query="secret") == []


async def seeded(store: MessageStore, *, kept: int, erased: int) -> tuple[LexicalIndex, list[str]]:
    """The store's index with ``kept`` messages over threads k0-k2 and one message in each of
    threads g0.. holding a word of its own (returned, to look for on the disk)."""
    index = store.lexical_index()
    assert index is not None
    words = [f"zq{uuid.uuid4().hex[:10]}xv" for _ in range(erased)]
    keep = [m(f"k{i % 3}", i, "user", f"walrus {i}") for i in range(kept)]
    gone = [m(f"g{j}", 0, "user", f"secret {w}") for j, w in enumerate(words)]
    await project(store, [*keep, *gone])
    return index, words


async def test_purges_asked_at_once_share_the_work(indexed_store: MessageStore) -> None:
    """Erasures finishing together ask for purges together: the first runs, the ones asked
    while it ran share one more (it may have listed the threads before their deletes), and
    every erased word is off the disk."""
    index, words = await seeded(indexed_store, kept=60, erased=3)
    await index.delete_threads(["acc/ag/g0"])
    first = asyncio.ensure_future(index.purge())
    await asyncio.sleep(0)  # it has begun
    await index.delete_threads(["acc/ag/g1", "acc/ag/g2"])
    rewritten = await asyncio.gather(first, index.purge(), index.purge(), index.purge())
    assert rewritten[0] == 60
    assert sorted(rewritten[1:]) == [0, 0, 60]  # one more purge for the three of them
    for w in words:
        assert files_holding(w.encode(), index.path) == []
    assert await index.count() == 60


async def test_a_failed_purge_covers_none_of_the_calls_waiting_for_it(
    indexed_store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls made while a purge runs share the next one; if that one fails, the call that
    ran it fails, and the others run one of their own: their deletes were not purged (they
    do not return as if they were)."""
    index, words = await seeded(indexed_store, kept=30, erased=2)
    real = index._purge
    calls = 0

    async def second_fails() -> int:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("disk full")
        await asyncio.sleep(0.05)
        return await real()

    monkeypatch.setattr(index, "_purge", second_fails)
    first = asyncio.ensure_future(index.purge())
    await asyncio.sleep(0)  # it has begun: later calls wait for the next one
    await index.delete_threads(["acc/ag/g0", "acc/ag/g1"])
    b = asyncio.ensure_future(index.purge())
    c = asyncio.ensure_future(index.purge())
    done = await asyncio.gather(first, b, c, return_exceptions=True)
    assert done[0] == 30  # (it listed the threads after its pause, so after the deletes)
    assert isinstance(done[1], OSError)  # the second purge, run for b and c, failed
    assert done[2] == 30  # so c ran its own, not a share of the failed one
    assert calls == 3
    for w in words:
        assert files_holding(w.encode(), index.path) == []


async def test_a_purge_asked_while_filling_runs_when_the_fill_ends(
    indexed_store: MessageStore,
) -> None:
    """An erasure during a fill deletes documents the fill has already added: its purge
    waits for the fill's end, which then runs it (nothing of them left on disk)."""
    index = indexed_store.lexical_index()
    assert index is not None
    canary = f"zq{uuid.uuid4().hex[:10]}xv"

    def rows(thread: str, text: str, n: int) -> list[IndexRow]:
        return [IndexRow("acc", "ag", thread, i, 1_000 + i, f"{text} {i}") for i in range(n)]

    async def batches() -> AsyncIterator[list[IndexRow]]:
        yield rows("gone", f"secret {canary}", 5) + rows("kept", "walrus", 50)
        await index.delete_threads(["acc/ag/gone"])  # the erasure, between two batches
        assert await index.purge() == 0  # asked while filling: after the fill
        yield rows("kept2", "walrus", 50)

    assert await index.fill(batches) == 105
    assert files_holding(canary.encode(), index.path) == []
    assert await index.count() == 100


async def test_hits_show_the_text_stored_with_the_index(indexed_store: MessageStore) -> None:
    """A search reads its hits' id, role and text from the index's documents, not from
    ClickHouse: with ``message_text`` emptied behind its back, the hits still show them.
    Read back by key, a document gives the same, never from another agent or from a
    thread the caller may not read."""
    await project(
        indexed_store,
        [
            m("t", 0, "user", "The otter \x1f holds a stone"),
            m("t", 1, "assistant", "Otters do that", user=None),
            m("p", 0, "user", "my otter diary", user="alice"),
            m("t", 0, "user", "otter elsewhere", agent="other"),
        ],
    )
    await indexed_store.engine.command(
        f"ALTER TABLE {indexed_store.database}.message_text DELETE WHERE 1 "
        "SETTINGS mutations_sync = 2"
    )
    spec = SearchSpec("acc", "ag", None, query_words("otter"), 10)
    hits = {(h.thread_id, h.offset): h for h in await indexed_store.lexical_search(spec)}
    assert set(hits) == {("t", 0), ("t", 1)}
    assert (hits[("t", 0)].role, hits[("t", 0)].content) == ("user", "The otter \x1f holds a stone")
    assert (hits[("t", 1)].role, hits[("t", 1)].content) == ("assistant", "Otters do that")
    assert hits[("t", 0)].message_id == m("t", 0, "user", "").message_id
    index = indexed_store.lexical_index()
    assert index is not None
    keys = ["acc/ag/t/0", "acc/ag/p/0", "acc/other/t/0"]
    docs = await index.documents("acc", "ag", keys, ["acc/ag/p"])
    assert [(d.thread_id, d.offset, d.record.content) for d in docs] == [
        ("t", 0, "The otter \x1f holds a stone")
    ]
    assert docs[0].terms == document_terms("The otter \x1f holds a stone")


async def test_an_index_of_an_older_layout_is_filled_again_at_start(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """An index written before the documents held their text (no ``layout`` file, or
    another number in it) is emptied when opened and filled again from the stored rows:
    after the start, the same hits with their text."""
    root = tmp_path / "tv"
    store = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}", index_root=root)
    await store.ensure_schema()
    await project(store, _corpus(random.Random(3))[:200])
    before = await store.lexical_search(SearchSpec("acc", "ag", None, query_words("w7"), 20))
    assert before
    await close_indexes(root)
    layout = root / store.database / "layout"
    assert layout.read_text().strip() == str(LAYOUT)
    layout.write_text("1\n")
    again = MessageStore(chdb_engine, store.database, index_root=root)
    index = again.lexical_index()
    assert index is not None and index.filling and await index.count() == 0
    await again.ensure_schema()
    assert not index.filling and await index.count() == 200
    assert layout.read_text().strip() == str(LAYOUT)
    after = await again.lexical_search(SearchSpec("acc", "ag", None, query_words("w7"), 20))
    assert after == before
    await close_indexes(root)


async def test_an_index_is_filled_at_start_and_again_after_an_interrupted_fill(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """A database searched by the posting lists gains an index at the next start, filled
    from its rows (searches use the posting lists until then); a fill that stopped (its
    marker left) runs again; a restarted process reopens the filled index as it is."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    plain = MessageStore(chdb_engine, db)
    await plain.ensure_schema()
    msgs = _corpus(random.Random(5))[:300]
    await project(plain, msgs)
    before = await search(plain, query="w7 w30", limit=20)
    root = tmp_path / "tv"
    indexed = MessageStore(chdb_engine, db, index_root=root)
    await indexed.ensure_schema()
    index = indexed.lexical_index()
    assert index is not None and not index.filling and await index.count() == 300
    assert await search(indexed, query="w7 w30", limit=20) == before
    (root / db / FILLING).touch()  # a fill interrupted by a crash
    await close_indexes(root)
    again = MessageStore(chdb_engine, db, index_root=root)
    # the posting lists went once the index was filled: until it is filled again, search
    # answers "unavailable, retry" (503 with Retry-After), never a partial result
    with pytest.raises(StoreUnavailable, match="being filled"):
        await search(again, query="w7 w30", limit=20)
    await again.ensure_schema()
    index = again.lexical_index()
    assert index is not None and not index.filling and await index.count() == 300
    await close_indexes(root)
    restarted = MessageStore(chdb_engine, db, index_root=root)
    await restarted.ensure_schema()  # filled: not filled again
    assert await search(restarted, query="w7 w30", limit=20) == before
    await close_indexes(root)


async def test_a_replay_writes_its_target_index_and_drops_the_old_one(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    root = tmp_path / "tv"
    base = f"t_{uuid.uuid4().hex[:8]}"
    live = MessageStore(chdb_engine, f"{base}", index_root=root)
    await live.ensure_schema()
    msgs = _corpus(random.Random(9))[:400]
    await project(live, msgs)
    before = await search(live, Caller("acc", "ag", "u3"), query="w2 w40", limit=30)
    sink = MessagesSink(live, base)
    await sink.prepare(2, fresh=True)
    target = sink.store(2)
    target_index = target.lexical_index()
    assert target_index is not None and not target_index.filling  # written beside the load
    await project(target, msgs[:250])
    assert await target_index.count() == 0  # added, committed by the seal
    await sink.seal(2)
    assert await target_index.count() == 250
    await sink.seal(2)  # a resumed seal: nothing to fill
    await project(target, msgs[250:])  # the hand-over's writes, committed each
    assert await target_index.count() == 400
    await sink.switch(2)
    assert live.database == f"{base}_v2"
    assert await search(live, Caller("acc", "ag", "u3"), query="w2 w40", limit=30) == before
    assert (root / base).exists()
    await sink.drop(1)
    assert not (root / base).exists()
    assert await search(live, Caller("acc", "ag", "u3"), query="w2 w40", limit=30) == before
    await close_indexes(root)


def test_the_index_is_chosen_by_the_settings(tmp_path: Path) -> None:
    """``auto``: the index with embedded chdb; a ClickHouse server or ``clickhouse``: the
    posting lists; ``tantivy`` with a server is refused, naming the setting."""
    s = Settings(data_dir=tmp_path)
    assert index_root(s) == s.resolved_data_dir() / "tantivy"
    assert index_root(Settings(data_dir=tmp_path, transcript_index="clickhouse")) is None
    assert index_root(Settings(data_dir=tmp_path, clickhouse_url="http://ch:8123")) is None
    with pytest.raises(InvalidRequest) as e:
        index_root(
            Settings(data_dir=tmp_path, clickhouse_url="http://ch:8123", transcript_index="tantivy")
        )
    assert e.value.field == "transcript_index"


async def test_a_failed_insert_leaves_nothing_in_the_index(
    indexed_store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert and the index's upsert run side by side; when the insert fails the
    upserted documents are taken back, so a search never counts or returns a message
    ClickHouse does not hold; the retried batch lands in both."""
    real = indexed_store.engine.insert_arrow

    async def failing(database: str, table: str, data: object) -> int:
        if table == "messages":
            raise RetryableInfraError("chdb: the insert failed")
        return await real(database, table, data)

    monkeypatch.setattr(indexed_store.engine, "insert_arrow", failing)  # the session's engine
    with pytest.raises(RetryableInfraError):
        await project(indexed_store, [m("t", 0, "user", "ocelot sightings")])
    index = indexed_store.lexical_index()
    assert index is not None and await index.count() == 0
    assert await search(indexed_store, query="ocelot") == []
    monkeypatch.setattr(indexed_store.engine, "insert_arrow", real)
    await project(indexed_store, [m("t", 0, "user", "ocelot sightings")])
    assert await search(indexed_store, query="ocelot") == [("t", 0)]


async def test_a_resumed_replay_fills_the_documents_a_stop_lost(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """A replay stopped in its load leaves rows in the target whose documents were never
    committed; the resumed replay fills the target's index from its rows at the seal."""
    root = tmp_path / "tv"
    base = f"t_{uuid.uuid4().hex[:8]}"
    live = MessageStore(chdb_engine, base, index_root=root)
    await live.ensure_schema()
    msgs = _corpus(random.Random(4))[:300]
    await project(live, msgs)
    sink = MessagesSink(live, base)
    await sink.prepare(2, fresh=True)
    target = sink.store(2)
    await project(target, msgs[:200])
    index = target.lexical_index()
    assert index is not None
    await index._run(lambda: index._w().rollback())  # noqa: SLF001  (the stop: nothing committed)
    await close_indexes(root)
    await sink.prepare(2, fresh=False)  # resumed
    await project(sink.store(2), msgs[150:])  # from its checkpoint on
    await sink.seal(2)
    resumed = sink.store(2).lexical_index()
    assert resumed is not None and not resumed.filling and await resumed.count() == 300
    await sink.switch(2)
    for user in ("u3", None):
        caller = Caller("acc", "ag", user)
        plain = MessageStore(chdb_engine, live.database)
        await plain.ensure_schema()  # the posting lists, filled from the switched rows
        assert await search(live, caller, query="w5 w9", limit=20) == await search(
            plain, caller, query="w5 w9", limit=20
        )
    await close_indexes(root)


async def test_hostile_text_and_ids_are_stored_as_written_and_filled_alike(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """Documents go to Tantivy as JSON: quotes, backslashes, NUL, the record separator,
    U+2028, astral characters and a JSON-looking text in ids and contents come back as
    written, searchable by their words, with their creation times; and an index filled
    from ClickHouse at a later start holds the same documents as the one the writes built
    (one document builder for both)."""
    db = f"t_{uuid.uuid4().hex[:12]}"
    store = MessageStore(chdb_engine, db, index_root=tmp_path / "ix")
    await store.ensure_schema()
    odd = [
        ('th"read\\1', 'He said "wombat" \\ then \x00 left'),
        ("th\u2028read", "wombat \u2028 line two 🦘 ünïcödé"),
        ("t}{", '{"key": "x", "offset": 9} wombat \x1f tail'),
    ]
    msgs = [
        m(t, i, "user", text, user='u"1' if i else None, minutes=i)
        for i, (t, text) in enumerate(odd)
    ]
    await project(store, msgs)
    keys = [f"acc/ag/{t}/{i}" for i, (t, _) in enumerate(odd)]

    async def docs_of(s: MessageStore) -> list[tuple[str, int, int, str, str, str, list[str]]]:
        index = s.lexical_index()
        assert index is not None
        got = await index.documents("acc", "ag", keys, [])
        return [
            (
                d.thread_id,
                d.offset,
                d.created_ms,
                d.record.message_id,
                d.record.role,
                d.record.content,
                d.terms,
            )
            for d in got
        ]

    written = await docs_of(store)
    assert sorted(written) == sorted(
        (
            x.thread_id,
            x.offset,
            int(x.created_at.timestamp() * 1000),
            x.message_id,
            "user",
            x.content,
            document_terms(x.content),
        )
        for x in msgs
    )
    hits = await store.lexical_search(SearchSpec("acc", "ag", 'u"1', query_words("wombat"), 10))
    assert sorted((h.thread_id, h.content) for h in hits) == sorted(odd)
    await close_indexes(tmp_path / "ix")
    # the same database, its index lost: filled again from ClickHouse at the next start
    shutil.rmtree(tmp_path / "ix")
    again = MessageStore(chdb_engine, db, index_root=tmp_path / "ix")
    await again.ensure_schema()
    assert sorted(await docs_of(again)) == sorted(written)
    await close_indexes(tmp_path / "ix")
