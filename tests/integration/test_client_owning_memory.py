"""The Python client's owning-memory and erasure methods against the real app (ASGI)."""

from __future__ import annotations

import httpx
import pytest

from memstream import errors
from memstream.agents_ctx.erasure import Erasures
from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.memory.store import MemoryService
from memstream.client import MemstreamClient
from tests.fixtures.api import ApiStack
from tests.fixtures.binding import EVERY_AGENT_BOUND

pytestmark = pytest.mark.asyncio(loop_scope="session")


def client(api: ApiStack, key: str, user: str | None = None) -> MemstreamClient:
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(api.services)), base_url="http://ms.test"
    )
    return MemstreamClient("http://ms.test", key, user=user, http=http)


async def test_browse_edit_export_import_and_erase_through_the_client(api_stack: ApiStack) -> None:
    svc = api_stack.services
    svc.memory = MemoryService(api_stack.pool, api_stack.clock, binding=EVERY_AGENT_BOUND)
    svc.erasures = Erasures(svc)
    admin_key = await svc.accounts.create_key("acme", admin=True)
    alice = client(api_stack, api_stack.key, "alice")
    admin = client(api_stack, admin_key)
    try:
        for i in range(7):
            await alice.memory_store("cb", f"k{i}", f"fact {i}", "project_fact", "private")
        page = await alice.memory_entries("cb", limit=3)
        assert len(page["entries"]) == 3 and page["next_cursor"]
        assert len([e async for e in alice.iter_memory_entries("cb", limit=2)]) == 7
        assert (await alice.memory_entry("cb", "k3"))["content"] == "fact 3"
        with pytest.raises(errors.NotFound):
            await alice.memory_entry("cb", "missing")
        with pytest.raises(errors.Forbidden):
            await alice.memory_entries("cb", user_id="bob")
        edited = await alice.memory_edit("cb", "k3", {"content": "fact three"})
        assert edited["status"] == "replaced"
        with pytest.raises(errors.InvalidRequest) as e:
            await alice.memory_edit("cb", "k3", {"key": "x"})
        assert e.value.field == "key"

        exported = [x async for x in admin.memory_export("cb")]
        assert len(exported) == 7
        report = await admin.memory_import("cb-copy", exported)
        assert (report["created"], report["failed"]) == (7, [])
        assert (await admin.memory_import("cb-copy", exported))["unchanged"] == 7

        r = await alice.append("cb", "t-erase", {"role": "user", "content": "bye"})
        assert r["appended"]
        erasure_id = await alice.erase_thread("cb", "t-erase")
        await svc.erasures.wait(erasure_id)
        status = await alice.erasure(erasure_id)
        assert status["status"] == "done" and status["stores"]["journal_messages"] == 1
        with pytest.raises(errors.Forbidden):
            await alice.erase_user("alice")
    finally:
        await alice.aclose()
        await admin.aclose()
        await svc.erasures.close()
        svc.erasures = None
        svc.memory = None


async def test_dot_ids_reach_their_own_route_and_dot_keys_are_refused(api_stack: ApiStack) -> None:
    """``.`` and ``..`` are sent as ``%2E`` / ``%2E%2E``: httpx would resolve them as dot
    segments, so ``memory_entry(agent, ".")`` read the entries list and ``..`` another
    route, answering errors without a field."""
    svc = api_stack.services
    svc.memory = MemoryService(api_stack.pool, api_stack.clock, binding=EVERY_AGENT_BOUND)
    alice = client(api_stack, api_stack.key, "alice")
    try:
        # thread ids: the server's own answer for such an id (400 naming the field)
        for thread_id in (".", ".."):
            with pytest.raises(errors.InvalidRequest) as e:
                await alice.append("cd", thread_id, {"role": "user", "content": "hi"})
            assert e.value.field == "thread_id", (thread_id, e.value)
        # an id with '/' would reach no route (a bare 404): refused, naming the field
        for call, field in (
            (alice.append("cd", "a/b", {"role": "user", "content": "hi"}), "thread_id"),
            (alice.context("a\\b", "t"), "agent_id"),
            (alice.tool_call_view("cd", "c/1"), "tool_call_id"),
            (alice.erase_user("x/y"), "user_id"),
        ):
            with pytest.raises(errors.InvalidRequest) as e:
                await call
            assert e.value.field == field, e.value
        # new keys "." and ".." are refused, naming key, by store and import alike
        for key in (".", ".."):
            with pytest.raises(errors.InvalidRequest) as e:
                await alice.memory_store("cd", key, "x", "project_fact", "private")
            assert e.value.field == "key" and "'.' or '..'" in e.value.message
        report = await alice.memory_import(
            "cd", [{"key": "..", "content": "x", "category": "project_fact"}]
        )
        assert report["created"] == 0 and "key" in str(report["failed"])
        # entries stored under them before (a row renamed here) stay reachable by key
        for key in (".", ".."):
            await alice.memory_store("cd", f"was{key}", f"fact {key}", "project_fact", "private")
            await api_stack.pool.execute(
                "UPDATE memory_entries SET key = $1 WHERE agent_id = 'cd' AND key = $2",
                key,
                f"was{key}",
            )
            entry = await alice.memory_entry("cd", key)
            assert (entry["key"], entry["content"]) == (key, f"fact {key}")
            edited = await alice.memory_edit("cd", key, {"content": f"edited {key}"})
            assert edited["status"] == "replaced" and edited["entry"]["key"] == key
            assert await alice.memory_forget("cd", key)
            with pytest.raises(errors.NotFound):
                await alice.memory_entry("cd", key)
    finally:
        await alice.aclose()
        svc.memory = None
