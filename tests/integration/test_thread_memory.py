"""Thread memory against real Redis (Valkey), a real SlateDB journal, a real obstore folder
and real Postgres: thresholds, progressive summaries, races, crashes, the flush, Redis wipes.

The processors' handlers are driven directly here (no broker) so each rule is tested alone;
``test_thread_memory_kafka.py`` runs the same processors end to end through Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import pytest
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx.memory.store import MemoryService
from memstream.clock import FixedClock
from memstream.errors import Conflict, RetryableInfraError
from memstream.infra import redis_keys
from memstream.infra.accounts import Accounts
from memstream.infra.journal import Journal
from memstream.infra.llm import ExtractedFact, ExtractiveSummaryModel, RuleFactExtractor
from memstream.infra.summary_store import SummaryStore, summary_path
from memstream.infra.thread_state import ThreadState
from memstream.schemas.records import Message, NewMessage, Summary, ThreadRef
from memstream.streams.counters import CountersProcessor
from memstream.streams.summarizer import SummarizerProcessor
from memstream.streams.summary_catchup import catch_up


def new_ref(account: str = "acc") -> ThreadRef:
    return ThreadRef(account, f"agent-{uuid.uuid4().hex[:8]}", f"thr-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def objects(tmp_path: Path) -> LocalStore:
    return LocalStore(prefix=tmp_path / "objects", mkdir=True)


@pytest.fixture
def store(objects: LocalStore, redis_client: aioredis.Redis) -> SummaryStore:
    return SummaryStore(objects, redis_client)


@pytest.fixture
def state(redis_client: aioredis.Redis) -> ThreadState:
    return ThreadState(redis_client)


@pytest.fixture
def counters(state: ThreadState, store: SummaryStore) -> CountersProcessor:
    return CountersProcessor(state, store, guard_ttl_s=600, clock=FixedClock())


def summarizer(
    journal: Journal, state: ThreadState, store: SummaryStore, **kw: object
) -> SummarizerProcessor:
    kw.setdefault("token_budget", 200)
    kw.setdefault("clock", FixedClock())
    return SummarizerProcessor(journal, state, store, ExtractiveSummaryModel(), **kw)  # type: ignore[arg-type]  # as each test gives them


async def append(journal: Journal, ref: ThreadRef, texts: Sequence[str]) -> list[Message]:
    return await journal.append(ref, [NewMessage(role="user", content=t) for t in texts])


def chatter(n: int, start: int = 0) -> list[str]:
    return [
        f"Message {i}: the build on branch b{i} passed its checks." for i in range(start, start + n)
    ]


async def count_all(c: CountersProcessor, msgs: Sequence[Message]) -> list[int]:
    """Indexes of the messages whose counting asked for a summary."""
    out = []
    for i, m in enumerate(msgs):
        if await c.count(m) is not None:
            out.append(i)
    return out


# --- thresholds ----------------------------------------------------------------------------
async def test_49_messages_no_summary_the_50th_one(
    journal: Journal, counters: CountersProcessor
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    assert sum(m.token_count for m in msgs) < 2_000
    asks = await count_all(counters, msgs[:49])
    assert asks == []
    request = await counters.count(msgs[49])
    assert request is not None
    assert request.type == "summary.requested"
    assert request.data["up_to_offset"] == 49
    assert request.data["from_offset"] == 0
    assert request.data["message_count"] == 50
    # The guard: later messages of the same unsummarized span ask for nothing more.
    more = await append(journal, ref, chatter(5, 50))
    assert await count_all(counters, more) == []


async def test_token_threshold_crosses_first(journal: Journal, counters: CountersProcessor) -> None:
    ref = new_ref()
    big = " ".join(["alpha"] * 700)  # 700 tokens
    msgs = await append(journal, ref, [big, big, "short one", big])
    assert [m.token_count for m in msgs[:2]] == [700, 700]
    # 700, 1400, ~1403: no summary; 2,103 tokens after the 4th message (4 < 50): one.
    assert await count_all(counters, msgs) == [3]


async def test_redelivered_messages_are_counted_once(
    journal: Journal, counters: CountersProcessor, state: ThreadState
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(10))
    await count_all(counters, msgs)
    await count_all(counters, msgs)  # a replay
    tokens, messages = await state.counters(ref)
    assert messages == 10
    assert tokens == sum(m.token_count for m in msgs)


async def test_redelivered_crossing_message_republishes_the_same_request(
    journal: Journal, counters: CountersProcessor
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs[:49])
    first = await counters.count(msgs[49])
    again = await counters.count(msgs[49])  # crash before the commit: same record again
    assert first is not None and again is not None
    assert first.id == again.id  # deterministic id per span end: consumers dedupe


async def test_one_batch_gives_the_same_requests_as_one_at_a_time(
    journal: Journal, counters: CountersProcessor, state: ThreadState
) -> None:
    a, b = new_ref(), new_ref()
    msgs_a = await append(journal, a, chatter(60))
    msgs_b = await append(journal, b, chatter(30))
    # Interleaved threads, and a redelivered run of a's first ten messages in the same batch.
    pairs = zip(msgs_a[:30], msgs_b, strict=True)
    batch = [m for pair in pairs for m in pair] + msgs_a[30:] + msgs_a[:10]
    requests = await counters.count_many(batch)
    assert [(r.thread_id, r.data["up_to_offset"]) for r in requests] == [(a.thread_id, 49)]
    assert requests[0].data["message_count"] == 50
    assert await state.counters(a) == (sum(m.token_count for m in msgs_a), 60)
    assert await state.counters(b) == (sum(m.token_count for m in msgs_b), 30)
    # Redelivering the whole batch re-publishes the same request and counts nothing.
    again = await counters.count_many(batch)
    assert [r.id for r in again] == [requests[0].id]
    assert (await state.counters(a))[1] == 60


# --- summaries -----------------------------------------------------------------------------
async def test_summary_progressive_chaining_and_counter_reset(
    journal: Journal, counters: CountersProcessor, state: ThreadState, store: SummaryStore
) -> None:
    ref = new_ref()
    s = summarizer(journal, state, store)
    first = await append(journal, ref, ["Hi, my name is Ada Lovelace and I live in London."])
    first += await append(journal, ref, chatter(49))
    assert await count_all(counters, first) == [49]
    v1 = await s.summarize(ref, 49)
    assert v1 is not None and v1.version == 1
    assert v1.last_message_offset == 49 and v1.last_message_id == first[-1].message_id
    assert v1.message_count == 50
    assert "Ada Lovelace" in v1.content
    assert await state.counters(ref) == (0, 0)  # the span was subtracted
    # The next 50 messages cross again; v2 is built from v1's content.
    second = await append(journal, ref, chatter(50, 100))
    assert await count_all(counters, second) == [49]
    v2 = await s.summarize(ref, 99)
    assert v2 is not None and v2.version == 2
    assert v2.message_count == 100
    assert "Ada Lovelace" in v2.content  # carried over from v1
    assert any(f"b{i}" in v2.content for i in range(100, 150))
    got = await store.get(ref)
    assert got == v2


async def lose_last_summary(
    redis: aioredis.Redis, ref: ThreadRef, msgs: Sequence[Message], watermark: int
) -> None:
    """What Valkey holds after losing the writes of the summary after ``watermark`` (a kill
    under ``appendfsync everysec``): the watermark back there, and every message after it
    counted again (the rewind re-reads them)."""
    kept = [m for m in msgs if m.offset > watermark]
    await redis.set(redis_keys.watermark(ref), watermark)
    await redis.hset(
        redis_keys.counters(ref),
        mapping={"tokens": sum(m.token_count for m in kept), "messages": len(kept)},
    )


async def summary_lost(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis: aioredis.Redis,
) -> tuple[ThreadRef, list[Message], SummarizerProcessor]:
    """A thread of 60 counted messages, summarized to 9 then to 39, whose Valkey then lost
    the second summary (watermark back at 9, 10..59 counted): the thread, its messages and
    its summarizer."""
    ref = new_ref()
    msgs = await append(journal, ref, chatter(60))
    await count_all(counters, msgs)
    s = summarizer(journal, state, store)
    assert await s.summarize(ref, 9) is not None and await s.summarize(ref, 39) is not None
    await lose_last_summary(redis, ref, msgs, 9)
    return ref, msgs, s


@pytest.mark.parametrize("first_comes", ["the next summary", "the catch-up"])
async def test_a_summary_valkey_lost_is_subtracted_once_whoever_comes_first(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis_client: aioredis.Redis,
    first_comes: str,
) -> None:
    """Valkey lost the summary of 10..39 (the store has it, Valkey's watermark is back at 9);
    the next summary (40..49) and the counters' catch-up of the lost one then race. Either
    order leaves the counters with 50..59 only. Before, a next summary applied first
    subtracted only 40..49 and the catch-up then saw nothing to do: 40 messages counted, 30
    of them summarized already (an early request)."""
    ref, msgs, s = await summary_lost(journal, counters, state, store, redis_client)
    assert await state.counters(ref) == (sum(m.token_count for m in msgs[10:]), 50)
    if first_comes == "the next summary":
        assert await s.summarize(ref, 49) is not None
        assert await catch_up(state, store, journal, [ref]) == []  # nothing left to do
    else:
        assert await catch_up(state, store, journal, [ref]) == [ref]
        assert await s.summarize(ref, 49) is not None
    assert await state.counters(ref) == (sum(m.token_count for m in msgs[50:]), 10)
    assert await state.watermark(ref) == 49
    # and the thread goes on: 40 more messages cross at 50 since the summary, not before
    more = await append(journal, ref, chatter(40, 60))
    assert await count_all(counters, more) == [39]


async def test_the_catch_up_brings_back_the_summary_readers_see(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis_client: aioredis.Redis,
) -> None:
    """Valkey lost the second summary's cache entry with its watermark (the first one is
    cached again): readers got the summary up to 9 while the catch-up made the counters
    count from 39 on, so 10..39 were in neither. The catch-up re-caches the stored one."""
    ref, _msgs, _s = await summary_lost(journal, counters, state, store, redis_client)
    first = await store.get_version(ref, 1)
    assert first is not None
    await redis_client.delete(redis_keys.summary_cache(ref))
    await store.cache(ref, first)
    cached = await store.get(ref)
    assert cached is not None and cached.last_message_offset == 9
    assert await catch_up(state, store, journal, [ref]) == [ref]
    got = await store.get(ref)
    assert got is not None and (got.version, got.last_message_offset) == (2, 39)


async def test_a_summary_whose_after_effects_failed_is_cached_by_the_repair(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valkey went down right after the second summary reached the object store: its cache
    write and the counters' reset both failed. The redelivered request repairs the reset,
    and readers then get the second summary, not the first one still cached (they did for
    up to the cache's hour: 50 messages in neither the summary nor the counters)."""
    ref = new_ref()
    msgs = await append(journal, ref, chatter(100))
    await count_all(counters, msgs)
    s = summarizer(journal, state, store)
    assert await s.summarize(ref, 49) is not None

    async def down(*_a: object) -> None:
        raise RetryableInfraError("valkey: connection refused")

    async def lost(*_a: object) -> None:
        return None

    with monkeypatch.context() as m:
        m.setattr(store, "cache", lost)  # best effort: the failure is only logged
        m.setattr(store, "refresh_cache", down)
        with pytest.raises(RetryableInfraError):
            await s.summarize(ref, 99)
    kept = await store.get(ref)
    assert kept is not None and kept.version == 1
    assert await s.summarize(ref, 99) is None  # the redelivery: written already, repaired
    got = await store.get(ref)
    assert got is not None and (got.version, got.last_message_offset) == (2, 99)
    assert await state.counters(ref) == (0, 0)
    assert await state.watermark(ref) == 99


