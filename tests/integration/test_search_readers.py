"""Who may read a message, held in the lexical index's documents (their ``readers``), on
real engines: the readers follow ``thread_users`` through both write paths, a retag lost
to a crash neither shows a hidden thread nor stays lost, a retag asked during a fill is
applied when it ends, and a replay's uncommitted load is retagged too. What a user would
notice is asserted first (found or not, and the df a score was computed from); the
documents' stored tags second, so a pass is not the by-key fallback hiding a stale tag."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest

from memstream.projections.messages import MessageStore, lexical_index
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.lexical_index import (
    IndexQuery,
    IndexRow,
    LexicalIndex,
    close_indexes,
    open_index,
)
from memstream.projections.messages.rows import THREAD_USERS_SCHEMA
from memstream.projections.messages.sql import SearchSpec, query_words
from memstream.projections.replay_sinks import MessagesSink
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Caller, ThreadRef
from tests.integration.test_transcript_search import explained, m, project, search

ANON, ALICE, BOB, CAROL = (Caller("acc", "ag", u) for u in (None, "alice", "bob", "carol"))


def readers_of(index: LexicalIndex, thread: str) -> set[tuple[str, ...]]:
    """The distinct reader tags the documents of ``acc/ag/<thread>`` carry, as stored."""
    tv = index._tantivy  # noqa: SLF001
    searcher = index._index.searcher()  # noqa: SLF001
    query = tv.Query.term_query(index._schema, "thread_key", ThreadRef("acc", "ag", thread).key)  # noqa: SLF001
    found = searcher.search(query, 10_000)
    return {
        tuple(sorted(str(t) for t in searcher.doc(a).get_all("readers"))) for _s, a in found.hits
    }


async def df(store: MessageStore, caller: Caller, word: str) -> int:
    """The df the caller's scores were computed from (0: no hit)."""
    spec = SearchSpec("acc", "ag", caller.user_id, query_words(word), 5, explain=True)
    hits = await store.lexical_search(spec)
    return int(explained(hits[0])["terms"][word]["df"]) if hits else 0


def owners(*rows: tuple[str, str]) -> pa.Table:
    cols = list(zip(*[("acc", "ag", t, u) for t, u in rows], strict=True))
    return pa.table([list(c) for c in cols], schema=THREAD_USERS_SCHEMA)


async def test_readers_follow_the_owners_through_both_write_paths(
    indexed_store: MessageStore,
) -> None:
    """A public thread of 30 turns gains alice (bulk path), then bob (object path): from
    each write on, callers who may not read it neither find its turns nor have them counted
    in the df of their scores; its users find every turn."""
    store = indexed_store
    await project(store, [m("t", i, "user", f"kestrel sighting {i}") for i in range(30)])
    await project(store, [m("u", i, "user", f"kestrel feather {i}") for i in range(5)])
    assert len(await search(store, ANON, query="kestrel", limit=50)) == 35
    assert await df(store, BOB, "kestrel") == 35
    joined = m("t", 30, "user", "my kestrel notes", user="alice")
    assert await store.write_journal_batch([encode(message_appended(joined, ts=1))]) is not None
    index = store.lexical_index()
    assert index is not None and readers_of(index, "t") == {("u:alice",)}
    for caller in (ANON, BOB):
        assert {t for t, _ in await search(store, caller, query="kestrel", limit=50)} == {"u"}
        assert await df(store, caller, "kestrel") == 5
    assert len(await search(store, ALICE, query="kestrel", limit=50)) == 36
    assert await df(store, ALICE, "kestrel") == 36
    await project(store, [m("t", 31, "user", "kestrel again", user="bob")])
    assert readers_of(index, "t") == {("u:alice", "u:bob")}
    for caller in (ALICE, BOB):
        assert len(await search(store, caller, query="kestrel", limit=50)) == 37
        assert await df(store, caller, "kestrel") == 37
    for caller in (ANON, CAROL):
        assert {t for t, _ in await search(store, caller, query="kestrel", limit=50)} == {"u"}
        assert await df(store, caller, "kestrel") == 5
    assert readers_of(index, "u") == {("p",)}


async def test_a_lost_retag_shows_nothing_hidden_and_is_repaired(
    indexed_store: MessageStore, caplog: pytest.LogCaptureFixture
) -> None:
    """As after a crash between the owners' insert and the retag: ``thread_users`` says
    alice's, the documents still say public. A search by bob shows none of them (checked
    against the owner map, searched again by key) and retags the thread; a redelivered
    batch of another such thread retags it before its messages go in."""
    store = indexed_store
    await project(store, [m("t", i, "user", f"osprey nest {i}") for i in range(10)])
    await project(store, [m("u", i, "user", f"osprey dive {i}") for i in range(3)])
    await project(store, [m("v", i, "user", f"wren call {i}") for i in range(4)])
    lost = owners(("t", "alice"), ("v", "alice"))
    await store.engine.insert_arrow(store.database, "thread_users", lost)
    await store._owners_written(lost)  # noqa: SLF001 - the retag after it never ran
    index = store.lexical_index()
    assert index is not None and readers_of(index, "t") == {("p",)}
    with caplog.at_level(logging.WARNING):
        hits = await search(store, BOB, query="osprey", limit=50)
    assert {t for t, _ in hits} == {"u"}
    assert await df(store, BOB, "osprey") == 3
    assert "retagging" in caplog.text
    await asyncio.gather(*store._repairs)  # noqa: SLF001
    assert readers_of(index, "t") == {("u:alice",)}
    n_docs, avg = await store.collection_stats("acc", "ag")
    hidden = await store._hidden_threads("acc", "ag", "bob")  # noqa: SLF001
    found = await index.best(
        IndexQuery("acc", "ag", None, ["osprey"], hidden, (n_docs, avg), 50, (1.2, 0.75), "bob")
    )
    assert {h.thread_id for h in found.hits} == {"u"} and not found.stale
    # v: the batch that gave it its owner is delivered again (the projector did not commit)
    assert readers_of(index, "v") == {("p",)}
    await project(store, [m("v", 4, "user", "wren answer", user="alice")])
    assert readers_of(index, "v") == {("u:alice",)}
    assert await search(store, BOB, query="wren") == []
    assert len(await search(store, ALICE, query="wren", limit=50)) == 5
    assert len(await search(store, ALICE, query="osprey", limit=50)) == 13


