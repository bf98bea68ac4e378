"""``replay messages`` with the dense side on (real chdb, the offline embedder, on both dense
paths: ClickHouse's scan and the qdrant-edge vector index): the seal carries the old
generation's vectors and fills the new generation's index before the gate closes; the
switch, under the gate, carries only the vectors that came since (the vector loop's, the
hand-over's messages'), writes them into the index without filling it again, and leaves
out threads erased meanwhile; a seal run twice (a resumed replay) writes nothing twice."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from memstream.agents_ctx.journal_tools.search import build_search_spec
from memstream.infra.embeddings import CachingEmbedder
from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.projections.messages.engine import Row
from memstream.projections.messages.sql import SqlParam
from memstream.projections.messages.vectors import MessageVectors
from memstream.projections.replay_sinks import MessagesSink
from memstream.schemas.events import message_appended
from memstream.schemas.records import Caller, Message, ThreadRef
from tests.integration.test_search_dense import EVIDENCE, FILLER, PARAPHRASE
from tests.integration.test_transcript_search import m, project, search

LATE = [
    "My cat knocked the blue vase off the kitchen shelf yesterday.",
    "We are planning a trip to the mountains next spring.",
    "The plumber fixed the leaking pipe under the sink.",
]
FILLING_LOG = "filling the vector index"


def conversation(thread: str = "conv") -> list[Message]:
    msgs = [
        m(thread, i, "user" if i % 2 == 0 else "assistant", FILLER[i % len(FILLER)])
        for i in range(24)
    ]
    return [*msgs, m(thread, 24, "user", EVIDENCE)]


async def live_store(
    engine: ChdbEngine,
    embedder: CachingEmbedder,
    vector_root: Path | None,
    msgs: list[Message],
    index_root: Path | None = None,
) -> MessageStore:
    """A live generation holding ``msgs``, every one with its vector."""
    live = MessageStore(
        engine,
        f"t_{uuid.uuid4().hex[:12]}",
        embedder=embedder,
        vector_root=vector_root,
        index_root=index_root,
    )
    await live.ensure_schema()
    await project(live, msgs)
    await MessageVectors(live, embedder).catch_up()
    return live


async def loaded(sink: MessagesSink, msgs: list[Message]) -> None:
    """What the replay's bulk copy does: a fresh generation 2 with ``msgs``."""
    await sink.prepare(2, fresh=True)
    await sink.apply(2, [message_appended(x, ts=1) for x in msgs])


async def vector_rows(store: MessageStore, database: str) -> tuple[int, int]:
    """(rows, distinct keys) of ``database``'s ``message_vectors``, before any merge."""
    rows = await store.engine.rows(
        "SELECT count(), uniqExact(account_id, agent_id, thread_id, `offset`, model) "
        f"FROM {database}.message_vectors",
        {},
    )
    return int(str(rows[0][0])), int(str(rows[0][1]))


async def points(store: MessageStore, embedder: CachingEmbedder, database: str) -> int | None:
    index = store.vector_index(embedder.model, database)
    return None if index is None else await index.count()


async def nearest(store: MessageStore, embedder: CachingEmbedder, text: str) -> tuple[str, int]:
    """The message whose vector is nearest to ``text``'s (the dense side alone)."""
    spec = build_search_spec(Caller("acc", "ag", None), text)
    vector = (await embedder.embed_query([text]))[0]
    dense = await store.dense(spec, vector, embedder.model)
    return next(iter(dense))


