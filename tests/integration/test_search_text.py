"""The hits' text from ``message_text`` (point reads) on real chdb: every write path fills
it, hits carry exactly the stored text (the tenancy of each key is its own: another agent's
message at the same thread and offset never answers), erasure empties it, a database made
before it is filled at start (and again after an interrupted fill), a replay's target has
it, and without it search reads the text from ``messages`` with the same hits."""

from __future__ import annotations

import uuid

import pytest

from memstream.errors import RetryableInfraError
from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.sql import SearchSpec, query_words
from memstream.projections.messages.store import SearchHit
from memstream.projections.messages.text_table import TEXT_FILLING, TEXT_TABLE, TEXT_VIEW
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message
from tests.integration.test_transcript_search import m, project

TEXTS = [
    "we booked the Lisbon flights for May",
    "Ünïcode café: naïve résumé of the Lisbon trip",
    "the hotel near the river has a rooftop pool",
    "quotes ' and \" and a backslash \\ in the text",
]


def _msgs(agent: str = "ag") -> list[Message]:
    return [
        m(
            t,
            o,
            "user" if o % 2 == 0 else "assistant",
            f"{TEXTS[(i + o) % 4]} ({agent} {t}/{o})",
            agent=agent,
        )
        for i, t in enumerate(("a", "b", "c"))
        for o in range(4)
    ]


async def _text_rows(store: MessageStore) -> list[tuple[str, str, str, int, str]]:
    rows = await store.engine.rows(
        f"SELECT key, agent_id, thread_id, `offset`, content FROM {store.database}.{TEXT_TABLE} "
        "ORDER BY key",
        {},
    )
    return [(str(k), str(g), str(t), int(str(o)), str(c)) for k, g, t, o, c in rows]


async def _hits(store: MessageStore, words: str, agent: str = "ag") -> list[SearchHit]:
    return await store.lexical_search(SearchSpec("acc", agent, None, query_words(words), 10))


async def test_every_write_path_fills_the_text_and_hits_carry_it(chdb_engine: ChdbEngine) -> None:
    rows_store = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    raw_store = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    for store in (rows_store, raw_store):
        await store.ensure_schema()
    msgs = _msgs() + [m("sys", 0, "system", "system prompt lisbon")]
    await project(rows_store, msgs)
    assert await raw_store.write_journal_batch([encode(message_appended(x, ts=1)) for x in msgs])
    expected = sorted(
        (f"acc/ag/{x.thread_id}/{x.offset}", "ag", x.thread_id, x.offset, x.content)
        for x in msgs
        if x.role != "system"  # never searchable: no row, no text
    )
    for store in (rows_store, raw_store):
        assert await _text_rows(store) == expected
        hits = await _hits(store, "lisbon trip")
        assert len(hits) == 6
        by_key = {(x.thread_id, x.offset): x for x in msgs}
        for h in hits:
            sent = by_key[(h.thread_id, h.offset)]
            assert (h.content, h.message_id, h.role, h.created_at) == (
                sent.content,
                sent.message_id,
                sent.role,
                sent.created_at,
            )


async def test_another_agent_s_message_at_the_same_key_never_answers(
    message_store: MessageStore,
) -> None:
    await project(message_store, _msgs("ag") + _msgs("ag2"))
    for agent in ("ag", "ag2"):
        hits = await _hits(message_store, "rooftop pool", agent)
        assert hits and all(f"({agent} " in h.content for h in hits)
    # a copy (a replay on top) overwrites its key: still one text per message
    await project(message_store, _msgs("ag"))
    assert len(await _text_rows(message_store)) == 24


async def test_erasure_removes_the_thread_s_text(message_store: MessageStore) -> None:
    await project(message_store, _msgs() + _msgs("ag2"))
    assert await message_store.erase_threads([("acc", "ag", "a"), ("acc", "ag", "b")]) == 8
    left = {(g, t) for _, g, t, _, _ in await _text_rows(message_store)}
    assert left == {("ag", "c"), ("ag2", "a"), ("ag2", "b"), ("ag2", "c")}
    assert {h.thread_id for h in await _hits(message_store, "lisbon")} == {"c"}


