"""Counters after Valkey lost acknowledged writes: nothing counted is lost for good.

The embedded Valkey (like most Redis deployments) runs ``appendfsync everysec``: a kill can
drop up to a second or two of writes it had acknowledged, while Kafka's committed offset of
the counters group is already past them. Before the fix, those messages were never counted
again (one chaos run: 345 counted + 50 summarized against 445 messages in the journal), so a
thread's summary came late by that much, or never. The counters processor now writes its
positions in the same atomic script as the counts and checks them before each batch
(``ThreadState.count_threads``): a Redis that holds less than was acknowledged makes the
consumer read that range again (``Rewind``), and the count mark makes what Redis still held a
no-op.

What a user sees is checked through a real broker and a real Valkey: the thread's message
counter equals the number of messages in the journal (none lost, none counted twice), after a
rollback of Valkey's state while the processor runs, while it is stopped, and after a wipe.
The rollback is what a restart on a truncated AOF leaves: every key of the test as it was at
an earlier moment (``DUMP``/``RESTORE``), the later writes gone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from obstore.store import LocalStore

from memstream.infra import redis_keys
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.metrics import Metrics, make_metrics
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message, Summary, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.consumer import group_id
from memstream.streams.counters import CountersProcessor
from memstream.streams.processor import RetryPolicy
from memstream.streams.runner import Runner
from tests.integration.test_count_mark import T0, messages, tokens_of

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Setup:
    bootstrap: str
    settings: Settings
    redis: aioredis.Redis
    store: SummaryStore
    threads: list[ThreadRef]
    sent: dict[ThreadRef, int]
    metrics: Metrics

    @property
    def topics(self) -> Topics:
        return Topics(prefix=self.settings.topic_prefix)

    def runner(self) -> Runner:
        state = ThreadState(self.redis)
        return Runner(
            self.settings,
            {
                "counters": lambda: CountersProcessor(
                    state, self.store, guard_ttl_s=600, journal=SentJournal(self.sent)
                )
            },
            self.metrics,
            retry=RetryPolicy(attempts=3, first_delay=0.05),
            lag_interval_s=None,
        )

    def keys_pattern(self, ref: ThreadRef) -> str:
        return redis_keys.thread_pattern(ref)

    @property
    def positions_key(self) -> str:
        return redis_keys.consumer_positions(group_id(self.settings, "counters"))


class SentJournal:
    """The journal of what :func:`send` sent (the same messages, by offset)."""

    def __init__(self, sent: dict[ThreadRef, int]) -> None:
        self._sent = sent

    async def read_range(self, ref: ThreadRef, start: int, end_inclusive: int) -> list[Message]:
        return messages(ref, range(start, min(end_inclusive + 1, self._sent.get(ref, 0))))


@pytest.fixture
async def setup(
    kafka_bootstrap: str, redis_client: aioredis.Redis, tmp_path: Path
) -> AsyncIterator[Setup]:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    topics = Topics(prefix=prefix)
    await ensure_topics(kafka_bootstrap, topics, 2, 1)
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap, topic_prefix=prefix, partitions=2, data_dir=tmp_path
    )
    store = SummaryStore(LocalStore(prefix=tmp_path / "objects", mkdir=True), redis_client)
    agent = f"agent-{uuid.uuid4().hex[:8]}"
    threads = [ThreadRef("acc", agent, f"t{i}") for i in range(4)]  # both partitions
    yield Setup(
        kafka_bootstrap,
        settings,
        redis_client,
        store,
        threads,
        dict.fromkeys(threads, 0),
        make_metrics(),
    )


async def send(s: Setup, per_thread: int) -> None:
    """What the relay does: ``per_thread`` more journal messages of each thread."""
    producer = AIOKafkaProducer(bootstrap_servers=s.bootstrap)
    await producer.start()
    try:
        for ref in s.threads:
            for m in messages(ref, range(s.sent[ref], s.sent[ref] + per_thread)):
                await producer.send(
                    s.topics.journal, encode(message_appended(m, 1)), key=ref.key.encode()
                )
            s.sent[ref] += per_thread
        await producer.flush()
    finally:
        await producer.stop()


async def counted(s: Setup) -> dict[ThreadRef, int]:
    state = ThreadState(s.redis)
    return {ref: (await state.counters(ref))[1] for ref in s.threads}


async def wait_counted(s: Setup, timeout: float = 60.0) -> None:
    """Until every thread's message counter equals what was sent; fails naming the threads
    still short (lost) or over (doubled)."""
    want = dict(s.sent)
    try:
        async with asyncio.timeout(timeout):
            while (got := await counted(s)) != want:
                await asyncio.sleep(0.1)
    except TimeoutError:
        got = await counted(s)
        off = {ref.thread_id: (got[ref], want[ref]) for ref in s.threads if got[ref] != want[ref]}
        raise AssertionError(f"(counted, in the journal) per thread: {off}") from None


async def snapshot(s: Setup) -> dict[bytes, bytes]:
    """Every key of the test's threads and the group's positions, as ``DUMP`` bytes."""
    keys: list[bytes] = [s.positions_key.encode()]
    for ref in s.threads:
        keys += [k async for k in s.redis.scan_iter(match=s.keys_pattern(ref))]
    dumps = {k: await s.redis.dump(k) for k in keys}
    return {k: v for k, v in dumps.items() if v is not None}


async def roll_back(s: Setup, to: dict[bytes, bytes]) -> None:
    """Valkey as a restart on a truncated AOF leaves it: the state of ``to``, later writes
    (of these keys) gone."""
    await wipe(s)
    for key, dumped in to.items():
        await s.redis.restore(key, 0, dumped, replace=True)


async def wipe(s: Setup) -> None:
    await s.redis.delete(s.positions_key)
    for ref in s.threads:
        keys = [k async for k in s.redis.scan_iter(match=s.keys_pattern(ref))]
        if keys:
            await s.redis.delete(*keys)


def store_rewinds(s: Setup) -> float:
    value = s.metrics.registry.get_sample_value(
        "memstream_consumer_gaps_total", {"processor": "counters", "kind": "store"}
    )
    return value or 0.0


async def rollback_while_running(s: Setup) -> None:
    """Count 30 per thread, then 20 more; Valkey rolls back to the 30 after the group
    committed the 50; 5 more: every thread must read 55 (the 20 counted again, once)."""
    runner = s.runner()
    await runner.start()
    try:
        await runner.wait_ready(60)
        await send(s, 30)
        await wait_counted(s)
        before = await snapshot(s)
        await send(s, 20)
        await wait_counted(s)
        await asyncio.sleep(1.5)  # the group commits past the 20 (commit interval 1 s)
        await roll_back(s, before)  # Valkey restarted without its last writes
        await send(s, 5)
        await wait_counted(s)
    finally:
        await runner.stop()


async def test_a_rollback_while_the_processor_runs_loses_no_count(setup: Setup) -> None:
    await rollback_while_running(setup)
    assert store_rewinds(setup) >= 1


async def counted_then_restarted(
    s: Setup, more: int, while_stopped: Callable[[dict[bytes, bytes]], Awaitable[None]]
) -> None:
    """Count 30 per thread, snapshot, ``more`` per thread, stop (the group commits them all);
    ``while_stopped(snapshot)``; start again and send 5: every thread must read all it was
    sent."""
    runner = s.runner()
    await runner.start()
    await runner.wait_ready(60)
    await send(s, 30)
    await wait_counted(s)
    before = await snapshot(s)
    await send(s, more)
    await wait_counted(s)
    await runner.stop()

    await while_stopped(before)
    runner = s.runner()
    await runner.start()
    try:
        await runner.wait_ready(60)
        await send(s, 5)
        await wait_counted(s)
    finally:
        await runner.stop()


async def test_a_rollback_while_it_is_stopped_loses_no_count(setup: Setup) -> None:
    await counted_then_restarted(setup, 20, lambda before: roll_back(setup, before))


async def test_a_wiped_valkey_counts_the_journal_again(setup: Setup) -> None:
    """Everything gone (a Valkey without its data dir): the counters are rebuilt from the
    journal topic, not started again from the committed offset."""
    await counted_then_restarted(setup, 0, lambda _: wipe(setup))


async def test_positions_left_from_an_earlier_log_do_not_blind_the_check(setup: Setup) -> None:
    """A fresh broker starts the journal topic again at 0 while Valkey still holds positions
    of the old log (here 10,000 per partition): the group never committed, so its first
    batches set the positions instead of raising them, and a later rollback is still seen."""
    s = setup
    for partition in range(2):
        await s.redis.hset(s.positions_key, f"{s.topics.journal}:{partition}", 10_000)
    await rollback_while_running(s)


async def summarize(s: Setup, ref: ThreadRef, up_to: int) -> None:
    """What the summarizer does for the span 0..``up_to``: store version 1, reset the counters."""
    await s.store.write(
        ref,
        Summary(1, T0, up_to, f"m{up_to}", "summary", 5, up_to + 1),
        expected_previous_version=0,
    )
    await ThreadState(s.redis).apply_summary(
        ref, up_to, sum(tokens_of(o) for o in range(up_to + 1)), up_to + 1
    )


async def wait_counters(s: Setup, want: dict[ThreadRef, tuple[int, int]]) -> None:
    """Until every thread's ``(tokens, messages)`` equal ``want``; fails naming the others."""
    state = ThreadState(s.redis)

    async def got() -> dict[ThreadRef, tuple[int, int]]:
        return {ref: await state.counters(ref) for ref in s.threads}

    try:
        async with asyncio.timeout(60):
            while await got() != want:
                await asyncio.sleep(0.1)
    except TimeoutError:
        now = await got()
        off = {r.thread_id: (now[r], want[r]) for r in s.threads if now[r] != want[r]}
        raise AssertionError(f"(counters, expected) per thread: {off}") from None


