"""Issue 12: a store outage is not a poison record. With Valkey, then Postgres, stopped for
more than 10 s under load, the processors pause (their loop state reads ``waiting for
valkey`` / ``waiting for postgres``), dead-letter nothing, and once the store is back apply
every record exactly once (before, a batch still failing after ~3 s of retries was
dead-lettered whole, and a driver error that was not translated was dead-lettered at once).

Real engines: a Valkey and a Postgres of the test's own (killed with SIGKILL and started
again on their data dir and port), the session broker, a SlateDB journal and its relay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.infra.data_keys import Keyring
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.journal import Journal
from memstream.infra.kafka import Bus, ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore
from memstream.infra.supervisor import LoopStates
from memstream.infra.thread_state import ThreadState
from memstream.schemas.events import Envelope
from memstream.schemas.records import ThreadRef
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.counters import CountersProcessor
from memstream.streams.dlq import list_dead_letters
from memstream.streams.journal_relay import JournalRelay
from memstream.streams.processor import EventMeta, Processor
from memstream.streams.runner import Runner
from tests.kafka_helpers import append_load

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.chaos]

THREADS = [ThreadRef("acct", "agent", f"o{i}") for i in range(6)]
OUTAGE_S = 11.0


class Marker(Processor):
    """One record at a time into a Valkey set (idempotent: a set), letting the driver's own
    connection errors through untranslated."""

    name = "marker"
    topic = JOURNAL

    def __init__(self, redis: aioredis.Redis, key: str) -> None:
        self.redis = redis
        self.key = key

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        if envelope.type == "message.appended":
            await self.redis.sadd(self.key, envelope.id)


async def load(journal: Journal, relay: JournalRelay, stop: asyncio.Event) -> int:
    return await append_load(journal, relay, THREADS, stop, pause_s=0.05)


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.1)


async def test_processors_pause_through_a_valkey_and_a_postgres_outage_and_lose_nothing(
    journal: Journal, tmp_path: Path, traversable_tmp: Path, kafka_bootstrap: str
) -> None:
    pg = EmbeddedPostgres(traversable_tmp / f"pg-proc-outage-{id(tmp_path)}")
    await pg.start()
    valkey = EmbeddedRedis(tmp_path / "valkey")
    await valkey.start()
    pool = await create_pool(pg.dsn, max_size=4)
    await migrate(pool)
    redis = aioredis.from_url(valkey.url, socket_timeout=2, socket_connect_timeout=2)
    topics = Topics(f"o{int(time.time() * 1000) % 10**8}.")
    await ensure_topics(kafka_bootstrap, topics, 2, 1)
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        partitions=2,
        data_dir=tmp_path / "data",
    )
    bus = Bus(kafka_bootstrap, request_timeout_s=5)
    # The relay keeps its thread keys cached through the outage; the processors' keyring
    # asks Postgres for every batch, as a cold cache does.
    relay = JournalRelay(journal, bus, topics, max_backoff=0.5, keyring=Keyring(pool, cache_s=3600))
    state = ThreadState(redis)
    summaries = SummaryStore(LocalStore(prefix=tmp_path / "objects", mkdir=True), redis)
    loops = LoopStates()
    metrics = make_metrics()
    metrics.track_states(loops=loops.snapshot)  # what /metrics exports (memstream_loop_*)
    runner = Runner(
        settings,
        {
            "counters": lambda: CountersProcessor(state, summaries, guard_ttl_s=3600),
            "marker": lambda: Marker(redis, "applied"),
        },
        metrics,
        lag_interval_s=None,
        keyring=Keyring(pool, cache_s=0.2),
        loops=loops,
    )
    stop = asyncio.Event()
    loader: asyncio.Task[int] | None = None

    def waiting_for(dep: str) -> bool:
        snap = loops.snapshot()
        return all(
            s["state"] == "waiting" and s["waiting_for"] == dep for s in snap.values()
        ) and all(
            metrics.sample("memstream_loop_waiting", {"loop": name, "dependency": dep}) == 1
            for name in snap
        )

    try:
        await relay.start()
        await runner.start()
        await runner.wait_ready(60)
        loader = asyncio.create_task(load(journal, relay, stop))
        await asyncio.sleep(2)

        port = valkey.port
        await valkey.kill()  # Valkey dies mid-load; appends and the relay go on
        await until(lambda: waiting_for("valkey"), OUTAGE_S, "both processors wait for valkey")
        await asyncio.sleep(max(0.0, OUTAGE_S - 4))
        valkey = EmbeddedRedis(tmp_path / "valkey", port=port)
        await valkey.start()
        await until(loops.all_running, 60, "every processor running again")

        port = pg.port
        await pg.kill()  # now Postgres: the processors cannot open sealed records
        await until(lambda: waiting_for("postgres"), OUTAGE_S, "both processors wait for pg")
        await asyncio.sleep(max(0.0, OUTAGE_S - 4))
        pg = EmbeddedPostgres(traversable_tmp / f"pg-proc-outage-{id(tmp_path)}", port=port)
        await pg.start()
        await until(loops.all_running, 60, "every processor running again")

        await asyncio.sleep(1)
        stop.set()
        appended = await loader
        assert appended > 100
        assert await relay.wait_caught_up(60)

        counted: dict[str, int] = {}

        async def all_applied() -> bool:
            for ref in THREADS:
                _, counted[ref.thread_id] = await state.counters(ref)
            marked = await redis.scard("applied")
            return sum(counted.values()) >= appended and marked >= appended

        deadline = time.monotonic() + 60
        while not await all_applied() and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        per_thread = appended // len(THREADS)
        # counters: each message counted exactly once (the claims dedupe redeliveries)
        assert counted == {ref.thread_id: per_thread for ref in THREADS}, (appended, counted)
        assert await redis.scard("applied") == appended
        letters = await list_dead_letters(kafka_bootstrap, topics, None, timeout=30)
        assert letters == [], [(d.processor, d.error) for d in letters[:5]]
        assert loops.problem() is None
    finally:
        stop.set()
        if loader is not None and not loader.done():
            loader.cancel()
        await runner.stop()
        await relay.stop()
        await bus.stop()
        await redis.aclose()
        pool.terminate()
        await valkey.stop()
        await pg.stop()
