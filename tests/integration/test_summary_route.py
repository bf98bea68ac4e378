"""``GET .../threads/{thread_id}/summary`` over a real object store and Redis: the spec's
seven fields, 404 when there is none, tenancy, and the same answer after Redis is wiped."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
import redis.asyncio as aioredis

from memstream.schemas.records import Summary, ThreadRef
from tests.fixtures.api import ApiStack, no_thread

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_summary_route(summary_stack: ApiStack, redis_client: aioredis.Redis) -> None:
    stack = summary_stack
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


async def test_someone_elses_or_a_deleted_thread_answers_as_no_thread(
    summary_stack: ApiStack,
) -> None:
    stack = summary_stack
    """For bob and for a caller with no user, alice's private thread (with a summary) and a
    deleted one answer exactly what a thread that never existed answers: the same status,
    code, message (with the id substituted) and field. Alice still reads her summary, and
    her thread with none yet says so."""
    c = stack.client
    agent = "sumpriv"
    for thread in ("a-priv", "a-gone", "a-empty"):
        r = await c.post(
            f"/v1/agents/{agent}/threads/{thread}/messages",
            json={"role": "user", "content": "my secret is turquoise"},
            headers=stack.headers(user="alice"),
        )
        assert r.status_code == 201, r.text
    store = stack.services.summary_store
    assert store is not None
    s1 = Summary(1, datetime(2026, 1, 2, tzinfo=UTC), 0, "m0", "turquoise", 3, 1)
    for thread in ("a-priv", "a-gone"):
        await store.write(ThreadRef("acme", agent, thread), s1, 0)
    r = await c.delete(f"/v1/agents/{agent}/threads/a-gone", headers=stack.headers(user="alice"))
    assert r.status_code == 204

    async def answer(thread: str, user: str | None) -> tuple[int, object]:
        r = await c.get(
            f"/v1/agents/{agent}/threads/{thread}/summary", headers=stack.headers(user=user)
        )
        return r.status_code, r.json()

    def as_none(thread: str, answer: tuple[int, object]) -> tuple[int, object]:
        status, body = answer
        return status, orjson.loads(orjson.dumps(body).replace(thread.encode(), b"nonexistent"))

    for user in ("bob", None):
        never = await answer("nonexistent", user)
        assert never == no_thread("nonexistent")
        for thread in ("a-priv", "a-gone", "a-empty"):
            assert as_none(thread, await answer(thread, user)) == never, (thread, user)
    # her deleted thread is no thread for her either
    gone = as_none("a-gone", await answer("a-gone", "alice"))
    assert gone == await answer("nonexistent", "alice")
    # the owner still reads her summary; her thread without one says it has none yet
    status, body = await answer("a-priv", "alice")
    assert status == 200 and isinstance(body, dict) and body["content"] == "turquoise"
    assert await answer("a-empty", "alice") == (
        404,
        {"error": {"code": "not_found", "message": "thread 'a-empty' has no summary yet"}},
    )
