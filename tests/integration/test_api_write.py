"""The HTTP write path over real Postgres and a real SlateDB journal: auth, agents,
threads, appends, validation naming the field, and nothing half-written."""

from __future__ import annotations

import orjson
import pytest

from memstream.schemas.records import ThreadRef
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_auth_required_and_checked(api_stack: ApiStack) -> None:
    c = api_stack.client
    r = await c.post("/v1/agents/a/threads", json={})
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "unauthorized"
    r = await c.post("/v1/agents/a/threads", json={}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["field"] == "Authorization"


async def test_configure_agent(api_stack: ApiStack) -> None:
    c, h = api_stack.client, api_stack.headers()
    r = await c.put("/v1/agents/bot", json={"memory": True}, headers=h)
    assert r.status_code == 200 and r.json() == {"agent_id": "bot", "memory": True}
    r = await c.put("/v1/agents/bot", json={"memory": "yes"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["field"] == "memory"


async def test_create_thread_and_append(api_stack: ApiStack) -> None:
    c, h = api_stack.client, api_stack.headers(user="alice")
    r = await c.post(
        "/v1/agents/bot/threads",
        json={"thread_id": "t1", "metadata": {"config": {"max_working_memory_messages": 5}}},
        headers=h,
    )
    assert r.status_code == 201
    assert r.json() == {
        "thread_id": "t1",
        "metadata": {"config": {"max_working_memory_messages": 5}},
        "shared": False,
    }
    r = await c.post(
        "/v1/agents/bot/threads/t1/messages", json={"role": "user", "content": "hi"}, headers=h
    )
    assert r.status_code == 201
    assert r.json()["appended"][0]["offset"] == 0
    r = await c.post(
        "/v1/agents/bot/threads/t1/messages",
        json={
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c1", "name": "search", "arguments": "{}"}],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "result"},
                {"role": "assistant", "content": "done", "reasoning": "thought"},
            ]
        },
        headers=h,
    )
    assert r.status_code == 201
    assert [a["offset"] for a in r.json()["appended"]] == [1, 2, 3]
    msgs = await api_stack.journal.last(ThreadRef("acme", "bot", "t1"), 20)
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[0].user_id == "alice" and msgs[3].reasoning == "thought"
    rec = await api_stack.journal.tool_call("acme", "bot", "c1", "t1")
    assert rec is not None and rec.name == "search" and rec.result == "result"


async def test_implicit_thread_and_agent(api_stack: ApiStack) -> None:
    c, h = api_stack.client, api_stack.headers()
    r = await c.post(
        "/v1/agents/newbot/threads/fresh/messages", json={"role": "user", "content": "x"}, headers=h
    )
    assert r.status_code == 201
    thread = await api_stack.services.accounts.get_thread(ThreadRef("acme", "newbot", "fresh"))
    assert thread is not None and not thread.deleted


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "wizard", "content": "x"}, "role"),
        ({"role": "user", "content": ""}, "content"),
        ({"role": "user", "content": 5}, "content"),
        ({"role": "assistant", "content": "", "tool_calls": [{"name": "x"}]}, "tool_calls[0].id"),
        ({"role": "assistant", "content": "", "tool_calls": "nope"}, "tool_calls"),
        ({"role": "tool", "content": "r"}, "tool_call_id"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "tool_call_id"),
        ({"messages": []}, "messages"),
        (
            {"messages": [{"role": "user", "content": "ok"}, {"role": "user"}]},
            "messages[1].content",
        ),
        ([1, 2], "body"),
    ],
)
async def test_bad_append_names_field_and_writes_nothing(
    api_stack: ApiStack, body: object, field: str
) -> None:
    c, h = api_stack.client, api_stack.headers()
    ref = ThreadRef("acme", "valid", "tv")
    before = await api_stack.journal.next_offset(ref)
    r = await c.post("/v1/agents/valid/threads/tv/messages", json=body, headers=h)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["field"] == field
    assert await api_stack.journal.next_offset(ref) == before


async def test_not_json_and_oversize(api_stack: ApiStack) -> None:
    c, h = api_stack.client, api_stack.headers()
    r = await c.post("/v1/agents/v/threads/t/messages", content=b"{nope", headers=h)
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"
    big = b'{"role":"user","content":"' + b"x" * (9 * 1024 * 1024) + b'"}'
    r = await c.post("/v1/agents/v/threads/t/messages", content=big, headers=h)
    assert r.status_code == 413 and r.json()["error"]["field"] == "body"


