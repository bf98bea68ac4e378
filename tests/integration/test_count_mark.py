"""The counters' count mark against real Valkey: each message counted once, whatever comes
again or out of order, with no key per message.

A thread's counters hash keeps the highest offset counted and the ranges below it not seen
yet (``ThreadState.count_threads``). These tests drive the counters processor, the adapter
and the counters rebuild directly (no broker), with the deliveries a user's system can see:
redeliveries after a crash, a re-published journal, a thread whose records move to a new
partition (its old partition's tail read after its new one), an upgrade from the
per-message claims, and a rebuild's hand-over to the live processor.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.clock import FixedClock
from memstream.infra import redis_keys
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.projections.replay_sinks import CountersSink
from memstream.schemas.events import message_appended
from memstream.schemas.records import Message, Summary, ThreadRef
from memstream.streams.counters import CountersProcessor

T0 = FixedClock().now()


def new_ref() -> ThreadRef:
    return ThreadRef("acc", f"agent-{uuid.uuid4().hex[:8]}", f"thr-{uuid.uuid4().hex[:8]}")


def tokens_of(offset: int) -> int:
    return 3 + offset % 7  # distinct enough that a wrong set of counted messages shows


def messages(ref: ThreadRef, offsets: range | list[int]) -> list[Message]:
    return [
        Message(
            account_id=ref.account_id,
            agent_id=ref.agent_id,
            thread_id=ref.thread_id,
            offset=o,
            message_id=f"m{o}",
            role="user",
            content=f"message {o}",
            created_at=T0,
            token_count=tokens_of(o),
        )
        for o in offsets
    ]


def totals(offsets: range | list[int]) -> tuple[int, int]:
    distinct = set(offsets)
    return sum(tokens_of(o) for o in distinct), len(distinct)


@pytest.fixture
def state(redis_client: aioredis.Redis) -> ThreadState:
    return ThreadState(redis_client)


@pytest.fixture
def store(tmp_path: Path, redis_client: aioredis.Redis) -> SummaryStore:
    return SummaryStore(LocalStore(prefix=tmp_path / "objects", mkdir=True), redis_client)


@pytest.fixture
def counters(state: ThreadState, store: SummaryStore) -> CountersProcessor:
    return CountersProcessor(state, store, guard_ttl_s=600, clock=FixedClock())


async def test_each_message_is_counted_once_whatever_the_order_and_repeats(
    state: ThreadState,
) -> None:
    rng = random.Random(15)
    for trial in range(60):
        ref = new_ref()
        n = rng.randint(1, 40)
        summarized = rng.choice([-1, -1, rng.randint(0, n - 1)])
        await state.init_watermark(ref, summarized)
        # every offset at least once, some several times, in any order, in random batches
        deliveries = list(range(n)) + rng.choices(range(n), k=rng.randint(0, n))
        if trial % 3:
            rng.shuffle(deliveries)
        else:  # mostly in order: runs delivered again after a "crash"
            deliveries.sort()
            head = deliveries[: rng.randint(0, len(deliveries))]
            restart = rng.randint(0, head[-1] + 1 if head else 0)
            deliveries = head + list(range(restart, n))
        counted: list[int] = []
        at = 0
        while at < len(deliveries):
            size = rng.randint(1, 12)
            batch = deliveries[at : at + size]
            at += size
            (result,) = await state.count_threads({ref: [(o, tokens_of(o)) for o in batch]})
            counted += [o for o, s in zip(batch, result.statuses, strict=True) if s == "c"]
        expected = [o for o in range(n) if o > summarized]
        assert sorted(counted) == expected, (trial, deliveries)
        assert await state.counters(ref) == totals(expected)
        assert await state.count_mark(ref) == ((n - 1) if expected else None, "")


async def test_a_thread_moved_to_a_new_partition_counts_its_old_tail_once(
    counters: CountersProcessor, state: ThreadState
) -> None:
    # Partitions 4 -> 8: the thread's later records land in its new partition and are read
    # before the tail of its old one.
    ref = new_ref()
    await counters.count_many(messages(ref, range(20)))
    await counters.count_many(messages(ref, range(30, 45)))  # new partition first
    assert await state.counters(ref) == totals([*range(20), *range(30, 45)])
    assert await state.count_mark(ref) == (44, "20-29")
    await counters.count_many(messages(ref, range(18, 30)))  # old partition's tail (+ repeats)
    assert await state.counters(ref) == totals(range(45))
    assert await state.count_mark(ref) == (44, "")
    # a re-published journal, long after: nothing counts again
    await counters.count_many(messages(ref, range(45)))
    assert await state.counters(ref) == totals(range(45))


async def test_counting_keeps_no_key_per_message(
    counters: CountersProcessor, redis_client: aioredis.Redis
) -> None:
    ref = new_ref()
    await counters.count_many(messages(ref, range(49)))
    keys = {k.decode() async for k in redis_client.scan_iter(match=redis_keys.thread_pattern(ref))}
    assert keys == {redis_keys.counters(ref), redis_keys.watermark(ref)}
    assert await redis_client.ttl(redis_keys.counters(ref)) == -1  # no expiry to outlive


async def test_an_upgrade_from_per_message_claims_counts_no_redelivery_twice(
    counters: CountersProcessor, state: ThreadState, redis_client: aioredis.Redis
) -> None:
    # What the per-message-claim version left: 0..19 counted and claimed, no count mark; the
    # group committed up to 10, so 10..19 come again after the upgrade.
    ref = new_ref()
    await state.init_watermark(ref, -1)
    tokens, count = totals(range(20))
    await redis_client.hset(redis_keys.counters(ref), mapping={"tokens": tokens, "messages": count})
    for o in range(20):
        await redis_client.set(redis_keys.message_claim(ref, o), 1, ex=3600)
    await counters.count_many(messages(ref, range(10, 15)))  # all claimed: still the old way
    assert await state.counters(ref) == totals(range(20))
    assert await state.count_mark(ref) == (None, "")
    await counters.count_many(messages(ref, range(15, 30)))  # 20 is the first new one
    assert await state.counters(ref) == totals(range(30))
    assert await state.count_mark(ref) == (29, "")
    # the claims expire: a redelivery after that (a fresh broker, a group reset) counted
    # everything again before; with the mark it is a no-op
    for o in range(20):
        await redis_client.delete(redis_keys.message_claim(ref, o))
    await counters.count_many(messages(ref, range(30)))
    assert await state.counters(ref) == totals(range(30))


async def test_a_rebuild_hands_its_count_mark_to_the_live_processor(
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis_client: aioredis.Redis,
) -> None:
    ref = new_ref()
    msgs = messages(ref, range(12))
    await counters.count_many(msgs[:3])
    # the live counters drifted (Redis lost writes): wrong counts, a mark behind
    await redis_client.hset(redis_keys.counters(ref), mapping={"tokens": 1, "messages": 1})
    sink = CountersSink(redis_client, store)
    await sink.prepare(2, fresh=True)
    events = [message_appended(m, ts=1) for m in msgs[:10]]
    assert await sink.apply(2, events[:6]) == (6, 0)
    assert await sink.apply(2, events) == (4, 6)  # a resumed replay re-reads its last batch
    assert await state.counters(ref) == (1, 1)  # the live hash is untouched until the switch
    await sink.switch(2)
    assert await state.counters(ref) == totals(range(10))
    assert await state.count_mark(ref) == (9, "")
    # the live processor goes on from its committed offset (3): 3..9 again, then new ones
    await counters.count_many(msgs[3:])
    assert await state.counters(ref) == totals(range(12))


async def test_a_loaded_watermark_is_set_and_counted_in_one_step(
    redis_client: aioredis.Redis,
) -> None:
    """``count_threads(watermarks=...)``: a thread Redis has no watermark for gets the loaded
    one (with its expiry) and is counted above it in the same step; a thread whose watermark
    Redis learned meanwhile keeps Redis's; without a loaded one it is still unknown."""
    state = ThreadState(redis_client)
    fresh, learned, unknown = new_ref(), new_ref(), new_ref()
    await state.init_watermarks({learned: 7})
    steps = {ref: [(o, 10) for o in range(10)] for ref in (fresh, learned, unknown)}
    fresh_c, learned_c, unknown_c = await state.count_threads(
        steps, watermarks={fresh: 4, learned: 2}
    )
    assert (fresh_c.known, fresh_c.watermark, fresh_c.statuses) == (True, 4, "sssssccccc")
    assert (fresh_c.messages_after, fresh_c.tokens_after) == (5, 50)
    assert (learned_c.watermark, learned_c.statuses) == (7, "sssssssscc")
    assert not unknown_c.known
    assert await state.watermarks([fresh, learned, unknown]) == [4, 7, None]
    assert 0 < await redis_client.ttl(redis_keys.watermark(fresh)) <= 7 * 24 * 3600
    # a redelivery counts nothing again
    again = await state.count_threads(steps, watermarks={unknown: -1})
    assert [c.statuses for c in again] == ["sssssddddd", "ssssssssdd", "cccccccccc"]


