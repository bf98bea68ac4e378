"""The journal relay against real brokers: order per thread, catch-up after a broker outage.

Runs against Apache Kafka (``kafka_bootstrap``); ``@pytest.mark.tansu`` tests repeat the
ordering check on Tansu. The outage test owns its broker (stopped and restarted on the same
port and data dir), so the session broker is never disturbed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from memstream.infra.embedded.kafka import ApacheKafkaServer
from memstream.infra.journal import Journal
from memstream.infra.kafka import Bus, ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.supervisor import LoopState
from memstream.schemas.count_header import COUNT_HEADER
from memstream.schemas.events import decode
from memstream.schemas.records import NewMessage, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.counters import read_step, record_step
from memstream.streams.journal_relay import JournalRelay
from tests.kafka_helpers import read_topic, read_topic_records

THREADS = [ThreadRef("acct", "agent", f"t{i}") for i in range(6)]


async def append_round(journal: Journal, tag: str, rounds: int = 5) -> int:
    """Interleave appends across threads (2 messages per append); return messages added."""
    n = 0
    for r in range(rounds):
        await asyncio.gather(
            *(
                journal.append(
                    ref,
                    [
                        NewMessage(role="user", content=f"{tag} {r} q"),
                        NewMessage(role="assistant", content=f"{tag} {r} a"),
                    ],
                )
                for ref in THREADS
            )
        )
        n += 2 * len(THREADS)
    return n


def check_topic(
    partitions: dict[int, list[tuple[bytes | None, bytes]]], expected: int
) -> Counter[str]:
    """Assert what a deduping consumer needs; return the count of each event id seen."""
    seen: Counter[str] = Counter()
    first_value: dict[str, bytes] = {}
    per_thread: dict[str, list[int]] = defaultdict(list)
    for records in partitions.values():
        for key, value in records:
            env = decode(value)
            assert key is not None
            assert key.decode() == f"{env.account_id}/{env.agent_id}/{env.thread_id}"
            seen[env.id] += 1
            if env.id in first_value:
                assert first_value[env.id] == value, "a redelivery must be byte-identical"
                continue
            first_value[env.id] = value
            offset = env.data["offset"]
            assert isinstance(offset, int)
            per_thread[key.decode()].append(offset)
    assert len(seen) == expected, "every appended message is on the topic"
    for thread, offsets in per_thread.items():
        assert offsets == list(range(len(offsets))), f"{thread} out of order: {offsets}"
    return seen


@pytest_asyncio.fixture(loop_scope="session")
async def bus(kafka_bootstrap: str) -> AsyncIterator[Bus]:
    b = Bus(kafka_bootstrap, request_timeout_s=5)
    await b.start()
    yield b
    await b.stop()


async def test_relay_publishes_every_message_in_order_per_thread(
    journal: Journal, bus: Bus, kafka_bootstrap: str, unique_topics: Topics, kafka_broker_kind: str
) -> None:
    await ensure_topics(kafka_bootstrap, unique_topics, 3, 1)
    appended = await append_round(journal, "before")
    metrics = make_metrics()
    relay = JournalRelay(journal, bus, unique_topics, batch_size=25, metrics=metrics)
    assert bus.idempotent is (kafka_broker_kind == "kafka")
    await relay.start()
    assert relay.backlog == appended
    try:
        appended += await append_round(journal, "live")
        relay.notify()
        assert await relay.wait_caught_up(30)
        assert relay.backlog == 0
        await asyncio.sleep(0.1)  # the next pass exports the gauge
        gauge = metrics.sample("memstream_relay_backlog", {"relay": "journal"})
        assert gauge == 0
        assert await journal.relay_watermark() == await journal.last_seq() == appended
    finally:
        await relay.stop()
    seen = check_topic(await read_topic(kafka_bootstrap, unique_topics.journal), appended)
    assert set(seen.values()) == {1}, "no failure happened, so no duplicate"
    assert relay.stats.republished == 0


async def _published(relay: JournalRelay, seq: int, timeout_s: float = 20.0) -> float:
    """Seconds until the relay's watermark covers ``seq`` (checked every 5 ms)."""
    began = time.monotonic()
    async with asyncio.timeout(timeout_s):
        while relay.watermark < seq:
            await asyncio.sleep(0.005)
    return time.monotonic() - began