async def test_the_seal_carries_and_indexes_the_bulk_and_the_switch_only_what_came_since(
    chdb_engine: ChdbEngine,
    embedder: CachingEmbedder,
    vector_root: Path | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bulk = conversation()
    live = await live_store(chdb_engine, embedder, vector_root, bulk)
    before = await search(live, query=PARAPHRASE, limit=10)
    sink = MessagesSink(live, live.database)
    old = live.database
    await loaded(sink, bulk)
    new = sink.store(2).database

    await sink.seal(2)
    # before the gate would close: the bulk's vectors are in the new generation, indexed
    assert await vector_rows(live, new) == (25, 25)
    if vector_root is not None:
        index = live.vector_index(embedder.model, new)
        assert index is not None and index.ready and await index.count() == 25

    # after the seal: the live projector appends two messages to the old generation and the
    # vector loop embeds them there; a third comes too late for the loop; the hand-over
    # copies all three into the new generation
    late = [m("late", i, "user", text) for i, text in enumerate(LATE)]
    await project(live, late[:2])
    assert await MessageVectors(live, embedder).catch_up() == 2
    await project(live, late[2:])
    await sink.apply(2, [message_appended(x, ts=1) for x in late])

    caplog.clear()
    with caplog.at_level(logging.INFO):
        await sink.switch(2)
    assert live.database == new
    # the switch carried the two vectors, and filled no index
    assert not [r for r in caplog.records if FILLING_LOG in r.getMessage()]
    assert [r for r in caplog.records if "2 vectors carried since the seal" in r.getMessage()]
    assert await vector_rows(live, new) == (27, 27)
    if vector_root is not None:
        assert await points(live, embedder, new) == 27
    # the third is embedded by the loop in the new generation; all three are found densely
    assert await MessageVectors(live, embedder).catch_up() == 1
    assert await vector_rows(live, new) == (28, 28)
    for i, text in enumerate(LATE):
        assert await nearest(live, embedder, text) == ("late", i)
    # the same answers as the old generation, once its loop has embedded the third too
    previous = MessageStore(chdb_engine, old, embedder=embedder, vector_root=vector_root)
    assert await MessageVectors(previous, embedder).catch_up() == 1
    for q in (PARAPHRASE, *LATE):
        assert await search(live, query=q, limit=10) == await search(previous, query=q, limit=10)
    assert await search(live, query=PARAPHRASE, limit=10) != before  # the late ones count
    await sink.drop(1)


async def test_a_seal_run_again_writes_nothing_twice(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None
) -> None:
    """A resumed replay seals again: with nothing new, nothing is written; with a vector the
    old generation gained, only that one (into the filled index too); a fill interrupted
    (its marker left) is completed by the next seal."""
    bulk = conversation()
    live = await live_store(chdb_engine, embedder, vector_root, bulk)
    sink = MessagesSink(live, live.database)
    await loaded(sink, bulk)
    new = sink.store(2).database
    await sink.seal(2)
    await sink.seal(2)
    assert await vector_rows(live, new) == (25, 25)

    extra = m("conv", 25, "assistant", LATE[0])
    await project(live, [extra])
    await MessageVectors(live, embedder).catch_up()
    before = await search(live, query=PARAPHRASE, limit=10)
    await sink.apply(2, [message_appended(extra, ts=1)])
    await sink.seal(2)
    assert await vector_rows(live, new) == (26, 26)
    if vector_root is not None:
        index = live.vector_index(embedder.model, new)
        assert index is not None and index.ready and await index.count() == 26
        index.mark_filling()  # a seal interrupted mid-fill
        await sink.seal(2)
        assert index.ready and await index.count() == 26
    assert await vector_rows(live, new) == (26, 26)

    await sink.switch(2)
    assert await vector_rows(live, new) == (26, 26)
    assert await MessageVectors(live, embedder).catch_up() == 0
    assert await search(live, query=PARAPHRASE, limit=10) == before
    assert await nearest(live, embedder, LATE[0]) == ("conv", 25)


async def test_a_thread_erased_between_the_seal_and_the_switch_stays_erased(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None, tmp_path: Path
) -> None:
    """Erasure deletes from the current generation; the thread's rows and vectors copied
    into the replay's target (by the load, by the seal's carry) go at the switch, from its
    lexical index too."""
    msgs = conversation("keep") + [m("gone", i, "user", text) for i, text in enumerate(LATE)]
    live = await live_store(chdb_engine, embedder, vector_root, msgs, tmp_path / "tantivy")
    sink = MessagesSink(live, live.database)
    await loaded(sink, msgs)
    new = sink.store(2).database
    await sink.seal(2)
    assert await vector_rows(live, new) == (28, 28)

    # what erasure does: the registry first, then the current generation's rows
    live.erased.add([ThreadRef("acc", "ag", "gone")])
    await live.erase_threads([("acc", "ag", "gone")])
    await sink.switch(2)

    assert await vector_rows(live, new) == (25, 25)
    assert await live.thread_row_counts("acc", "ag", "gone") == (0, 0)
    if vector_root is not None:
        assert await points(live, embedder, new) == 25
    for text in LATE:
        assert {t for t, _ in await search(live, query=text, limit=50)} <= {"keep"}
    assert await MessageVectors(live, embedder).catch_up() == 0
    assert (await search(live, query=PARAPHRASE, limit=3))[0] == ("keep", 24)


class _ErasingOnce:
    """The engine, but the first query after :meth:`arm` first runs an erasure (as one that
    starts while the switch runs: the registry, then the then-current generation's rows)."""

    def __init__(self, engine: ChdbEngine, store: MessageStore, ref: ThreadRef) -> None:
        self._engine = engine
        self._store = store
        self._ref = ref
        self._armed = False

    def arm(self) -> None:
        self._armed = True

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    async def rows(self, sql: str, params: Mapping[str, SqlParam]) -> list[Row]:
        if self._armed:
            self._armed = False
            self._store.erased.add([self._ref])
            await self._store.erase_threads(
                [(self._ref.account_id, self._ref.agent_id, self._ref.thread_id)]
            )
        return await self._engine.rows(sql, params)


async def test_a_thread_erased_while_the_switch_runs_stays_erased(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None
) -> None:
    msgs = conversation("keep") + [m("gone", i, "user", text) for i, text in enumerate(LATE)]
    live = await live_store(chdb_engine, embedder, vector_root, msgs)
    sink = MessagesSink(live, live.database)
    await loaded(sink, msgs)
    old, new = live.database, sink.store(2).database
    await sink.seal(2)
    erasing = _ErasingOnce(chdb_engine, live, ThreadRef("acc", "ag", "gone"))
    live.engine = erasing  # type: ignore[assignment]  # a stand-in that erases once
    try:
        erasing.arm()
        await sink.switch(2)
    finally:
        live.engine = chdb_engine
    assert live.database == new
    erased_from = MessageStore(chdb_engine, old)
    assert await erased_from.thread_row_counts("acc", "ag", "gone") == (0, 0)  # the erasure's
    assert await live.thread_row_counts("acc", "ag", "gone") == (0, 0)  # and the switch's
    assert await vector_rows(live, new) == (25, 25)
    if vector_root is not None:
        assert await points(live, embedder, new) == 25


async def test_without_an_embedder_the_seal_carries_the_vectors_and_fills_no_index(
    chdb_engine: ChdbEngine, embedder: CachingEmbedder, vector_root: Path | None
) -> None:
    """Dense search off (no embedder): the vectors are still carried (a later start with it
    on finds them), but no vector index is filled."""
    bulk = conversation()
    live = await live_store(chdb_engine, embedder, vector_root, bulk)
    live.embedder = None
    sink = MessagesSink(live, live.database)
    await loaded(sink, bulk)
    new = sink.store(2).database
    await sink.seal(2)
    assert await vector_rows(live, new) == (25, 25)
    if vector_root is not None:
        assert not (vector_root / new).exists()
    await sink.switch(2)
    assert await vector_rows(live, new) == (25, 25)
    if vector_root is not None:
        assert not (vector_root / new).exists()
