"""Defect 6 of issue 12 (bytes): NUL in memory or message content and JSON nested past the
limit (tool-call arguments, bodies) are refused with 400 naming the field; nothing stored."""

from __future__ import annotations

import orjson
import pytest
import pytest_asyncio

from memstream.agents_ctx.memory.store import MemoryService
from memstream.schemas.limits import MAX_JSON_DEPTH
from memstream.schemas.records import ThreadRef
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def api(api_stack: ApiStack) -> ApiStack:
    if api_stack.services.memory is None:
        api_stack.services.memory = MemoryService(api_stack.pool, api_stack.clock)
    await api_stack.services.accounts.configure_agent("acme", "nul", memory=True)
    return api_stack


def nested(depth: int) -> object:
    v: object = "leaf"
    for _ in range(depth):
        v = {"a": v}
    return v


async def test_nul_in_memory_content_is_refused_naming_the_field(api: ApiStack) -> None:
    body = {"key": "k", "content": "a\x00b", "category": "project_fact"}
    r = await api.client.post("/v1/agents/nul/memory/store", json=body, headers=api.headers())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "content"
    r = await api.client.post(
        "/v1/agents/nul/memory/recall", json={"query": "a b"}, headers=api.headers()
    )
    assert r.status_code == 200 and r.json()["results"] == []


async def test_nul_in_a_message_is_refused_and_nothing_is_appended(api: ApiStack) -> None:
    c, h = api.client, api.headers()
    assert (await c.post("/v1/agents/nul/threads", json={"thread_id": "t"}, headers=h)).is_success
    msgs = [{"role": "user", "content": "fine"}, {"role": "user", "content": "bad\x00"}]
    r = await c.post("/v1/agents/nul/threads/t/messages", json={"messages": msgs}, headers=h)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "messages[1].content"
    assert await api.journal.read_range(ThreadRef("acme", "nul", "t"), 0, 10) == []


async def test_tool_call_arguments_nested_too_deep_are_refused(api: ApiStack) -> None:
    c, h = api.client, api.headers()
    assert (await c.post("/v1/agents/nul/threads", json={"thread_id": "d"}, headers=h)).is_success
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": '{"a":' * 300 + "1" + "}" * 300},
    }
    msgs = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    r = await c.post("/v1/agents/nul/threads/d/messages", json={"messages": msgs}, headers=h)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"].startswith("messages[0].tool_calls[0].function.arguments")
    ok = {**call, "function": {"name": "f", "arguments": orjson.dumps(nested(5)).decode()}}
    msgs = [{"role": "assistant", "content": None, "tool_calls": [ok]}]
    r = await c.post("/v1/agents/nul/threads/d/messages", json={"messages": msgs}, headers=h)
    assert r.status_code == 201, r.text


async def test_a_body_nested_past_the_limit_is_refused(api: ApiStack) -> None:
    body = {"thread_id": "deep", "metadata": nested(MAX_JSON_DEPTH + 5)}
    r = await api.client.post("/v1/agents/nul/threads", json=body, headers=api.headers())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"].startswith("metadata.a.a")
