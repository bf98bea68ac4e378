"""Crypto-shredding of the Kafka copies (issue 13), on a real broker and Postgres.

What the brokers hold is read raw, from offset 0 of every topic (journal, memory, summaries,
dead letters): before an erasure the content is there only sealed (no plaintext byte of
it) and opens with its data key; after the erasure of a user it opens nowhere, in a process
with a fresh key cache, through the processors' dispatcher (shredded records skipped, not
dead-lettered) and through both replay sources; the other user's content still opens. A
crash half-way through an erasure, with the erased threads still unpublished in the relay's
backlog, still ends with nothing readable.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest
import pytest_asyncio

from memstream.agents_ctx.erasure import Erasures
from memstream.agents_ctx.memory.store import MemoryService
from memstream.infra.data_keys import Keyring, is_sealed, thread_scope, user_scope
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.kafka.bus import Bus
from memstream.infra.metrics import Metrics, make_metrics
from memstream.infra.settings import Settings
from memstream.projections.replay_sources import JournalSource, TopicSource
from memstream.schemas.count_header import COUNT_HEADER, read_count_header
from memstream.schemas.events import Envelope, decode, summary_requested
from memstream.schemas.records import Caller, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.counters import CountersProcessor, record_step
from memstream.streams.journal_relay import JournalRelay
from memstream.streams.outbox_relay import OutboxRelay
from memstream.streams.processor import (
    Dispatcher,
    EventMeta,
    Processor,
    ProcessorContext,
    RawRecord,
    RetryPolicy,
)
from tests.fixtures.api import ApiStack
from tests.fixtures.binding import EVERY_AGENT_BOUND
from tests.fixtures.stores import tables_holding
from tests.kafka_helpers import read_topic, read_topic_records

pytestmark = pytest.mark.asyncio(loop_scope="session")

SECRET = b"quince-armadillo"  # only in the erased user's content
KEPT = b"saffron-pelican"  # only in the other user's content


@pytest_asyncio.fixture(loop_scope="session")
async def shred(api_stack: ApiStack) -> AsyncIterator[ApiStack]:
    svc = api_stack.services
    svc.keyring = Keyring(api_stack.pool)
    svc.memory = MemoryService(api_stack.pool, api_stack.clock, binding=EVERY_AGENT_BOUND)
    svc.erasures = Erasures(svc, rewrite_tables=True)
    yield api_stack
    await svc.erasures.close()
    svc.keyring = svc.erasures = svc.memory = None


async def seed(s: ApiStack, agent: str, thread: str, user: str, word: bytes) -> ThreadRef:
    for i in range(3):
        r = await s.client.post(
            f"/v1/agents/{agent}/threads/{thread}/messages",
            json={"role": "user", "content": f"{user} note {i}: {word.decode()}"},
            headers=s.headers(user=user),
        )
        assert r.status_code == 201, r.text
    return ThreadRef("acme", agent, thread)


async def raw_values(bootstrap: str, topics: Topics) -> dict[str, list[bytes]]:
    """Every record value of every topic, from offset 0."""
    out: dict[str, list[bytes]] = {}
    for topic in topics.all():
        parts = await read_topic(bootstrap, topic)
        out[topic] = [v for recs in parts.values() for _, v in recs]
    return out


async def opened(s: ApiStack, values: Sequence[bytes]) -> list[bytes]:
    """What a process with a fresh key cache can read of ``values`` (shredded left out)."""
    got = await Keyring(s.pool).open_many(values)
    return [v for v in got if v is not None]


class Collect(Processor):
    name = "collect"
    topic = "journal"

    def __init__(self) -> None:
        self.seen: list[Envelope] = []

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        if SECRET in str(envelope.data.get("content", "")).encode():
            raise RuntimeError("a handler that fails on the secret (dead letter)")
        self.seen.append(envelope)


class HeaderReader(Processor):
    """A raw processor that, like the counters, reads a message from its count header."""

    name = "count-reader"
    topic = "journal"
    raw = True
    batch_max = 500
    needs_plaintext = CountersProcessor.needs_plaintext

    def __init__(self) -> None:
        self.seen: list[RawRecord] = []

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        self.seen.extend(records)


async def publish_pipeline(s: ApiStack, bus: Bus, topics: Topics, relay: JournalRelay) -> None:
    assert await relay.wait_caught_up(60)
    assert s.services.keyring is not None
    await OutboxRelay(s.pool, bus, topics.memory, keyring=s.services.keyring).drain()


async def test_erasure_shreds_every_topic_copy(
    shred: ApiStack, kafka_bootstrap: str, unique_topics: Topics, pg_server: EmbeddedPostgres
) -> None:
    s, svc, topics = shred, shred.services, unique_topics
    assert svc.keyring is not None and svc.memory is not None and svc.erasures is not None
    await ensure_topics(kafka_bootstrap, topics, 2, 1)
    bus = Bus(kafka_bootstrap)
    await bus.start()
    relay = JournalRelay(s.journal, bus, topics, keyring=svc.keyring, poll_interval=0.01)
    await relay.start()
    try:
        alice_threads = [await seed(s, "bot", f"al-{i}", "alice", SECRET) for i in range(2)]
        bob_thread = await seed(s, "bot", "bo-1", "bob", KEPT)
        await svc.memory.store(
            Caller("acme", "bot", "alice"),
            "w",
            f"alice loves {SECRET.decode()}",
            "user_profile",
            "private",
        )
        await svc.memory.store(
            Caller("acme", "bot", "bob"),
            "w",
            f"bob loves {KEPT.decode()}",
            "user_profile",
            "private",
        )
        await publish_pipeline(s, bus, topics, relay)
        # sealed messages still carry their count header, which holds no content
        sealed = [
            r
            for rs in (await read_topic_records(kafka_bootstrap, topics.journal)).values()
            for r in rs
        ]
        assert all(is_sealed(r.value) for r in sealed)
        messages = [r for r in sealed if r.headers]  # the threads' creations have none
        assert len(messages) == 9 and len(sealed) == 12
        for rec in messages:
            ((name, header),) = rec.headers
            assert name == COUNT_HEADER and SECRET not in header and KEPT not in header
            ids, offset, _ = read_count_header(header) or ((), -1, 0)
            assert rec.meta.key is not None and "/".join(ids).encode() == rec.meta.key
            assert offset in (0, 1, 2)
        # a processor publishes about each thread (the summarizer's and counters' path)
        ctx = ProcessorContext(
            "p", "g", Settings(), topics, make_metrics(), bus_publish(bus), keyring=svc.keyring
        )
        for ref, word in ((alice_threads[0], SECRET), (bob_thread, KEPT)):
            env = summary_requested(
                "acme",
                "bot",
                ref.thread_id,
                up_to_offset=2,
                from_offset=0,
                token_count=9,
                message_count=3,
                ts=1,
            )
            env.data["note"] = word.decode()
            await ctx.publish(topics.summaries, env, ref.key)
        # a handler failing on alice's records dead-letters them: the letters keep them sealed
        journal_records = raw_records(await read_topic(kafka_bootstrap, topics.journal), topics)
        with_headers = [
            r
            for rs in (await read_topic_records(kafka_bootstrap, topics.journal)).values()
            for r in rs
        ]
        reading = HeaderReader()
        await Dispatcher(
            reading,
            dlq_topic=topics.dlq,
            publish=bus_publish(bus),
            metrics=make_metrics(),
            keyring=Keyring(s.pool),
        ).dispatch(with_headers)
        assert len(reading.seen) == 12  # nothing shredded yet
        assert sum(is_sealed(r.value) for r in reading.seen) == 9  # the messages: not opened
        steps = [record_step(r) for r in reading.seen if r.headers]
        assert sorted(step[1] for step in steps if step is not None) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        metrics = make_metrics()
        await Dispatcher(
            Collect(),
            dlq_topic=topics.dlq,
            publish=bus_publish(bus),
            metrics=metrics,
            retry=RetryPolicy(attempts=1),
            keyring=svc.keyring,
        ).dispatch(journal_records)

        before = await raw_values(kafka_bootstrap, topics)
        assert all(SECRET not in v and KEPT not in v for vs in before.values() for v in vs)
        for name in (topics.journal, topics.memory, topics.summaries):  # (letters: below)
            assert any(is_sealed(v) for v in before[name]), name
        readable = await opened(s, [v for vs in before.values() for v in vs])
        assert sum(SECRET in v for v in readable) >= 6 + 1 + 1  # messages, entry, summary
        letters = [decode(v) for v in before[topics.dlq]]
        assert len(letters) == 6  # alice's messages, each dead-lettered once
        assert all(x.data["payload_encoding"] == "base64" and x.data["lossless"] for x in letters)
        assert all(is_sealed(base64.b64decode(str(x.data["payload"]))) for x in letters)

        scopes = [thread_scope("acme", "bot", f"al-{i}").text for i in range(2)]
        scopes.append(user_scope("acme", "alice").text)
        alice_keys = [
            bytes(r["key"])
            for r in await s.pool.fetch(
                "SELECT key FROM data_keys WHERE scope = ANY($1::text[])", scopes
            )
        ]
        assert len(alice_keys) == 3
        assert await tables_holding(s.pool, pg_server.pgdata, alice_keys[0]) == ["data_keys"]
        erasure_id = await svc.erasures.erase_user("acme", "alice")
        await svc.erasures.wait(erasure_id)
        done = await svc.erasures.get("acme", erasure_id)
        assert done.status == "done" and done.stores["data_keys"] == 3  # 2 threads + the user
        # the key bytes are in no file of the database either (erasure_rewrite_tables): read
        # from Postgres's data folder, they would open every sealed copy again
        for key in alice_keys:
            assert await tables_holding(s.pool, pg_server.pgdata, key) == []
        assert done.stores["postgres_outbox"] >= 1
        await publish_pipeline(s, bus, topics, relay)  # the forgotten events
        # the key of an erased thread or a user mid-erasure is never made again
        assert await svc.keyring.keys_for([thread_scope("acme", "bot", "al-0")]) == {}

        after = await raw_values(kafka_bootstrap, topics)
        everything = [v for vs in after.values() for v in vs]
        assert len(everything) > len([v for vs in before.values() for v in vs])
        assert all(SECRET not in v for v in everything)
        readable = await opened(s, everything)
        assert all(SECRET not in v for v in readable)
        assert sum(KEPT in v for v in readable) >= 3 + 1 + 1  # bob's messages, entry, summary
        assert await svc.keyring.keys_for([user_scope("acme", "bob")], create=False) != {}
        assert (
            await s.pool.fetchval(
                "SELECT count(*) FROM memory_outbox WHERE position($1 in event) > 0", SECRET
            )
            == 0
        )

        # processors: the shredded records are skipped and counted, nothing dead-lettered
        collect, letters_sent = Collect(), []

        async def record_dlq(topic: str, key: bytes | None, value: bytes) -> None:
            letters_sent.append(value)

        async def dispatch_fresh(processor: Processor, records: list[RawRecord]) -> Metrics:
            """``records`` through a dispatcher with a fresh key cache; its metrics."""
            metrics = make_metrics()
            await Dispatcher(
                processor,
                dlq_topic=topics.dlq,
                publish=record_dlq,
                metrics=metrics,
                keyring=Keyring(s.pool),
            ).dispatch(records)
            return metrics

        fresh = await dispatch_fresh(collect, journal_records)
        assert letters_sent == []
        assert {e.thread_id for e in collect.seen} == {"bo-1"}
        assert fresh.shredded_records.labels("collect")._value.get() == 8  # 2 x (created + 3)
        # a processor counting from the count header gets its messages still sealed, and the
        # shredded ones are skipped all the same
        counting = HeaderReader()
        counted_metrics = await dispatch_fresh(counting, with_headers)
        assert letters_sent == []
        assert counted_metrics.shredded_records.labels("count-reader")._value.get() == 8
        got_messages = [r for r in counting.seen if r.headers]
        assert len(got_messages) == 3 and all(is_sealed(r.value) for r in got_messages)
        assert {step[0][2] for step in map(record_step, got_messages) if step} == {"bo-1"}
        (created,) = [r for r in counting.seen if not r.headers]  # no header: opened
        assert decode(created.value).thread_id == "bo-1"
        # replays: from the topic (a fresh process) and from the journal
        for source in (
            TopicSource(kafka_bootstrap, topics.journal, keyring=Keyring(s.pool)),
            TopicSource(kafka_bootstrap, topics.memory, keyring=Keyring(s.pool)),
            JournalSource(s.journal),
        ):
            ends = await source.ends()
            values = [
                v
                async for batch in source.read(await source.starts(), ends, 500)
                for v in batch.values
            ]
            assert values and all(SECRET not in v for v in values)
            assert any(KEPT in v for v in values)
    finally:
        await relay.stop()
        await bus.stop()


def raw_records(
    parts: dict[int, list[tuple[bytes | None, bytes]]], topics: Topics
) -> list[RawRecord]:
    return [
        RawRecord(EventMeta(topics.journal, p, i, k), v)
        for p, recs in parts.items()
        for i, (k, v) in enumerate(recs)
    ]


def bus_publish(bus: Bus) -> Callable[[str, bytes | None, bytes], Awaitable[None]]:
    async def publish(topic: str, key: bytes | None, value: bytes) -> None:
        await bus.publish_many(topic, [((key or b"").decode(), value)])

    return publish


async def test_crash_mid_erasure_with_unpublished_backlog_leaves_nothing_readable(
    shred: ApiStack, kafka_bootstrap: str, unique_topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, svc, topics = shred, shred.services, unique_topics
    assert svc.keyring is not None and svc.memory is not None and svc.erasures is not None
    await ensure_topics(kafka_bootstrap, topics, 2, 1)
    # carol's and dave's content is in the journal and the outbox, not yet on Kafka
    await seed(s, "bot", "ca-1", "carol", SECRET)
    await seed(s, "bot", "da-1", "dave", KEPT)
    await svc.memory.store(
        Caller("acme", "bot", "carol"),
        "w",
        f"carol says {SECRET.decode()}",
        "user_profile",
        "private",
    )
    await svc.memory.store(
        Caller("acme", "bot", "dave"), "w", f"dave says {KEPT.decode()}", "user_profile", "private"
    )
    crashed = Erasures._erase_threads

    async def crash(self: Erasures, *a: object) -> None:
        raise OSError("injected crash after the keys step, before the journal")

    monkeypatch.setattr(Erasures, "_erase_threads", crash)
    erasure_id = await svc.erasures.erase_user("acme", "carol")
    await svc.erasures.wait(erasure_id)
    assert (await svc.erasures.get("acme", erasure_id)).status == "running"

    # the relays run now: carol's envelopes are still the originals in the journal
    bus = Bus(kafka_bootstrap)
    await bus.start()
    relay = JournalRelay(s.journal, bus, topics, keyring=Keyring(s.pool))
    await relay.start()
    try:
        await publish_pipeline(s, bus, topics, relay)
        monkeypatch.setattr(Erasures, "_erase_threads", crashed)
        await svc.erasures.run(erasure_id)  # what resume() does at start-up
        assert (await svc.erasures.get("acme", erasure_id)).status == "done"
        await publish_pipeline(s, bus, topics, relay)
    finally:
        await relay.stop()
        await bus.stop()
    everything = [v for vs in (await raw_values(kafka_bootstrap, topics)).values() for v in vs]
    assert all(SECRET not in v for v in everything)
    readable = await opened(s, everything)
    assert all(SECRET not in v for v in readable)
    assert sum(KEPT in v for v in readable) >= 3 + 1  # dave's messages and entry