async def test_without_a_journal_the_catch_up_clears_the_counters(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis_client: aioredis.Redis,
) -> None:
    """A catch-up with no journal to say what the lost summary covered raises the
    watermark and clears both counters: the next summary may come late, never early."""
    ref, msgs, s = await summary_lost(journal, counters, state, store, redis_client)
    assert await catch_up(state, store, None, [ref]) == [ref]
    assert await state.counters(ref) == (0, 0)
    assert await state.watermark(ref) == 39


async def test_redelivered_request_is_a_noop(
    journal: Journal, counters: CountersProcessor, state: ThreadState, store: SummaryStore
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs)
    s = summarizer(journal, state, store)
    assert (await s.summarize(ref, 49)) is not None
    assert (await s.summarize(ref, 49)) is None
    assert (await s.summarize(ref, 10)) is None
    got = await store.get(ref)
    assert got is not None and got.version == 1
    assert await store.get_version(ref, 2) is None


async def test_two_summarizers_racing_write_dense_versions(
    journal: Journal, counters: CountersProcessor, state: ThreadState, store: SummaryStore
) -> None:
    ref = new_ref()
    a = summarizer(journal, state, store)
    b = summarizer(journal, state, store)
    for round_ in range(3):
        msgs = await append(journal, ref, chatter(50, round_ * 50))
        await count_all(counters, msgs)
        up_to = msgs[-1].offset
        # Both workers get the request (a rebalance redelivery), several times each.
        results = await asyncio.gather(*(w.summarize(ref, up_to) for w in (a, b, a, b)))
        assert sum(r is not None for r in results) == 1
    versions = [await store.get_version(ref, v) for v in range(1, 5)]
    assert [v.version for v in versions if v is not None] == [1, 2, 3]
    assert [v.last_message_offset for v in versions if v is not None] == [49, 99, 149]


