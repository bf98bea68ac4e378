"""``GET .../threads/{thread_id}/summary`` over a real object store and Redis: the spec's
seven fields, 404 when there is none, tenancy, and the same answer after Redis is wiped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.infra.summary_store import SummaryStore
from memstream.schemas.records import Summary, ThreadRef
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(
    api_stack: ApiStack, redis_client: aioredis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ApiStack]:
    folder: Path = tmp_path_factory.mktemp("summaries")
    api_stack.services.summary_store = SummaryStore(
        LocalStore(prefix=folder, mkdir=True), redis_client
    )
    yield api_stack
    api_stack.services.summary_store = None


async def test_summary_route(stack: ApiStack, redis_client: aioredis.Redis) -> None:
    c = stack.client
    url = "/v1/agents/sumbot/threads/s1/summary"
    r = await c.get(url, headers=stack.headers())
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"

    store = stack.services.summary_store
    assert store is not None
    s1 = Summary(1, datetime(2026, 1, 2, tzinfo=UTC), 49, "m49", "User is Alice.", 5, 50)
    await store.write(ThreadRef("acme", "sumbot", "s1"), s1, 0)
    r = await c.get(url, headers=stack.headers())
    assert r.status_code == 200
    assert r.json() == {
        "version": 1,
        "timestamp": "2026-01-02T00:00:00.000Z",
        "last_message_offset": 49,
        "last_message_id": "m49",
        "content": "User is Alice.",
        "token_count": 5,
        "message_count": 50,
    }
    # another account with the same agent and thread ids sees nothing
    r = await c.get(url, headers=stack.headers(key=stack.other_key))
    assert r.status_code == 404
    # wiping Redis changes nothing: the object store is the authority
    await redis_client.flushdb()
    r = await c.get(url, headers=stack.headers())
    assert r.status_code == 200 and r.json()["version"] == 1
