"""Trust on every thread route and on the memory tools, through the Python client over the
in-process app (real Postgres, SlateDB, Valkey, obstore):

- a thread opened by a user is that user's alone: for another user and for a caller with
  no user, context, summary, append, delete, create, the tool-call view and sub-agent
  delegation all answer 404 ``not_found`` revealing nothing, and change nothing;
- a thread opened without a user is shared by the agent;
- a deleted thread is 404 on append too (nothing is appended), ``POST .../threads`` revives
  it with its config;
- tool calls are keyed by thread: two threads reusing ``call_0`` keep their own records,
  an ambiguous id is 400 naming ``thread_id``, and the privacy decision needs no
  projection (none runs here: it is "lagging" forever);
- the memory tools need Memory bound (403 ``memory_not_bound``, a typed client error,
  nothing written); pinned facts still load without it.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx.memory.store import MemoryService
from memstream.client import MemstreamClient
from memstream.errors import Forbidden, InvalidRequest, MemoryNotBound, NotFound
from memstream.infra.summary_store import SummaryStore
from memstream.schemas.records import Summary, ThreadRef
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")

_ids = itertools.count(1)


def fresh(prefix: str) -> str:
    return f"{prefix}{next(_ids)}"


@dataclass
class Users:
    stack: ApiStack
    alice: MemstreamClient
    bob: MemstreamClient
    anon: MemstreamClient


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def users(
    api_stack: ApiStack, redis_client: aioredis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Users]:
    s = api_stack
    svc = s.services
    svc.memory = MemoryService(s.pool, s.clock, binding=svc.accounts)
    svc.summary_store = SummaryStore(
        LocalStore(prefix=tmp_path_factory.mktemp("objects"), mkdir=True), redis_client
    )

    def client(user: str | None) -> MemstreamClient:
        return MemstreamClient("http://memstream.test", s.key, user, http=s.client)

    yield Users(s, client("alice"), client("bob"), client(None))
    svc.memory = svc.summary_store = None


SECRET = "alice's bank PIN hint is 'turquoise'"


async def alices_thread(u: Users, agent: str, thread: str, call: str = "call_0") -> None:
    await u.alice.create_thread(agent, thread, max_working_memory_messages=10)
    await u.alice.append(
        agent,
        thread,
        [
            {"role": "user", "content": SECRET},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call, "name": "vault", "arguments": {"q": "pin"}}],
            },
            {"role": "tool", "tool_call_id": call, "content": "vault says: " + SECRET},
        ],
    )
    assert u.stack.services.summary_store is not None
    await u.stack.services.summary_store.write(
        ThreadRef("acme", agent, thread),
        Summary(1, u.stack.clock.now(), 2, "m2", "summary: " + SECRET, 10, 3),
        0,
    )


async def test_someone_elses_thread_is_not_found_on_every_route(users: Users) -> None:
    agent, thread = fresh("own"), "t"
    await alices_thread(users, agent, thread)
    before = await users.stack.journal.last(ThreadRef("acme", agent, thread), 100)
    for c in (users.bob, users.anon):
        refusals = {
            "context": c.context(agent, thread),
            "context with a recap": c.context(agent, thread, recap=True),
            "append": c.append(agent, thread, {"role": "user", "content": "let me in"}),
            "delete": c.delete_thread(agent, thread),
            "create": c.create_thread(agent, thread, max_working_memory_messages=3),
            "tool call": c.tool_call_view(agent, "call_0"),
            "tool call by thread": c.tool_call_view(agent, "call_0", thread_id=thread),
            "delegation": c.context(agent, "sub", parent_thread_id=thread),
        }
        for route, call in refusals.items():
            with pytest.raises(NotFound) as e:
                await call
            assert "turquoise" not in str(e.value), route
            assert e.value.code == "not_found", route
        assert await c.summary(agent, thread) is None  # the client's "no summary yet"
        headers = users.stack.headers(user=None if c is users.anon else "bob")
        r = await users.stack.client.get(
            f"/v1/agents/{agent}/threads/{thread}/summary", headers=headers
        )
        assert r.status_code == 404 and "turquoise" not in r.text
    # nothing was appended, deleted or reconfigured
    assert await users.stack.journal.last(ThreadRef("acme", agent, thread), 100) == before
    ctx = await users.alice.context(agent, thread)
    assert ctx["window"] == 10 and SECRET in str(ctx["messages"])
    assert "recap" in await users.alice.context(agent, thread, recap=True)
    assert (await users.alice.summary(agent, thread)) is not None
    assert (await users.alice.tool_call_view(agent, "call_0"))["name"] == "vault"
    sub = await users.alice.context(agent, "sub", parent_thread_id=thread)
    assert sub["summary"] is None  # alice may delegate from her own thread


async def test_someone_elses_thread_answers_exactly_as_no_thread(users: Users) -> None:
    """On every route where a thread that never existed is an error, alice's private thread
    and a deleted thread answer bob and an anonymous caller the very same body (status,
    code, message with the id substituted, field): nothing tells them apart."""
    agent = fresh("parity")
    await alices_thread(users, agent, "a-priv")
    await alices_thread(users, agent, "a-gone")
    await users.alice.delete_thread(agent, "a-gone")
    base = f"/v1/agents/{agent}"
    routes: dict[str, tuple[str, str, dict[str, str]]] = {
        "summary": ("GET", f"{base}/threads/{{t}}/summary", {}),
        "delete": ("DELETE", f"{base}/threads/{{t}}", {}),
        "tool call by thread": ("GET", f"{base}/journal/tool-calls/call_0", {"thread_id": "{t}"}),
        "delegation": ("GET", f"{base}/threads/sub/context", {"parent_thread_id": "{t}"}),
    }

    async def answer(route: str, thread: str, user: str | None) -> tuple[int, str]:
        method, url, params = routes[route]
        r = await users.stack.client.request(
            method,
            url.format(t=thread),
            params={k: v.format(t=thread) for k, v in params.items()},
            headers=users.stack.headers(user=user),
        )
        return r.status_code, r.text.replace(thread, "never-was")

    for user in ("bob", None):
        for route in routes:
            never = await answer(route, "never-was", user)
            assert never[0] == 404 and '"not_found"' in never[1], (route, never)
            for thread in ("a-priv", "a-gone"):
                assert await answer(route, thread, user) == never, (route, thread, user)
    # alice still gets her data (and was not deleted by any of the above)
    assert (await users.alice.summary(agent, "a-priv")) is not None
    assert (await users.alice.tool_call_view(agent, "call_0", thread_id="a-priv"))[
        "name"
    ] == "vault"
    assert (await users.alice.context(agent, "sub", parent_thread_id="a-priv"))["summary"] is None


async def test_a_thread_opened_without_a_user_is_shared(users: Users) -> None:
    agent, thread = fresh("shared"), "t"
    await users.anon.append(agent, thread, {"role": "user", "content": "team standup notes"})
    for c in (users.alice, users.bob, users.anon):
        ctx = await c.context(agent, thread)
        assert "standup" in str(ctx["messages"])
    await users.bob.append(agent, thread, {"role": "user", "content": "bob was here"})
    assert "bob was here" in str((await users.alice.context(agent, thread))["messages"])
    # no user may take the shared thread from the others; the agent's own call may
    with pytest.raises(Forbidden) as refused:
        await users.alice.delete_thread(agent, thread)
    assert refused.value.field == "thread_id"
    assert "bob was here" in str((await users.bob.context(agent, thread))["messages"])
    await users.anon.delete_thread(agent, thread)
    with pytest.raises(NotFound):
        await users.bob.context(agent, thread)


async def test_the_first_user_to_open_a_thread_owns_it(users: Users) -> None:
    """Two users race for a new thread id: exactly one owns it, the other is refused."""
    import asyncio

    agent, thread = fresh("race"), "t"
    results = await asyncio.gather(
        users.alice.append(agent, thread, {"role": "user", "content": "alice first"}),
        users.bob.append(agent, thread, {"role": "user", "content": "bob first"}),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, NotFound)]
    assert len(refused) == 1
    owner = users.bob if results[0] is refused[0] else users.alice
    other = users.alice if owner is users.bob else users.bob
    msgs = (await owner.context(agent, thread))["messages"]
    assert isinstance(msgs, list) and len(msgs) == 1  # the refused append wrote nothing
    with pytest.raises(NotFound):
        await other.context(agent, thread)


async def test_appending_to_a_deleted_thread_is_not_found(users: Users) -> None:
    agent, thread = fresh("deleted"), "t"
    await users.alice.create_thread(agent, thread, max_working_memory_messages=4)
    await users.alice.append(agent, thread, {"role": "user", "content": "hello"})
    await users.alice.delete_thread(agent, thread)
    ref = ThreadRef("acme", agent, thread)
    with pytest.raises(NotFound) as e:
        await users.alice.append(agent, thread, {"role": "user", "content": "again"})
    assert e.value.field == "thread_id"
    assert len(await users.stack.journal.last(ref, 10)) == 1  # nothing appended
    assert await users.alice.summary(agent, thread) is None
    # revived explicitly by its owner, with the config it is given
    revived = await users.alice.create_thread(agent, thread, max_working_memory_messages=6)
    assert revived["metadata"]["config"] == {"max_working_memory_messages": 6}
    await users.alice.append(agent, thread, {"role": "user", "content": "again"})
    assert (await users.alice.context(agent, thread))["window"] == 6


async def test_two_threads_reusing_a_tool_call_id(users: Users) -> None:
    agent = fresh("calls")
    await alices_thread(users, agent, "alice-1")
    await users.bob.append(
        agent,
        "bob-1",
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "call_0", "name": "weather", "arguments": {}}],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
        ],
    )
    # each user resolves the id among the threads they may read: their own
    mine = await users.alice.tool_call_view(agent, "call_0")
    assert mine["name"] == "vault" and "turquoise" in mine["data"]
    his = await users.bob.tool_call_view(agent, "call_0")
    assert his["name"] == "weather" and "turquoise" not in his["data"]
    with pytest.raises(NotFound):  # both threads are private
        await users.anon.tool_call_view(agent, "call_0")
    with pytest.raises(NotFound):
        await users.bob.tool_call_view(agent, "call_0", thread_id="alice-1")
    # the same id in two of alice's threads: ambiguous without thread_id
    await alices_thread(users, agent, "alice-2")
    with pytest.raises(InvalidRequest) as e:
        await users.alice.tool_call_view(agent, "call_0")
    assert e.value.field == "thread_id" and e.value.code == "invalid_request"
    chosen = await users.alice.tool_call_view(agent, "call_0", thread_id="alice-2")
    assert chosen["name"] == "vault"
    his_again = await users.bob.tool_call_view(agent, "call_0")  # bob is not confused
    assert his_again["name"] == "weather"


async def test_tool_call_privacy_needs_no_projection(users: Users) -> None:
    """No message projector runs in this stack (it lags forever): the owner comes from
    Postgres, so another user is refused from the first moment."""
    assert users.stack.services.message_store is None
    agent = fresh("lag")
    await alices_thread(users, agent, "t", call="fresh-call")
    with pytest.raises(NotFound):
        await users.bob.tool_call_view(agent, "fresh-call")
    assert (await users.alice.tool_call_view(agent, "fresh-call"))["name"] == "vault"


async def test_memory_tools_need_memory_bound(users: Users) -> None:
    agent = fresh("unbound")
    pool = users.stack.pool

    async def rows() -> int:
        n = await pool.fetchval(
            "SELECT count(*) FROM memory_entries WHERE account_id = 'acme' AND agent_id = $1",
            agent,
        )
        return int(n)

    refusals = (
        users.alice.memory_store(agent, "k", "likes tea", "user_profile", "shared", 0.9),
        users.alice.memory_recall(agent, "tea"),
        users.alice.memory_forget(agent, "k"),
        users.anon.memory_store(agent, "k", "likes tea", "project_fact", "shared"),
    )
    for call in refusals:
        with pytest.raises(MemoryNotBound) as e:
            await call
        assert e.value.code == "memory_not_bound" and e.value.status == 403
    assert await rows() == 0  # nothing written
    r = await users.stack.client.post(
        f"/v1/agents/{agent}/memory/store",
        json={"key": "k", "content": "x", "category": "observation", "scope": "shared"},
        headers=users.stack.headers(),
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "memory_not_bound"
    # bound: the tools work; unbound again: refused at once, and pinned facts still load
    await users.alice.configure_agent(agent, memory=True)
    await users.alice.memory_store(agent, "k", "likes tea", "user_profile", "shared", 0.9)
    await users.alice.configure_agent(agent, memory=False)
    with pytest.raises(MemoryNotBound):
        await users.alice.memory_recall(agent, "tea")
    ctx = await users.bob.context(agent, "any")
    assert [e["key"] for e in ctx["pinned"]] == ["k"]
    assert await rows() == 1