async def test_single_appends_in_a_stream_leave_in_one_pass_and_a_lone_one_at_once(
    journal: Journal, bus: Bus, kafka_bootstrap: str, unique_topics: Topics
) -> None:
    """The linger batches a stream of one-message appends (one pass, so one fetch and one
    batch in each processor), and delays nothing that comes after a quiet."""
    await ensure_topics(kafka_bootstrap, unique_topics, 3, 1)
    linger = 1.0
    relay = JournalRelay(journal, bus, unique_topics, linger_s=linger, poll_interval=60)
    ref = THREADS[0]
    await relay.start()
    try:
        await asyncio.sleep(linger)  # a quiet since the start's first pass
        await journal.append(ref, [NewMessage(role="user", content="alone")])
        relay.notify()
        lone_s = await _published(relay, await journal.last_seq())
        assert lone_s < linger / 2, f"a lone append waited {lone_s:.2f}s for the relay"
        passes = relay.stats.batches
        for i in range(5):  # right after that pass: one at a time, each notified
            await journal.append(ref, [NewMessage(role="user", content=f"stream {i}")])
            relay.notify()
        last = await journal.last_seq()
        await asyncio.sleep(linger * 0.3)
        assert relay.watermark < last, "the stream was relayed before the linger ran out"
        await _published(relay, last)
        assert relay.stats.batches == passes + 1, "the five appends left in one pass"
    finally:
        await relay.stop()
    seen = check_topic(await read_topic(kafka_bootstrap, unique_topics.journal), 6)
    assert set(seen.values()) == {1}


async def test_a_new_relay_resumes_from_the_recorded_watermark(
    journal: Journal, bus: Bus, kafka_bootstrap: str, unique_topics: Topics
) -> None:
    await ensure_topics(kafka_bootstrap, unique_topics, 2, 1)
    first = JournalRelay(journal, bus, unique_topics)
    await first.start()
    try:
        appended = await append_round(journal, "one", rounds=2)
        assert await first.wait_caught_up(30)
    finally:
        await first.stop()
    appended += await append_round(journal, "two", rounds=2)  # nobody relays these yet
    second = JournalRelay(journal, bus, unique_topics)
    await second.start()
    try:
        assert second.watermark == appended // 2
        assert await second.wait_caught_up(30)
    finally:
        await second.stop()
    seen = check_topic(await read_topic(kafka_bootstrap, unique_topics.journal), appended)
    assert set(seen.values()) == {1}


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
async def test_relay_catches_up_after_the_broker_stops_and_restarts(
    journal: Journal, tmp_path: Path, kafka_broker_kind: str, idempotent: bool
) -> None:
    if kafka_broker_kind != "kafka":
        pytest.skip("needs Apache Kafka (Tansu keeps no data across a restart)")
    broker = ApacheKafkaServer(tmp_path / "kafka")
    await broker.start()
    topics = Topics("outage.")
    # idempotent: aiokafka retries in place until the broker is back (no duplicates);
    # plain (Tansu's case): each attempt times out and the relay re-sends from its watermark
    bus = Bus(broker.address, request_timeout_s=2, idempotent=idempotent)
    state = LoopState()
    relay = JournalRelay(journal, bus, topics, batch_size=20, max_backoff=0.5, state=state)
    try:
        await ensure_topics(broker.address, topics, 3, 1)
        await relay.start()
        appended = await append_round(journal, "up", rounds=2)
        relay.notify()
        assert await relay.wait_caught_up(30)
        port = broker.port

        await broker.stop()
        # appends keep succeeding while Kafka is down; the relay cannot publish them
        appended += await asyncio.wait_for(append_round(journal, "down", rounds=3), 10)
        relay.notify()
        assert not await relay.wait_caught_up(3)
        assert relay.backlog > 0
        assert relay.watermark < appended
        if idempotent:
            assert relay.publishing_for > 1  # stalled on Kafka, visible for health checks
        else:  # its loop state says what it waits for (/readyz, the console, /metrics)
            assert state.state == "waiting" and state.waiting_for == "kafka", state

        broker = ApacheKafkaServer(tmp_path / "kafka", port=port)
        await broker.start()
        appended += await append_round(journal, "back", rounds=2)
        relay.notify()
        assert await relay.wait_caught_up(60)
        assert relay.backlog == 0
        assert await journal.relay_watermark() == appended
        assert state.state == "running", state

        seen = check_topic(await read_topic(broker.address, topics.journal), appended)
        duplicates = sum(c - 1 for c in seen.values())
        # duplicates are only same-id redeliveries of what was in flight when it failed
        assert duplicates <= relay.stats.republished
        if idempotent:
            assert duplicates == 0  # retried in place by the idempotent producer
        else:
            assert relay.stats.failures >= 1  # the relay saw the outage and retried
        print(f"outage: {appended} messages, {duplicates} redelivered, {relay.stats}")
    finally:
        await relay.stop()
        await bus.stop()
        await broker.stop()