async def test_a_database_made_before_the_text_table_is_filled_at_start(
    message_store: MessageStore,
) -> None:
    await project(message_store, _msgs())
    db = message_store.database
    before = [(h.thread_id, h.offset, h.content) for h in await _hits(message_store, "lisbon")]
    # the layout before it: no view, no table; a new process starts on it
    await message_store.engine.command(f"DROP VIEW {db}.{TEXT_VIEW}")
    await message_store.engine.command(f"DROP TABLE {db}.{TEXT_TABLE}")
    older = MessageStore(message_store.engine, db)
    # until the start fills it, the text is read from messages: the same hits
    assert [(h.thread_id, h.offset, h.content) for h in await _hits(older, "lisbon")] == before
    restarted = MessageStore(message_store.engine, db)
    await restarted.ensure_schema()
    assert len(await _text_rows(restarted)) == 12
    assert [(h.thread_id, h.offset, h.content) for h in await _hits(restarted, "lisbon")] == before
    await project(restarted, [m("d", 0, "user", "lisbon once more")])  # the view is back
    assert ("d", 0, "lisbon once more") in [
        (h.thread_id, h.offset, h.content) for h in await _hits(restarted, "lisbon")
    ]


async def test_an_interrupted_fill_is_not_read_and_fills_again(
    message_store: MessageStore,
) -> None:
    await project(message_store, _msgs())
    db = message_store.database
    # a start that stopped during the fill: the marker stands, half the rows are there
    await message_store.engine.command(f"CREATE TABLE {db}.{TEXT_FILLING} (x UInt8) ENGINE = Log")
    await message_store.engine.command(
        f"ALTER TABLE {db}.{TEXT_TABLE} DELETE WHERE thread_id IN ('a', 'b')"
    )
    reader = MessageStore(message_store.engine, db)  # another process, not filling
    assert {h.thread_id for h in await _hits(reader, "lisbon")} == {"a", "b", "c"}
    restarted = MessageStore(message_store.engine, db)
    await restarted.ensure_schema()
    assert len(await _text_rows(restarted)) == 12
    assert (await restarted._tables(TEXT_FILLING)) == [False]


async def test_a_replay_target_s_text_is_filled_once_by_its_seal(chdb_engine: ChdbEngine) -> None:
    """A replay's target loads without the text view (one fill at the seal costs less than
    a write per batch); until then its searches read the text from ``messages``. A resumed
    replay stays deferred, a second seal changes nothing, later inserts go through the view."""
    target = MessageStore(chdb_engine, f"t_{uuid.uuid4().hex[:12]}")
    await target.ensure_schema(defer_postings=True)
    await project(target, _msgs()[:8])
    await target.ensure_schema(defer_postings=True)  # a resumed replay
    await project(target, _msgs()[8:])
    assert await _text_rows(target) == []
    await target.seal_postings()
    assert {h.thread_id for h in await _hits(target, "rooftop")} == {"a", "b", "c"}
    await target.seal_postings()
    rows = await _text_rows(target)
    assert len(rows) == 12
    reader = MessageStore(chdb_engine, target.database)  # another process: reads the table
    assert await reader._has_text()
    await project(target, [m("d", 0, "user", "a rooftop bar")])
    assert len(await _text_rows(target)) == 13
    assert ("d", 0, "a rooftop bar") in [
        (h.thread_id, h.offset, h.content) for h in await _hits(reader, "rooftop")
    ]


async def test_an_erasure_cut_after_the_text_completes_when_run_again(
    message_store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text goes first, by keys read from the messages; a run cut before the messages'
    deletion leaves them, and the rerun finds the same keys (none left) and finishes."""
    await project(message_store, _msgs())
    engine = message_store.engine
    real = engine.command

    async def cut(sql: str) -> None:
        if f"{message_store.database}.messages DELETE" in sql:
            raise RetryableInfraError("chdb: killed")
        await real(sql)

    monkeypatch.setattr(engine, "command", cut)
    with pytest.raises(RetryableInfraError):
        await message_store.erase_threads([("acc", "ag", "a")])
    monkeypatch.setattr(engine, "command", real)
    assert {t for _, _, t, _, _ in await _text_rows(message_store)} == {"b", "c"}
    assert await message_store.erase_threads([("acc", "ag", "a")]) == 4
    assert {t for _, _, t, _, _ in await _text_rows(message_store)} == {"b", "c"}
    assert {h.thread_id for h in await _hits(message_store, "lisbon")} == {"b", "c"}