async def test_store_race_exactly_one_writer_per_version(store: SummaryStore) -> None:
    ref = new_ref()
    t = FixedClock().now()

    def version(n: int, who: int) -> Summary:
        return Summary(n, t, n * 10, f"m{n}", f"writer {who}", 2, n * 10)

    for n in (1, 2, 3):
        outcomes = await asyncio.gather(
            *(store.write(ref, version(n, w), n - 1) for w in range(6)), return_exceptions=True
        )
        assert sum(o is None for o in outcomes) == 1
        assert all(isinstance(o, Conflict) for o in outcomes if o is not None)
    latest = await store.get_stored(ref)
    assert latest is not None and latest.version == 3
    with pytest.raises(Conflict):  # a gap is refused too
        await store.write(ref, version(6, 0), 5)


async def test_crash_after_taking_the_lock_expires_then_done_once(
    journal: Journal, counters: CountersProcessor, state: ThreadState, store: SummaryStore
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs)
    crashed = await state.try_lock(ref, 1.0)  # a worker took the lock and died
    assert crashed is not None
    s = summarizer(journal, state, store, lock_ttl_s=1.0)
    started = time.monotonic()
    out = await asyncio.gather(s.summarize(ref, 49), s.summarize(ref, 49))
    assert time.monotonic() - started >= 0.5  # it waited for the expiry
    assert sum(o is not None for o in out) == 1
    assert await store.get_version(ref, 2) is None


