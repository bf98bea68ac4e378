"""The message projector end to end: ``journal`` topic on a real broker -> runtime -> chdb.

Covers: user and assistant messages become searchable, system/tool/reasoning never do; a
poison record is dead-lettered and projection continues; redelivered events and a full
replay of the topic leave exactly one search hit per message.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.projections.messages import ChdbEngine, MessageStore, SearchSpec, query_words
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message, Role, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.dlq import list_dead_letters
from memstream.streams.message_projector import NAME, MessageProjector
from memstream.streams.runner import Runner

pytestmark = pytest.mark.asyncio(loop_scope="session")

T = datetime(2026, 3, 1, tzinfo=UTC)


class Pipeline:
    def __init__(
        self, bootstrap: str, topics: Topics, store: MessageStore, projector: MessageProjector
    ) -> None:
        self.bootstrap, self.topics, self.store = bootstrap, topics, store
        self.projector = projector


@pytest.fixture(scope="module")
async def pipeline(
    kafka_bootstrap: str, chdb_engine: ChdbEngine, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 2, 1) for n in (topics.journal, topics.dlq)])
    finally:
        await admin.close()
    store = MessageStore(chdb_engine, database=f"p_{uuid.uuid4().hex[:12]}")
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        partitions=2,
        data_dir=tmp_path_factory.mktemp("msgproj"),
    )
    projector = MessageProjector(store, batch_within_s=0.05)
    runner = Runner(
        settings,
        {NAME: lambda: projector},
        make_metrics(),
        lag_interval_s=None,
    )
    await runner.start()
    try:
        await runner.wait_ready(60)
        yield Pipeline(kafka_bootstrap, topics, store, projector)
    finally:
        await runner.stop()


def msg(acct: str, thread: str, offset: int, role: Role, content: str, **kw: object) -> Message:
    return Message(
        account_id=acct,
        agent_id="ag",
        thread_id=thread,
        offset=offset,
        message_id=f"{acct}-{thread}-{offset}",
        role=role,
        content=content,
        created_at=T + timedelta(seconds=offset),
        **kw,  # type: ignore[arg-type]  # Message's other fields, as each test gives them
    )


async def produce(p: Pipeline, records: Sequence[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=p.bootstrap)
    await producer.start()
    try:
        for k, v in records:
            await producer.send(p.topics.journal, value=v, key=k)
        await producer.flush()
    finally:
        await producer.stop()


def records(msgs: Sequence[Message]) -> list[tuple[bytes, bytes]]:
    return [
        (
            ThreadRef(m.account_id, m.agent_id, m.thread_id).key.encode(),
            encode(message_appended(m, ts=1)),
        )
        for m in msgs
    ]


async def settle(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.1)


async def hits(p: Pipeline, acct: str, q: str) -> list[tuple[str, int]]:
    found = await p.store.search(SearchSpec(acct, "ag", None, query_words(q), 50))
    return sorted((h.thread_id, h.offset) for h in found)


async def test_messages_project_and_replays_leave_one_row_each(pipeline: Pipeline) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [
        msg(acct, "th1", 0, "system", "system prompt about otters"),
        msg(acct, "th1", 1, "user", "tell me about sea otters"),
        msg(acct, "th1", 2, "assistant", "Sea otters hold hands", reasoning="otters secret"),
        msg(acct, "th1", 3, "tool", "tool says otters", tool_call_id="c1"),
        *[msg(acct, f"th{i}", 0, "user", f"otters fact number {i}") for i in range(2, 40)],
    ]
    await produce(pipeline, records(msgs))
    # a poison record between good ones: dead-lettered, projection goes on
    await produce(pipeline, [(b"k", b"{not json"), *records([msg(acct, "last", 0, "user", "x")])])

    expected = sorted([("th1", 1), ("th1", 2)] + [(f"th{i}", 0) for i in range(2, 40)])

    async def projected() -> bool:
        return await hits(pipeline, acct, "otters") == expected and bool(
            await hits(pipeline, acct, "x")
        )

    await settle(projected)
    assert await hits(pipeline, acct, "secret") == []
    assert await hits(pipeline, acct, "system prompt") == []
    assert await hits(pipeline, acct, "tool says") == []

    dead = await list_dead_letters(pipeline.bootstrap, pipeline.topics, None, processor=NAME)
    assert any("not json" in d.payload for d in dead)

    # redelivery of some events and a full replay: still one hit per message
    before = pipeline.projector.rows_written
    await produce(pipeline, records(msgs[:5]) + records(msgs))

    async def replayed() -> bool:
        # the replay holds 40 searchable messages (the redelivered ones may share a batch
        # with their replayed copies and be deduped there)
        return pipeline.projector.rows_written >= before + 40

    await settle(replayed)
    assert await hits(pipeline, acct, "otters") == expected
