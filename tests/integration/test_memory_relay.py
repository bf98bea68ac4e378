"""The memory outbox relay against real Postgres and a real Kafka broker."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer

from memstream.agents_ctx.memory.store import MemoryService
from memstream.clock import FixedClock
from memstream.errors import InfraError, StoreUnavailable
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.kafka.bus import Bus
from memstream.schemas.events import Envelope, decode
from memstream.schemas.records import Caller
from memstream.schemas.topics import Topics
from memstream.streams.outbox_relay import _RELAY_LOCK, OutboxRelay
from tests.fixtures.binding import EVERY_AGENT_BOUND

_agents = itertools.count(1)


async def read_topic(
    bootstrap: str, topic: str, want: int, timeout: float = 20.0
) -> list[tuple[str, Envelope]]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    out: list[tuple[str, Envelope]] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(out) < want and loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out.extend((r.key.decode(), decode(r.value)) for r in records)
    finally:
        await consumer.stop()
    return out


def entry(env: Envelope) -> Any:
    """The ``entry`` object a ``memory.*`` event carries: JSON, navigated by the test."""
    return env.data["entry"]


@pytest.fixture
async def topics(kafka_bootstrap: str, unique_topics: Topics) -> Topics:
    await ensure_topics(kafka_bootstrap, unique_topics, 2, 1)
    return unique_topics


@pytest.fixture
async def bus(kafka_bootstrap: str) -> AsyncIterator[Bus]:
    b = Bus(kafka_bootstrap)
    await b.start()
    yield b
    await b.stop()


async def pending(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM memory_outbox WHERE published_at IS NULL"))


async def _published_by_running(relay: OutboxRelay, pool: asyncpg.Pool, content: str) -> None:
    """Run ``relay``, store one entry once it holds the lock and listens, and wait until it
    published it (its poll is far longer than the wait: only a NOTIFY wakes it in time)."""
    task = asyncio.create_task(relay.run())
    try:
        await asyncio.sleep(0.3)  # let it take the lock and LISTEN
        svc = MemoryService(pool, FixedClock(), binding=EVERY_AGENT_BOUND)
        c = Caller("acc", f"relay{next(_agents)}", None)
        await svc.store(c, "woken", content, "observation", "shared")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while await pending(pool) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert await pending(pool) == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_drain_publishes_in_order_keyed_by_agent_and_marks_rows(
    pg_pool: asyncpg.Pool, bus: Bus, topics: Topics, kafka_bootstrap: str
) -> None:
    await OutboxRelay(pg_pool, bus, topics.memory).drain()  # leftovers of other tests
    svc = MemoryService(pg_pool, FixedClock(), binding=EVERY_AGENT_BOUND)
    c = Caller("acc", f"relay{next(_agents)}", "u1")
    await svc.store(c, "k", "first version", "project_fact", "shared")
    await svc.store(c, "k", "second version", "project_fact", "shared")
    await svc.forget(c, "k")
    relay = OutboxRelay(pg_pool, bus, topics.memory)
    assert await relay.drain() == 3
    assert await pending(pg_pool) == 0
    got = await read_topic(kafka_bootstrap, topics.memory, 3)
    assert [k for k, _ in got] == [f"acc/{c.agent_id}"] * 3
    assert [e.type for _, e in got] == ["memory.stored", "memory.replaced", "memory.forgotten"]
    versions = [entry(e)["version"] for _, e in got]
    assert versions == sorted(versions)
    assert await relay.drain() == 0  # marked: not published twice


async def test_rows_wait_while_kafka_is_unavailable(
    pg_pool: asyncpg.Pool, topics: Topics, kafka_bootstrap: str
) -> None:
    svc = MemoryService(pg_pool, FixedClock(), binding=EVERY_AGENT_BOUND)
    c = Caller("acc", f"relay{next(_agents)}", None)
    down = Bus(kafka_bootstrap)  # never started: every publish fails like a lost broker
    await svc.store(c, "k1", "waits for kafka", "project_fact", "shared")
    before = await pending(pg_pool)
    with pytest.raises(InfraError):
        await OutboxRelay(pg_pool, down, topics.memory).drain()
    assert await pending(pg_pool) == before  # nothing marked
    up = Bus(kafka_bootstrap)
    await up.start()
    try:
        await OutboxRelay(pg_pool, up, topics.memory).drain()
    finally:
        await up.stop()
    assert await pending(pg_pool) == 0
    got = await read_topic(kafka_bootstrap, topics.memory, 100, timeout=5)
    assert any(entry(e)["key"] == "k1" for _, e in got)


async def test_run_wakes_on_notify(
    pg_pool: asyncpg.Pool, bus: Bus, topics: Topics, kafka_bootstrap: str
) -> None:
    relay = OutboxRelay(pg_pool, bus, topics.memory, poll_interval_s=60.0)
    await relay.drain()
    await _published_by_running(relay, pg_pool, "published without waiting for the poll")


async def test_a_relay_whose_lock_session_died_stops_and_takes_the_lock_again(
    pg_pool: asyncpg.Pool, bus: Bus, topics: Topics
) -> None:
    """A Postgres restart ends the relay's session: its advisory lock (one active relay)
    and its LISTEN go with it. Publishing on without the lock would make two active relays
    once a standby takes it, and the dead LISTEN would leave every store waiting for the
    poll. The relay stops instead (its supervisor runs it again)."""
    relay = OutboxRelay(pg_pool, bus, topics.memory, poll_interval_s=0.2)
    await relay.drain()
    task = asyncio.create_task(relay.run())
    try:
        holder = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while holder is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
            holder = await pg_pool.fetchval(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND granted",
                _RELAY_LOCK,
            )
        assert holder is not None, "the relay never took its lock"
        await pg_pool.execute("SELECT pg_terminate_backend($1)", holder)  # as a restart does
        with pytest.raises(StoreUnavailable, match="lock connection"):
            await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
            await task
    # run again (what the supervisor does): it takes the lock, LISTENs and is woken
    again = OutboxRelay(pg_pool, bus, topics.memory, poll_interval_s=60.0)
    await _published_by_running(again, pg_pool, "published after the restart")


async def test_rows_kept_by_the_outbox_go_out_again_when_the_broker_lost_its_log(
    pg_pool: asyncpg.Pool, bus: Bus, topics: Topics, kafka_bootstrap: str
) -> None:
    """Issue 16 item 4: a fresh broker has an empty memory topic; the published rows the
    outbox still keeps are re-published (before, memories published to the lost broker and
    not yet indexed never reached recall: seen in tests/integration/test_fresh_broker.py)."""
    svc = MemoryService(pg_pool, FixedClock(), binding=EVERY_AGENT_BOUND)
    c = Caller("acc", f"relay{next(_agents)}", None)
    await svc.store(c, "k1", "published once", "project_fact", "shared")
    await svc.store(c, "k2", "published too", "project_fact", "shared")
    await OutboxRelay(pg_pool, bus, topics.memory).drain()

    async def kept_records() -> int:
        return 3  # the broker still has its log

    async def empty() -> int:
        return 0  # a fresh broker

    assert (
        await OutboxRelay(
            pg_pool, bus, topics.memory, broker_records=kept_records
        ).republish_if_lost()
        == 0
    )
    relay = OutboxRelay(pg_pool, bus, topics.memory, broker_records=empty)
    assert await relay.republish_if_lost() >= 2
    assert await relay.drain() >= 2
    got = await read_topic(kafka_bootstrap, topics.memory, 1000, timeout=5)
    mine = [entry(e)["key"] for _, e in got if e.agent_id == c.agent_id]
    assert sorted(mine) == ["k1", "k1", "k2", "k2"]  # once from each broker's point of view