async def test_a_retag_asked_while_filling_is_applied_when_the_fill_ends(
    tmp_path: Path,
) -> None:
    """A fill read thread ``t``'s owners (none) before alice's first turn was written; the
    retag her write asks for meanwhile is queued and applied before the marker goes."""
    index = open_index(tmp_path / "ix")
    rows = [
        IndexRow("acc", "ag", "t", i, i, f"heron wading {i}", message_id=f"m{i}") for i in range(90)
    ]
    rows += [
        IndexRow("acc", "ag", "u", i, i, f"heron flying {i}", message_id=f"n{i}") for i in range(3)
    ]
    asked: list[int] = []

    async def batches() -> AsyncIterator[list[IndexRow]]:
        yield rows[:30]
        asked.append(await index.retag([("acc", "ag", "t", frozenset({"alice"}))]))
        assert index.filling
        yield rows[30:]

    assert await index.fill(batches) == 93
    assert asked == [0]  # queued, not applied, while filling
    assert not index.filling and readers_of(index, "t") == {("u:alice",)}
    key = ThreadRef("acc", "ag", "t").key
    for user, want in (("bob", {"u"}), ("alice", {"t", "u"})):
        hidden = [key] if user == "bob" else []
        found = await index.best(
            IndexQuery("acc", "ag", None, ["heron"], hidden, (93.0, 3.0), 100, (1.2, 0.75), user)
        )
        assert {h.thread_id for h in found.hits} == want and not found.stale
    await close_indexes(tmp_path)


async def test_a_replay_retags_what_its_load_has_not_committed(
    chdb_engine: ChdbEngine, tmp_path: Path
) -> None:
    """A replay's load adds documents without committing them; a thread whose owner comes
    in a later batch than its first turns is retagged all the same (through one commit),
    and after the switch its turns are hidden from others by their readers alone."""
    root = tmp_path / "tv"
    base = f"t_{uuid.uuid4().hex[:8]}"
    live = MessageStore(chdb_engine, base, index_root=root)
    await live.ensure_schema()
    rng = random.Random(4)
    msgs = [
        m(th, i, "user", f"plover {rng.choice(['sand', 'tide', 'dune'])} {i}", minutes=i)
        for th in ("t", "u")
        for i in range(20)
    ]
    joined = m("t", 20, "user", "plover mine now", user="alice")
    sink = MessagesSink(live, base)
    await sink.prepare(2, fresh=True)
    target = sink.store(2)
    index = target.lexical_index()
    assert index is not None
    for batch in (msgs[:10], msgs[10:30], [joined], msgs[30:]):
        await project(target, batch)
    await sink.seal(2)
    await sink.switch(2)
    assert readers_of(index, "t") == {("u:alice",)} and readers_of(index, "u") == {("p",)}
    for caller in (ANON, BOB):
        assert {t for t, _ in await search(live, caller, query="plover", limit=50)} == {"u"}
        assert await df(live, caller, "plover") == 20
    assert len(await search(live, ALICE, query="plover", limit=50)) == 41
    await live.close()


async def test_searches_during_writes_never_show_a_thread_already_private(
    indexed_store: MessageStore,
) -> None:
    """Twenty public threads become alice's one write at a time while bob searches without
    pause: no search started after a thread's write returned shows any of its turns."""
    store = indexed_store
    threads = [f"g{i}" for i in range(20)]
    await project(
        store, [m(t, i, "user", f"gannet colony {t} {i}") for t in threads for i in range(5)]
    )
    private_since: dict[str, float] = {}
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    seen: list[tuple[float, set[str]]] = []

    async def writes() -> None:
        for t in threads:
            await project(store, [m(t, 5, "user", "gannet mine", user="alice")])
            private_since[t] = loop.time()
            await asyncio.sleep(0.01)
        done.set()

    async def searches() -> None:
        while not done.is_set():
            started = loop.time()
            found = {t for t, _ in await search(store, BOB, query="gannet colony", limit=50)}
            seen.append((started, found))

    await asyncio.gather(writes(), searches())
    assert len(seen) >= 20
    for started, found in seen:
        leaked = {t for t in found if private_since.get(t, float("inf")) <= started}
        assert not leaked, (started, leaked)
    assert await search(store, BOB, query="gannet") == []


async def test_a_long_thread_is_retagged_page_by_page_without_loss_or_copies(
    indexed_store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retag reads a thread's documents a page at a time: 30 turns through pages of 7
    come out once each, all with the new readers."""
    monkeypatch.setattr(lexical_index, "RETAG_PAGE", 7)
    store = indexed_store
    await project(store, [m("t", i, "user", f"puffin burrow {i}") for i in range(30)])
    await project(store, [m("t", 30, "user", "puffin mine", user="alice")])
    index = store.lexical_index()
    assert index is not None and readers_of(index, "t") == {("u:alice",)}
    assert await index.count() == 31
    assert sorted(o for _, o in await search(store, ALICE, query="puffin", limit=50)) == list(
        range(31)
    )
    assert await search(store, BOB, query="puffin") == []