async def test_an_oversized_record_is_quarantined_and_every_tenant_goes_on(
    journal: Journal, bus: Bus, kafka_bootstrap: str, unique_topics: Topics
) -> None:
    """Issue 12, defect 2: a record the broker would refuse used to stop the relay for all."""
    from memstream.errors import InvalidRequest
    from memstream.schemas.events import thread_event
    from memstream.schemas.limits import MAX_BUS_RECORD_BYTES

    await ensure_topics(kafka_bootstrap, unique_topics, 2, 1)
    # the API's edge refuses a message the bus cannot carry, naming the field
    with pytest.raises(InvalidRequest) as refused:
        await journal.append(THREADS[0], [NewMessage(role="user", content="\U0001f600" * 400_000)])
    assert refused.value.field == "messages[0].content"
    # one got into the journal anyway (an older version, a direct event): it is quarantined
    huge = thread_event(
        "thread.created", "other", "agent", "big", ts=1, data={"blob": "x" * MAX_BUS_RECORD_BYTES}
    )
    seq = await journal.append_event(huge)
    appended = await append_round(journal, "after", rounds=1)
    metrics = make_metrics()
    relay = JournalRelay(journal, bus, unique_topics, metrics=metrics)
    await relay.start()
    try:
        assert await relay.wait_caught_up(30), relay.stats  # not stuck behind the big one
    finally:
        await relay.stop()
    assert relay.stats.quarantined == 1
    check_topic(await read_topic(kafka_bootstrap, unique_topics.journal), appended)
    letters = [
        decode(v)
        for recs in (await read_topic(kafka_bootstrap, unique_topics.dlq)).values()
        for _, v in recs
    ]
    assert [(d.data["origin_offset"], d.account_id) for d in letters] == [(seq, "other")]
    assert "quarantined" in str(letters[0].data["error"])
    sample = metrics.sample(
        "memstream_dlq_events_total",
        {"processor": "journal-relay", "origin_topic": unique_topics.journal},
    )
    assert sample == 1


async def check_count_headers(bootstrap: str, topic: str, expected: int) -> None:
    """Every message on ``topic`` carries the count header, and it says what its envelope
    says (what the counters read from it)."""
    records = [r for recs in (await read_topic_records(bootstrap, topic)).values() for r in recs]
    assert len(records) == expected
    for rec in records:
        assert [name for name, _ in rec.headers] == [COUNT_HEADER]
        assert record_step(rec) == read_step(rec.value) is not None


async def test_every_message_travels_with_the_count_header_its_envelope_says(
    journal: Journal, bus: Bus, kafka_bootstrap: str, unique_topics: Topics
) -> None:
    await ensure_topics(kafka_bootstrap, unique_topics, 3, 1)
    relay = JournalRelay(journal, bus, unique_topics, batch_size=7)
    await relay.start()
    try:
        appended = await append_round(journal, "counted", rounds=2)
        relay.notify()
        assert await relay.wait_caught_up(30)
    finally:
        await relay.stop()
    await check_count_headers(kafka_bootstrap, unique_topics.journal, appended)


@pytest.mark.tansu
async def test_relay_order_per_thread_on_tansu(
    journal: Journal, tansu_bootstrap: str, unique_topics: Topics
) -> None:
    await ensure_topics(tansu_bootstrap, unique_topics, 3, 1)
    async with Bus(tansu_bootstrap, request_timeout_s=5) as bus:
        assert bus.idempotent is False  # Tansu has no idempotent producer: plain fallback
        relay = JournalRelay(journal, bus, unique_topics, batch_size=25)
        await relay.start()
        try:
            appended = await append_round(journal, "tansu")
            relay.notify()
            assert await relay.wait_caught_up(30)
        finally:
            await relay.stop()
    seen = check_topic(await read_topic(tansu_bootstrap, unique_topics.journal), appended)
    assert set(seen.values()) == {1}
    await check_count_headers(tansu_bootstrap, unique_topics.journal, appended)


async def test_a_relay_restarted_on_a_fresh_broker_republishes_the_journal(
    journal: Journal, tmp_path: Path, kafka_broker_kind: str
) -> None:
    """Issue 16 item 4: a broker that lost its log (fresh, wiped, Tansu) gets the journal
    again; the watermark alone would have left it empty forever."""
    if kafka_broker_kind != "kafka":
        pytest.skip("needs Apache Kafka to start two brokers")
    topics = Topics("rebuild.")
    old = ApacheKafkaServer(tmp_path / "old")
    await old.start()
    try:
        await ensure_topics(old.address, topics, 2, 1)
        async with Bus(old.address, request_timeout_s=5) as bus:
            relay = JournalRelay(journal, bus, topics, check_broker_log=True)
            await relay.start()
            appended = await append_round(journal, "before", rounds=2)
            relay.notify()
            assert await relay.wait_caught_up(30)
            await relay.stop()
        assert relay.stats.rebuilt_from is None  # nothing was lost on the first broker
    finally:
        await old.stop()
    fresh = ApacheKafkaServer(tmp_path / "fresh")  # a new, empty log dir
    await fresh.start()
    try:
        await ensure_topics(fresh.address, topics, 2, 1)
        async with Bus(fresh.address, request_timeout_s=5) as bus:
            relay = JournalRelay(journal, bus, topics, check_broker_log=True)
            await relay.start()
            assert relay.stats.rebuilt_from == 0 and relay.watermark == 0
            appended += await append_round(journal, "after", rounds=1)
            relay.notify()
            assert await relay.wait_caught_up(30)
            await relay.stop()
        seen = check_topic(await read_topic(fresh.address, topics.journal), appended)
        assert set(seen.values()) == {1}, "every record once on the fresh broker"
    finally:
        await fresh.stop()
