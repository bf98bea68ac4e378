"""Read-your-writes across processes: positions shared through Redis (real Valkey).

The projector's process (``memstream worker``) and the API's (``memstream api``) each have
their own :class:`Positions`; here they are two instances over one Redis, the API's never
advanced locally, so every ``after`` it honours came through Redis.

- a position applied by the worker lets the API's wait return, also when applied while the
  API is already waiting, also when the worker is another OS process;
- marks never move backwards, whatever order writers (or redelivered batches) arrive in;
- a wiped Redis makes the API wait and answer ``not_ready``, never early; the next batch
  re-publishes; an unreachable Redis fails neither the projector's advance nor the read
  (``not_ready``, not an error);
- over HTTP, ``memory/recall`` with ``after`` answers 200 from a mark only Redis holds.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from memstream.agents_ctx.memory.store import MemoryService
from memstream.errors import NotReady
from memstream.infra.redis_positions import RedisPositions, position_key
from memstream.projections.positions import Positions, memory_position_key, thread_position_key
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")

THREAD = thread_position_key("acme", "ryw", "t1")
AGENT = memory_position_key("acme", "ryw")


@pytest_asyncio.fixture(loop_scope="session")
async def two_processes(
    redis_client: aioredis.Redis,
) -> AsyncIterator[tuple[Positions, Positions]]:
    await redis_client.flushdb()
    worker = Positions.shared(RedisPositions(redis_client))
    api = Positions.shared(RedisPositions(redis_client))
    yield worker, api
    await worker.close()
    await api.close()


async def test_api_sees_what_the_worker_applied(two_processes: tuple[Positions, Positions]) -> None:
    worker, api = two_processes
    worker.messages.advance_many({THREAD: 41, thread_position_key("acme", "ryw", "t2"): 7})
    await worker.flush()
    assert api.messages.get(THREAD) is None  # nothing in the API's own memory
    assert await api.messages.wait_for(THREAD, 41, timeout=0.5) == 41
    assert await api.messages.wait_for(THREAD, 30, timeout=0.5) == 41
    with pytest.raises(NotReady) as ei:
        # 1 s: the Redis read is bounded by what is left of the wait, and at load 14 a
        # 0.1 s wait ran out inside it (then the error can only say "none")
        await api.messages.wait_for(THREAD, 42, timeout=1.0)
    assert ei.value.position == 41  # the highest mark seen, from Redis
    # the projections are kept apart: a thread mark says nothing about memory
    with pytest.raises(NotReady):
        await api.memory.wait_for(THREAD, 1, timeout=0.05)


async def test_a_wait_returns_when_the_worker_applies_meanwhile(
    two_processes: tuple[Positions, Positions],
) -> None:
    worker, api = two_processes

    async def apply_later() -> None:
        await asyncio.sleep(0.15)
        worker.memory.advance(AGENT, 12)

    task = asyncio.create_task(apply_later())
    started = asyncio.get_running_loop().time()
    assert await api.memory.wait_for(AGENT, 12, timeout=3.0) == 12
    waited = asyncio.get_running_loop().time() - started
    await task
    assert 0.1 < waited < 1.0  # answered by polling Redis, well before the timeout


WORKER_SCRIPT = """
import asyncio, sys
import redis.asyncio as aioredis
from memstream.infra.redis_positions import RedisPositions
from memstream.projections.positions import Positions

async def main() -> None:
    r = aioredis.from_url(sys.argv[1])
    worker = Positions.shared(RedisPositions(r))
    worker.messages.advance(sys.argv[2], int(sys.argv[3]))
    await worker.flush()
    await r.aclose()