async def test_a_summary_applied_in_the_lost_window_is_not_counted_again(setup: Setup) -> None:
    """30 messages per thread counted (Valkey's durable state), 15 more, then a summary of
    0..39 applied: Valkey loses all of it after the group committed the 45. The 10 messages
    after the summary are what the thread has to its counters once 5 more come, and no early
    summary is asked: before the fix the re-read 30..44 were counted again on top of the
    restored 30, 50 messages since a summary of 40, and the guard taken for a request."""
    s = setup
    runner = s.runner()
    await runner.start()
    try:
        await runner.wait_ready(60)
        await send(s, 30)
        await wait_counted(s)
        before = await snapshot(s)
        await send(s, 15)
        await wait_counted(s)
        for ref in s.threads:
            await summarize(s, ref, 39)
        after_summary = (sum(tokens_of(o) for o in range(40, 45)), 5)
        await wait_counters(s, dict.fromkeys(s.threads, after_summary))
        await asyncio.sleep(1.5)  # the group commits past the 45 (commit interval 1 s)
        await roll_back(s, before)  # the 15 and the summary's reset gone
        await send(s, 5)
        since_summary = (sum(tokens_of(o) for o in range(40, 50)), 10)
        await wait_counters(s, dict.fromkeys(s.threads, since_summary))
        assert store_rewinds(s) >= 1
        state = ThreadState(s.redis)
        assert [await state.watermark(ref) for ref in s.threads] == [39] * 4
        assert [await s.redis.get(redis_keys.guard(ref)) for ref in s.threads] == [None] * 4
    finally:
        await runner.stop()