async def test_bad_ids_name_the_field(api_stack: ApiStack) -> None:
    c, h = api_stack.client, api_stack.headers()
    r = await c.post("/v1/agents/bot/threads", json={"thread_id": ""}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["field"] == "thread_id"
    r = await c.post(
        "/v1/agents/bot/threads",
        json={"metadata": {"config": {"max_working_memory_messages": -1}}},
        headers=h,
    )
    assert r.json()["error"]["field"] == "metadata.config.max_working_memory_messages"
    r = await c.post("/v1/agents/bot/threads", json={}, headers={**h, "X-Memstream-User": "a/b"})
    assert r.json()["error"]["field"] == "X-Memstream-User"


async def test_accounts_are_isolated(api_stack: ApiStack) -> None:
    c = api_stack.client
    await c.post(
        "/v1/agents/shared-name/threads/t/messages",
        json={"role": "user", "content": "acme secret"},
        headers=api_stack.headers(),
    )
    await c.post(
        "/v1/agents/shared-name/threads/t/messages",
        json={"role": "user", "content": "other"},
        headers=api_stack.headers(key=api_stack.other_key),
    )
    acme = await api_stack.journal.last(ThreadRef("acme", "shared-name", "t"), 10)
    other = await api_stack.journal.last(ThreadRef("other", "shared-name", "t"), 10)
    assert [m.content for m in acme] == ["acme secret"]
    assert [m.content for m in other] == ["other"]


async def test_delete_thread_keeps_journal(api_stack: ApiStack) -> None:
    c, h = api_stack.client, api_stack.headers()
    await c.post(
        "/v1/agents/bot/threads/gone/messages",
        json={"role": "user", "content": "keep me"},
        headers=h,
    )
    r = await c.delete("/v1/agents/bot/threads/gone", headers=h)
    assert r.status_code == 204
    r = await c.delete("/v1/agents/bot/threads/gone", headers=h)
    assert r.status_code == 404
    msgs = await api_stack.journal.last(ThreadRef("acme", "bot", "gone"), 10)
    assert [m.content for m in msgs] == ["keep me"]


async def test_admin_append_needs_token(api_stack: ApiStack) -> None:
    c = api_stack.client
    body = {
        "account_id": "acme",
        "agent_id": "bulk",
        "thread_id": "t",
        "messages": [{"role": "user", "content": "a"}],
    }
    r = await c.post("/admin/append", json=body)
    assert r.status_code == 401
    r = await c.post(
        "/admin/append", json=body, headers={"X-Memstream-Admin-Token": "admin-secret"}
    )
    assert r.status_code == 200 and r.json()["appended"][0]["offset"] == 0
    # an unknown account is refused, and not created
    r = await c.post(
        "/admin/append",
        json=body | {"account_id": "nobody"},
        headers={"X-Memstream-Admin-Token": "admin-secret"},
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "account_id"
    assert not await api_stack.services.accounts.account_exists("nobody")


async def test_the_operator_append_never_puts_a_users_messages_in_another_users_thread(
    api_stack: ApiStack,
) -> None:
    """``memstream produce`` used to append gina's line to frank's thread; search, which
    shows a thread to every user who wrote in it, then gave gina frank's whole thread."""
    c, admin = api_stack.client, {"X-Memstream-Admin-Token": "admin-secret"}
    msg = {"role": "user", "content": "frank's private plan"}
    r = await c.post(
        "/v1/agents/ops/threads/f1/messages", json=msg, headers=api_stack.headers(user="frank")
    )
    assert r.status_code == 201
    body = {"account_id": "acme", "agent_id": "ops", "thread_id": "f1"}
    line = {"messages": [{"role": "user", "content": "gina's line"}]}
    r = await c.post("/admin/append", json=body | line | {"user_id": "gina"}, headers=admin)
    assert r.status_code == 409 and r.json()["error"]["field"] == "user_id", r.text
    msgs = await api_stack.journal.last(ThreadRef("acme", "ops", "f1"), 10)
    assert [m.content for m in msgs] == ["frank's private plan"]  # nothing appended
    for user in ("frank", None):  # the owner's own lines, and lines with no user, still go in
        extra = {"user_id": user} if user else {}
        r = await c.post("/admin/append", json=body | line | extra, headers=admin)
        assert r.status_code == 200, r.text
    assert len(await api_stack.journal.last(ThreadRef("acme", "ops", "f1"), 10)) == 3


async def test_healthz(api_stack: ApiStack) -> None:
    r = await api_stack.client.get("/healthz")
    assert r.status_code == 200


async def test_hostile_ids_are_refused_with_400_naming_the_field(
    api_stack: ApiStack,
) -> None:
    """Issue 12, defect 5: such ids used to be accepted and break the thread for good."""
    c, h = api_stack.client, api_stack.headers()
    for hostile, field in (
        ("%2E%2E", "thread_id"),
        ("%2E", "thread_id"),
        ("%C3%A9" * 65, "thread_id"),
        ("%F0%9F%98%80" * 33, "thread_id"),
        # invalid UTF-8 decodes to U+FFFD: %FE and %FF would have been one thread
        ("inv%FEid", "thread_id"),
        ("inv%FFid", "thread_id"),
        ("%C0%AF", "thread_id"),
    ):
        r = await c.post(
            f"/v1/agents/bot/threads/{hostile}/messages",
            json={"role": "user", "content": "hi"},
            headers=h,
        )
        assert r.status_code == 400, (hostile, r.status_code, r.text)
        assert r.json()["error"]["field"] == field, r.text
    r = await c.post("/v1/agents/bot/threads", json={"thread_id": ".."}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["field"] == "thread_id"
    r = await c.get("/v1/agents/%FF/threads/t/context", headers=h)
    assert r.status_code == 400 and r.json()["error"]["field"] == "agent_id", r.text


async def test_an_integer_beyond_64_bits_is_refused_not_rounded(api_stack: ApiStack) -> None:
    """orjson reads such an integer as a float: 123456789012345678901 was stored as
    1.2345678901234568e+20 without a word. Now 400 naming where it is; a 19-digit number
    in range, and long digit runs inside strings, are kept exactly."""
    c, h = api_stack.client, api_stack.headers()
    call = {"id": "c1", "name": "pay", "arguments": {"account": 123456789012345678901}}
    body = b'{"messages": [{"role": "assistant", "content": "", "tool_calls": [%s]}]}'
    wide = orjson.dumps(call | {"arguments": {"account": 0}}).replace(
        b'"account":0', b'"account":123456789012345678901'
    )
    r = await c.post(
        "/v1/agents/bot/threads/wide/messages",
        content=body % wide,
        headers=h | {"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["field"] == "messages[0].tool_calls[0].arguments.account"
    assert await api_stack.journal.last(ThreadRef("acme", "bot", "wide"), 5) == []
    kept = {"account": 9223372036854775807, "iban": "12345678901234567890123"}
    r = await c.post(
        "/v1/agents/bot/threads/wide/messages",
        json={"role": "assistant", "content": "", "tool_calls": [call | {"arguments": kept}]},
        headers=h,
    )
    assert r.status_code == 201, r.text
    (stored,) = await api_stack.journal.last(ThreadRef("acme", "bot", "wide"), 5)
    assert stored.tool_calls[0].arguments == kept


async def test_create_tells_new_from_existing_and_never_makes_a_shared_thread_a_users(
    api_stack: ApiStack,
) -> None:
    """``POST .../threads`` answers 201 for a new thread and 200 for an existing one, and
    says whether the thread is shared. A user asking for an id that a caller without a user
    opened first (a race an app can lose) used to get 201 and a thread every user of the
    agent reads; now 409 naming ``thread_id``, and nothing changes."""
    c = api_stack.client
    alice, bob, anon = (api_stack.headers(user=u) for u in ("alice", "bob", None))
    body = {"thread_id": "mine", "metadata": {"config": {"max_working_memory_messages": 7}}}
    r = await c.post("/v1/agents/own/threads", json=body, headers=alice)
    assert r.status_code == 201 and r.json()["shared"] is False
    r = await c.post("/v1/agents/own/threads", json=body, headers=alice)
    assert r.status_code == 200 and r.json()["shared"] is False  # idempotent, not "created"
    r = await c.post("/v1/agents/own/threads", json=body, headers=bob)
    assert r.status_code == 404  # alice's: as for no thread

    msg = {"role": "user", "content": "posted with no user"}
    r = await c.post("/v1/agents/own/threads/early/messages", json=msg, headers=anon)
    assert r.status_code == 201
    claim = {"thread_id": "early", "metadata": {"config": {"max_working_memory_messages": 3}}}
    r = await c.post("/v1/agents/own/threads", json=claim, headers=alice)
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["field"] == "thread_id" and "shared" in err["message"]
    thread = await api_stack.services.accounts.get_thread(ThreadRef("acme", "own", "early"))
    assert thread is not None and thread.owner is None  # unchanged: still shared
    assert thread.config.window() != 3
    r = await c.post("/v1/agents/own/threads", json=claim, headers=anon)
    assert r.status_code == 200 and r.json()["shared"] is True