asyncio.run(main())
"""


async def test_a_worker_in_another_process(
    two_processes: tuple[Positions, Positions], redis_client: aioredis.Redis
) -> None:
    _, api = two_processes
    kw = redis_client.connection_pool.connection_kwargs
    url = f"redis://{kw['host']}:{kw['port']}/{kw['db']}"
    waiting = asyncio.create_task(api.messages.wait_for(THREAD, 77, timeout=30.0))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER_SCRIPT, url, THREAD, "77"
    )
    assert await proc.wait() == 0
    assert await asyncio.wait_for(waiting, 5.0) == 77


async def test_marks_never_move_backwards(
    two_processes: tuple[Positions, Positions], redis_client: aioredis.Redis
) -> None:
    worker, api = two_processes
    store = RedisPositions(redis_client)
    await store.record("memory", {AGENT: 100})
    await store.record("memory", {AGENT: 60})  # a late or redelivered batch
    await asyncio.gather(*(store.record("memory", {AGENT: p}) for p in (70, 130, 90)))
    assert await store.get("memory", AGENT) == 130
    # a second worker instance starting from scratch cannot lower it either
    other_worker = Positions.shared(store)
    other_worker.memory.advance(AGENT, 5)
    await other_worker.flush()
    assert await api.memory.wait_for(AGENT, 130, timeout=0.2) == 130
    await other_worker.close()


async def test_a_wiped_redis_makes_reads_wait_never_answer_early(
    two_processes: tuple[Positions, Positions], redis_client: aioredis.Redis
) -> None:
    worker, api = two_processes
    worker.memory.advance(AGENT, 20)
    await worker.flush()
    assert await api.memory.wait_for(AGENT, 20, timeout=0.2) == 20
    await redis_client.flushdb()  # derived state lost
    with pytest.raises(NotReady) as ei:
        await api.memory.wait_for(AGENT, 20, timeout=0.1)
    assert ei.value.position == 0
    # the worker's next batch for the agent publishes again
    worker.memory.advance(AGENT, 21)
    await worker.flush()
    assert await api.memory.wait_for(AGENT, 20, timeout=0.2) == 21


async def test_an_unreachable_redis_fails_nothing() -> None:
    dead = aioredis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    try:
        worker = Positions.shared(RedisPositions(dead))
        worker.memory.advance(AGENT, 3)  # the projector's batch goes on
        assert await worker.memory.wait_for(AGENT, 3, timeout=0.1) == 3  # in-process view
        api = Positions.shared(RedisPositions(dead))
        with pytest.raises(NotReady):
            await api.memory.wait_for(AGENT, 3, timeout=0.3)
        await worker.close()
        await api.close()
    finally:
        await dead.aclose()


async def test_marks_expire_when_idle(redis_client: aioredis.Redis) -> None:
    store = RedisPositions(redis_client, ttl_s=60)
    await store.record("messages", {THREAD: 3})
    ttl = await redis_client.ttl(position_key("messages", THREAD))
    assert 0 < ttl <= 60


async def test_a_busy_key_s_expiry_is_pushed_back_at_most_once_per_refresh(
    redis_client: aioredis.Redis,
) -> None:
    """One command per key a batch, not two: the ``EXPIRE`` goes with a key's first mark
    and then once per ``refresh_s``; a key that lost its expiry (Valkey wiped and the mark
    written again) gets it back at the next refresh."""
    store = RedisPositions(redis_client, ttl_s=60, refresh_s=0.3)
    thread = f"{THREAD}-busy-{uuid.uuid4().hex[:8]}"
    key = position_key("messages", thread)
    await store.record("messages", {thread: 1})
    assert 0 < await redis_client.ttl(key) <= 60
    await redis_client.persist(key)  # as if Valkey had lost the key and the mark came back
    await store.record("messages", {thread: 2})
    assert await redis_client.ttl(key) == -1  # within the refresh: no EXPIRE sent
    assert await store.get("messages", thread) == 2  # the mark itself always moves
    await asyncio.sleep(0.35)
    await store.record("messages", {thread: 3})
    assert 0 < await redis_client.ttl(key) <= 60


async def test_recall_after_answers_from_a_mark_only_redis_holds(
    api_stack: ApiStack, redis_client: aioredis.Redis
) -> None:
    svc = api_stack.services
    saved_settings, saved_positions, saved_memory = svc.settings, svc.positions, svc.memory
    svc.memory = svc.memory or MemoryService(api_stack.pool, api_stack.clock)
    for agent in ["ryw-redis"]:  # the memory tools need Memory bound
        await svc.accounts.configure_agent("acme", agent, memory=True)
    svc.settings = saved_settings.model_copy(update={"read_your_writes_timeout_s": 1.0})
    api = Positions.shared(RedisPositions(redis_client))  # the API process's view
    worker = Positions.shared(RedisPositions(redis_client))  # the projector's process
    svc.positions = api
    try:
        c, h = api_stack.client, api_stack.headers()
        r = await c.post(
            "/v1/agents/ryw-redis/memory/store",
            json={
                "key": "drink",
                "content": "Prefers oolong tea",
                "category": "user_profile",
                "scope": "shared",
            },
            headers=h,
        )
        assert r.status_code == 200, r.text
        position = r.json()["position"]
        body = {"query": "tea", "after": position}
        svc.settings = svc.settings.model_copy(update={"read_your_writes_timeout_s": 0.1})
        r = await c.post("/v1/agents/ryw-redis/memory/recall", json=body, headers=h)
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_ready"

        svc.settings = svc.settings.model_copy(update={"read_your_writes_timeout_s": 2.0})

        async def project_later() -> None:
            await asyncio.sleep(0.1)
            worker.memory.advance(memory_position_key("acme", "ryw-redis"), position)

        task = asyncio.create_task(project_later())
        r = await c.post("/v1/agents/ryw-redis/memory/recall", json=body, headers=h)
        await task
        assert r.status_code == 200, r.text
        assert [e["key"] for e in r.json()["results"]] == ["drink"]
        assert api.memory.get(memory_position_key("acme", "ryw-redis")) is None
    finally:
        svc.settings, svc.positions, svc.memory = saved_settings, saved_positions, saved_memory
        await worker.close()
        await api.close()