class _DiesWith:
    """A ThreadState whose lock is never renewed nor released once ``dead``: a summarizer
    process SIGKILLed mid-summary (no ``finally`` runs in a dead process)."""

    def __init__(self, state: ThreadState) -> None:
        self._state = state
        self.dead = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._state, name)

    async def renew_lock(self, ref: ThreadRef, token: str, ttl_s: float) -> bool:
        return True if self.dead else await self._state.renew_lock(ref, token, ttl_s)

    async def unlock(self, ref: ThreadRef, token: str) -> bool:
        return True if self.dead else await self._state.unlock(ref, token)


class _Hangs(ExtractiveSummaryModel):
    async def summarize(self, *args: object, **kw: object) -> str:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_summarizer_killed_mid_summary_holds_the_thread_for_its_lease_only(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis_client: aioredis.Redis,
) -> None:
    """Issue 12 (scale-out chaos): a worker SIGKILLed while summarizing left the thread's
    lock for summary_lock_ttl_s (120 s), and the next owner of its partitions waited that
    long, holding up every summary behind it. The lock is a lease now: renewed while the
    holder works, gone within the lease once it is dead."""
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs)
    dying = _DiesWith(state)
    a = SummarizerProcessor(
        journal,
        dying,  # type: ignore[arg-type]  # a stand-in: the rest of ThreadState by delegation
        store,
        _Hangs(),
        token_budget=200,
        clock=FixedClock(),
        lock_ttl_s=120.0,
        lock_lease_s=1.0,
    )
    work = asyncio.create_task(a.summarize(ref, 49))
    lock_key = redis_keys.summary_lock(ref)
    async with asyncio.timeout(10):
        while not await redis_client.exists(lock_key):
            await asyncio.sleep(0.02)
    await asyncio.sleep(2.0)  # twice the lease: held only because the holder renews it
    assert await redis_client.exists(lock_key)
    assert 0 < await redis_client.pttl(lock_key) <= 1000
    dying.dead = True  # SIGKILL: no renewal, no release
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    b = summarizer(journal, state, store, lock_ttl_s=120.0, lock_lease_s=1.0)
    async with asyncio.timeout(30):  # before: waited the 120 s bound
        written = await b.summarize(ref, 49)
    assert written is not None and written.version == 1
    assert await store.get_version(ref, 2) is None


async def test_wiping_redis_changes_nothing_read_back(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    redis_client: aioredis.Redis,
    objects: LocalStore,
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs)
    written = await summarizer(journal, state, store).summarize(ref, 49)
    assert written is not None
    assert await store.get(ref) == written
    await redis_client.flushdb()
    assert await store.get(ref) == written  # from object storage, and the cache refilled
    assert await redis_client.ttl(f"ms:{{{ref.key}}}:summary") > 3_000
    fresh = SummaryStore(objects, redis_client)
    assert await fresh.get(ref) == written
    # A replay after the wipe does not re-count what is already summarized.
    assert await count_all(counters, msgs) == []
    assert await state.counters(ref) == (0, 0)