class CountingState(ThreadState):
    """The real adapter, counting its ``count_threads`` calls (Valkey round trips)."""

    calls = 0

    async def count_threads(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return await super().count_threads(*args, **kwargs)


async def test_a_new_thread_is_counted_in_one_step_above_its_stored_summary(
    redis_client: aioredis.Redis, store: SummaryStore
) -> None:
    """A thread this process has not counted gets its watermark from the summary store
    before its first count: one count for the batch (not "unknown", then again), and a
    message a stored summary covers is still never counted. This holds for a new
    conversation and for a summarized thread met after a restart with no watermark in
    Valkey (its watermark key gone: an expiry, a wipe)."""
    state = CountingState(redis_client)
    counters = CountersProcessor(state, store, guard_ttl_s=600, clock=FixedClock())
    new, summarized = new_ref(), new_ref()
    await store.write(
        summarized, Summary(1, T0, 9, "m9", "summary", 5, 10), expected_previous_version=0
    )
    await counters.count_many(messages(new, range(15)) + messages(summarized, range(15)))
    assert state.calls == 1
    assert await state.counters(new) == totals(range(15))
    assert await state.counters(summarized) == totals(range(10, 15))
    assert await state.watermarks([new, summarized]) == [-1, 9]
    # later batches of the same threads: counted in one step, no second listing needed
    await counters.count_many(messages(new, range(15, 20)) + messages(summarized, range(15, 20)))
    assert state.calls == 2
    assert await state.counters(summarized) == totals(range(10, 20))


async def test_a_remembered_thread_whose_watermark_valkey_lost_is_loaded_again(
    redis_client: aioredis.Redis, store: SummaryStore
) -> None:
    """A thread this process counted before, whose watermark Valkey then lost (a wipe, a
    failover), is not trusted to the process's memory: the count says "unknown", the
    watermark comes from the summary store, and the messages the summary covers stay
    uncounted."""
    state = CountingState(redis_client)
    counters = CountersProcessor(state, store, guard_ttl_s=600, clock=FixedClock())
    ref = new_ref()
    await counters.count_many(messages(ref, range(5)))
    await store.write(ref, Summary(1, T0, 9, "m9", "summary", 5, 10), expected_previous_version=0)
    wiped = [k async for k in redis_client.scan_iter(match=redis_keys.thread_pattern(ref))]
    assert wiped
    await redis_client.delete(*wiped)
    calls = state.calls
    await counters.count_many(messages(ref, range(5, 15)))
    assert state.calls == calls + 2  # "unknown", then counted with the loaded watermark
    assert await state.counters(ref) == totals(range(10, 15))
    assert await state.watermarks([ref]) == [9]


async def test_the_remembered_threads_stay_bounded(
    redis_client: aioredis.Redis, store: SummaryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("memstream.streams.counters.KNOWN_MAX", 10)
    state = ThreadState(redis_client)
    counters = CountersProcessor(state, store, guard_ttl_s=600, clock=FixedClock())
    refs = [new_ref() for _ in range(25)]
    for ref in refs:
        await counters.count_many(messages(ref, range(3)))
    assert len(counters._known) <= 10
    assert refs[-1] in counters._known
    for ref in refs:  # forgotten or not, every thread counted once
        await counters.count_many(messages(ref, range(3)))
        assert await state.counters(ref) == totals(range(3))
