"""Read-your-writes and the admin replay route over HTTP (real Postgres, SlateDB journal,
chdb; the FastAPI app through httpx).

- an append and a memory store answer with a ``position``;
- ``journal/search`` / ``memory/recall`` with ``after`` answer once the projection applied it,
  and ``409 not_ready`` with the applied position when it does not in time;
- ``after`` that is not a position of the caller's agent is ``invalid_request`` naming ``after``;
- ``POST /admin/replay/messages?from_journal=true`` streams NDJSON progress and a report, and
  search then answers from the rebuilt generation.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import pytest_asyncio

from memstream import errors
from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.memory.store import MemoryService
from memstream.client import MemstreamClient
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.positions import Positions, memory_position_key, thread_position_key
from memstream.projections.replay import ReplayStateStore
from memstream.projections.replay_hub import ReplayHub
from memstream.projections.replay_sinks import MessagesSink
from memstream.schemas.topics import Topics
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")

ADMIN = {"X-Memstream-Admin-Token": "admin-secret"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def api(api_stack: ApiStack, chdb_engine: ChdbEngine) -> AsyncIterator[ApiStack]:
    svc = api_stack.services
    saved = svc.settings
    db = f"ryw_{uuid.uuid4().hex[:10]}"
    store = MessageStore(chdb_engine, db)
    await store.ensure_schema()
    svc.message_store = store
    svc.memory = svc.memory or MemoryService(api_stack.pool, api_stack.clock)
    for agent in ["ryw", "rep", "secret"]:  # the memory tools need Memory bound
        await svc.accounts.configure_agent("acme", agent, memory=True)
    svc.positions = Positions()
    svc.settings = saved.model_copy(update={"read_your_writes_timeout_s": 0.3})
    svc.replays = ReplayHub(
        state=ReplayStateStore(api_stack.pool),
        sinks={"messages": MessagesSink(store, db)},
        bootstrap="",
        topics=Topics(),
        journal=api_stack.journal,
    )
    yield api_stack
    svc.settings = saved
    svc.positions = None
    svc.replays = None


async def test_search_after_waits_for_its_thread_then_answers(api: ApiStack) -> None:
    c, h = api.client, api.headers()
    r = await c.post(
        "/v1/agents/ryw/threads/t1/messages",
        json={"messages": [{"role": "user", "content": "puffin sighting"}]},
        headers=h,
    )
    assert r.status_code == 201
    position = r.json()["position"]
    assert isinstance(position, int) and position > 0

    body = {"query": "puffin", "after": position, "summarize": False}
    r = await c.post("/v1/agents/ryw/journal/search", json=body, headers=h)
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "not_ready"
    assert r.json()["error"]["position"] == 0

    marks = api.services.positions
    assert marks is not None
    marks.messages.advance(thread_position_key("acme", "ryw", "t1"), position - 1)
    r = await c.post("/v1/agents/ryw/journal/search", json=body, headers=h)
    assert r.status_code == 409 and r.json()["error"]["position"] == position - 1

    marks.messages.advance(thread_position_key("acme", "ryw", "t1"), position)
    r = await c.post("/v1/agents/ryw/journal/search", json=body, headers=h)
    assert r.status_code == 200, r.text
    # without "after" nothing is awaited
    r = await c.post("/v1/agents/ryw/journal/search", json={"query": "x"}, headers=h)
    assert r.status_code == 200


@pytest.mark.parametrize("after", ["7", -1, True, 1.5])
async def test_bad_after_names_the_field(api: ApiStack, after: object) -> None:
    r = await api.client.post(
        "/v1/agents/ryw/journal/search",
        json={"query": "puffin", "after": after},
        headers=api.headers(),
    )
    assert r.status_code == 400
    assert r.json()["error"]["field"] == "after"


async def test_after_of_another_agent_or_past_the_end_is_rejected(api: ApiStack) -> None:
    c, h = api.client, api.headers()
    r = await c.post(
        "/v1/agents/secret/threads/t/messages", json={"role": "user", "content": "x"}, headers=h
    )
    theirs = r.json()["position"]
    for after in (theirs, theirs + 10_000):
        r = await c.post(
            "/v1/agents/ryw/journal/search", json={"query": "x", "after": after}, headers=h
        )
        assert r.status_code == 400, after
        assert r.json()["error"]["field"] == "after"


async def test_recall_after_waits_for_the_memory_index(api: ApiStack) -> None:
    c, h = api.client, api.headers()
    r = await c.post(
        "/v1/agents/ryw/memory/store",
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
    assert isinstance(position, int) and position > 0
    body = {"query": "tea", "after": position}
    r = await c.post("/v1/agents/ryw/memory/recall", json=body, headers=h)
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_ready"
    marks = api.services.positions
    assert marks is not None
    marks.memory.advance(memory_position_key("acme", "ryw"), position)
    r = await c.post("/v1/agents/ryw/memory/recall", json=body, headers=h)
    assert r.status_code == 200
    assert [e["key"] for e in r.json()["results"]] == ["drink"]


async def test_admin_replay_from_the_journal_streams_progress_and_rebuilds(api: ApiStack) -> None:
    c, h = api.client, api.headers()
    await c.post(
        "/v1/agents/rep/threads/a/messages",
        json={"messages": [{"role": "user", "content": f"walrus {i}"} for i in range(25)]},
        headers=h,
    )
    r = await c.post("/admin/replay/messages", params={"from_journal": "true"})
    assert r.status_code == 401  # the admin token is required
    r = await c.post("/admin/replay/nope", headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["field"] == "projection"
    r = await c.post("/admin/replay/memory", params={"from_journal": "true"}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["field"] == "from_journal"

    r = await c.post("/admin/replay/messages", params={"from_journal": "true"}, headers=ADMIN)
    assert r.status_code == 200
    lines = [orjson.loads(x) for x in r.text.splitlines()]
    assert lines[0]["type"] == "start" and lines[-1]["type"] == "report"
    report = lines[-1]
    assert report["source"] == "journal" and report["generation"] == 2
    assert report["events_read"] >= 25 and report["rows_written"] >= 25
    r = await c.post(
        "/v1/agents/rep/journal/search",
        json={"query": "walrus", "limit": 50, "summarize": False},
        headers=h,
    )
    assert len(r.json()["results"]) == 25
    r = await c.get("/admin/replay", headers=ADMIN)
    assert r.json() == {"messages": 2}


async def test_the_python_client_passes_after_and_explain(api: ApiStack) -> None:
    """``MemstreamClient.journal_search`` / ``memory_recall`` send ``after`` (and search
    ``explain``), as README's read-your-writes describes."""
    sent: list[dict[str, object]] = []

    async def record(request: httpx.Request) -> None:
        if request.url.path.endswith("/journal/search"):
            sent.append(orjson.loads(request.content))

    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(api.services)),
        base_url="http://memstream.test",
        event_hooks={"request": [record]},
    )
    ms = MemstreamClient("http://memstream.test", api.key, http=http)
    appended = await ms.append("ryw", "t-client", {"role": "user", "content": "gannet colony"})
    position = appended["position"]
    with pytest.raises(errors.NotReady):
        await ms.journal_search("ryw", "gannet", summarize=False, after=position)
    marks = api.services.positions
    assert marks is not None
    marks.messages.advance(thread_position_key("acme", "ryw", "t-client"), position)
    found = await ms.journal_search(
        "ryw", "gannet", thread_id="t-client", summarize=False, explain=True, after=position
    )
    assert found["results"] == []  # the test projects nothing: only the mark advanced
    assert sent[-1] == {
        "query": "gannet",
        "thread_id": "t-client",
        "summarize": False,
        "explain": True,
        "after": position,
    }
    await ms.journal_search("ryw", "gannet")
    assert sent[-1] == {"query": "gannet"}  # nothing is sent that was not given

    stored = await ms.memory_store("ryw", "bird", "Watches gannets", "project_fact", "shared")
    with pytest.raises(errors.NotReady):
        await ms.memory_recall("ryw", "gannets", after=stored["position"])
    marks.memory.advance(memory_position_key("acme", "ryw"), stored["position"])
    recalled = await ms.memory_recall("ryw", "gannets", after=stored["position"])
    assert "bird" in [e["key"] for e in recalled["results"]]
    await http.aclose()