async def test_summary_json_is_at_the_spec_path(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    tmp_path: Path,
) -> None:
    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs)
    await summarizer(journal, state, store).summarize(ref, 49)
    path = tmp_path / "objects" / summary_path(ref)
    assert path.is_file()
    assert str(summary_path(ref)) == (
        f"accounts/{ref.account_id}/agents/{ref.agent_id}/threads/{ref.thread_id}/summary.json"
    )
    import orjson

    doc = orjson.loads(path.read_bytes())
    assert set(doc) == {
        "version",
        "timestamp",
        "last_message_offset",
        "last_message_id",
        "content",
        "token_count",
        "message_count",
    }


# --- pre-compaction flush ------------------------------------------------------------------
class FailingExtractor:
    async def extract(self, messages: Sequence[Message]) -> list[ExtractedFact]:
        raise RuntimeError("model went away")


FACTS = [
    "Hi, my name is Ada Lovelace.",
    "We use Postgres for the ledger.",
    "I prefer short answers.",
]


async def entries(pool: asyncpg.Pool, ref: ThreadRef) -> list[tuple[str, str, str]]:
    rows = await pool.fetch(
        "SELECT key, category, visibility FROM memory_entries"
        " WHERE account_id=$1 AND agent_id=$2 ORDER BY key",
        ref.account_id,
        ref.agent_id,
    )
    return [(r["key"], r["category"], r["visibility"]) for r in rows]


@pytest.mark.parametrize("bound", [True, False])
async def test_flush_only_when_memory_is_bound(
    bound: bool,
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    pg_pool: asyncpg.Pool,
) -> None:
    ref = new_ref()
    accounts = Accounts(pg_pool)
    await accounts.ensure_account(ref.account_id)
    await accounts.configure_agent(ref.account_id, ref.agent_id, memory=bound)
    msgs = await journal.append(
        ref, [NewMessage(role="user", content=t, user_id="u1") for t in FACTS]
    )
    msgs += await append(journal, ref, chatter(47))
    await count_all(counters, msgs)
    s = summarizer(
        journal,
        state,
        store,
        agents=accounts,
        extractor=RuleFactExtractor(),
        memory=MemoryService(pg_pool, FixedClock()),
    )
    assert await s.summarize(ref, 49) is not None
    got = await entries(pg_pool, ref)
    if bound:
        assert ("user.name", "user_profile", "private") in got
        assert ("user.prefers.short-answers", "user_profile", "private") in got
        assert any(k.startswith("project.uses.") and c == "project_fact" for k, c, _ in got)
    else:
        assert got == []


async def test_failing_flush_still_yields_the_summary(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    pg_pool: asyncpg.Pool,
) -> None:
    ref = new_ref()
    accounts = Accounts(pg_pool)
    await accounts.ensure_account(ref.account_id)
    await accounts.configure_agent(ref.account_id, ref.agent_id, memory=True)
    msgs = await append(journal, ref, FACTS + chatter(47))
    await count_all(counters, msgs)
    s = summarizer(
        journal,
        state,
        store,
        agents=accounts,
        extractor=FailingExtractor(),
        memory=MemoryService(pg_pool, FixedClock()),
    )
    written = await s.summarize(ref, 49)
    assert written is not None and written.version == 1
    assert await entries(pg_pool, ref) == []


class CountingExtractor(RuleFactExtractor):
    """The offline extractor, counting its (silent model) turns and what each one saw."""

    def __init__(self) -> None:
        self.seen: list[list[str | None]] = []

    async def extract(self, messages: Sequence[Message]) -> list[ExtractedFact]:
        self.seen.append([m.user_id for m in messages])
        return await super().extract(messages)


async def bound_agent(pg_pool: asyncpg.Pool, ref: ThreadRef) -> Accounts:
    accounts = Accounts(pg_pool)
    await accounts.ensure_account(ref.account_id)
    await accounts.configure_agent(ref.account_id, ref.agent_id, memory=True)
    return accounts


async def test_each_fact_is_stored_for_the_user_who_stated_it(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    pg_pool: asyncpg.Pool,
) -> None:
    """Two users in one span (a shared thread): alice's name is alice's, bob's is bob's;
    before, every fact went to the span's last user."""
    ref = new_ref()
    accounts = await bound_agent(pg_pool, ref)
    msgs = await journal.append(
        ref,
        [
            NewMessage(role="user", content="Hi, my name is Alice Smith.", user_id="alice"),
            NewMessage(role="assistant", content="Hello Alice."),
            NewMessage(role="user", content="My name is Bob Jones.", user_id="bob"),
            NewMessage(role="user", content="We use Postgres for the ledger.", user_id="bob"),
        ],
    )
    msgs += await append(journal, ref, chatter(46))
    await count_all(counters, msgs)
    extractor = CountingExtractor()
    memory = MemoryService(pg_pool, FixedClock(), binding=accounts)
    s = summarizer(journal, state, store, agents=accounts, extractor=extractor, memory=memory)
    assert await s.summarize(ref, 49) is not None
    rows = await pg_pool.fetch(
        "SELECT key, content, user_id, visibility FROM memory_entries"
        " WHERE account_id = $1 AND agent_id = $2 AND key = 'user.name' ORDER BY user_id",
        ref.account_id,
        ref.agent_id,
    )
    assert [(r["user_id"], r["visibility"]) for r in rows] == [
        ("alice", "private"),
        ("bob", "private"),
    ]
    assert "Alice" in rows[0]["content"] and "Bob" in rows[1]["content"]
    # each model turn saw one user's own messages only
    assert all(len(set(users)) == 1 for users in extractor.seen)


class FlakyModel(ExtractiveSummaryModel):
    """Fails the first summary call (after the flush ran): the request is retried."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def summarize(self, previous: str | None, span: Sequence[Message], budget: int) -> str:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("summary model timed out")
        return await super().summarize(previous, span, budget)


async def test_a_retried_or_raced_summary_flushes_its_span_once(
    journal: Journal,
    counters: CountersProcessor,
    state: ThreadState,
    store: SummaryStore,
    pg_pool: asyncpg.Pool,
) -> None:
    ref = new_ref()
    accounts = await bound_agent(pg_pool, ref)
    msgs = await journal.append(
        ref, [NewMessage(role="user", content=t, user_id="u1") for t in FACTS]
    )
    msgs += await append(journal, ref, chatter(47))
    await count_all(counters, msgs)
    extractor = CountingExtractor()
    memory = MemoryService(pg_pool, FixedClock(), binding=accounts)
    s = SummarizerProcessor(
        journal,
        state,
        store,
        FlakyModel(),
        agents=accounts,
        extractor=extractor,
        memory=memory,
        token_budget=200,
        clock=FixedClock(),
    )
    with pytest.raises(RuntimeError):
        await s.summarize(ref, 49)  # flushed, then the summary step failed
    turns = len(extractor.seen)
    assert turns == 2  # one per user of the span: u1, and the messages without a user
    # the redelivered request, and a write that loses a version race once
    real_write = store.write
    lost = [False]

    async def racy_write(ref: ThreadRef, summary: Summary, expected_previous_version: int) -> None:
        if not lost[0]:
            lost[0] = True
            raise Conflict("another worker wrote this version")
        await real_write(ref, summary, expected_previous_version=expected_previous_version)

    store.write = racy_write  # type: ignore[method-assign]  # a store that loses one race
    written = await s.summarize(ref, 49)
    assert written is not None and written.version == 1 and lost[0]
    assert len(extractor.seen) == turns  # the span was not flushed again
    assert ("user.name", "user_profile", "private") in await entries(pg_pool, ref)


class StalledModel(ExtractiveSummaryModel):
    async def summarize(self, previous: str | None, span: Sequence[Message], budget: int) -> str:
        await asyncio.sleep(3600)  # a call that never answers
        raise AssertionError("unreachable")


async def test_a_stalled_model_call_fails_within_its_budget_and_frees_the_lock(
    journal: Journal, counters: CountersProcessor, state: ThreadState, store: SummaryStore
) -> None:
    from memstream.errors import RetryableInfraError

    ref = new_ref()
    msgs = await append(journal, ref, chatter(50))
    await count_all(counters, msgs)
    s = SummarizerProcessor(
        journal, state, store, StalledModel(), summary_timeout_s=0.3, clock=FixedClock()
    )
    started = time.monotonic()
    with pytest.raises(RetryableInfraError):
        await s.summarize(ref, 49)
    assert time.monotonic() - started < 5  # not the SDK's 600 s
    assert await state.try_lock(ref, 5) is not None  # the lock was released
