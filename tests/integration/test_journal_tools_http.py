"""The journal tools over HTTP, end to end: appends go into the real journal, the message
projection is fed from the journal's messages, and the tool-call view reads the journal."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from memstream.projections.messages import MessageStore
from memstream.projections.messages.rows import row_of_message
from memstream.schemas.records import ThreadRef
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")


def big_result(n_bytes: int, seed: int = 7) -> str:
    """~n_bytes of text mixing 1-, 2-, 3- and 4-byte characters (so page edges hit them)."""
    rnd = random.Random(seed)
    alphabet = ["a", "b", " ", "é", "ß", "€", "中", "😀", "𝄞", '"', "\\", "\n"]
    out: list[str] = []
    size = 0
    while size < n_bytes:
        ch = rnd.choice(alphabet)
        out.append(ch)
        size += len(ch.encode())
    return "".join(out)


async def append(
    stack: ApiStack, agent: str, thread: str, body: object, user: str | None = None
) -> Any:
    r = await stack.client.post(
        f"/v1/agents/{agent}/threads/{thread}/messages", json=body, headers=stack.headers(user)
    )
    assert r.status_code in (200, 201), r.text
    return r.json()


async def project_thread(stack: ApiStack, store: MessageStore, agent: str, thread: str) -> None:
    """Feed the projection from the journal (what the projector does from Kafka)."""
    account = (await stack.services.accounts.authenticate(stack.key)) or ""
    ref = ThreadRef(account, agent, thread)
    msgs = await stack.journal.read_range(ref, 0, await stack.journal.next_offset(ref) - 1)
    await store.write([r for r in map(row_of_message, msgs) if r is not None])


async def test_tool_call_100kb_paged_and_reassembled_byte_exact(
    api_stack: ApiStack, message_store: MessageStore
) -> None:
    api_stack.services.message_store = message_store
    result = big_result(100_000)
    args = {"query": "größe 😀", "n": 3}
    await append(
        api_stack,
        "ag-tools",
        "th1",
        {
            "messages": [
                {"role": "user", "content": "run the big tool"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "call-big", "name": "fetch", "arguments": args}],
                },
                {"role": "tool", "tool_call_id": "call-big", "content": result},
            ]
        },
    )
    expected = orjson.dumps({"name": "fetch", "arguments": args, "result": result})
    assert len(expected) > 100_000

    for length in (None, 1000, 4097):
        pages: list[bytes] = []
        offset: int | None = 0
        while offset is not None:
            q = f"?offset={offset}" + (f"&length={length}" if length else "")
            r = await api_stack.client.get(
                f"/v1/agents/ag-tools/journal/tool-calls/call-big{q}", headers=api_stack.headers()
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert set(body) == {
                "tool_call_id",
                "name",
                "total_bytes",
                "offset",
                "data",
                "next_offset",
            }
            assert body["name"] == "fetch" and body["total_bytes"] == len(expected)
            assert body["offset"] == offset
            chunk = body["data"].encode("utf-8")
            assert len(chunk) <= (length or 32_768)
            pages.append(chunk)
            offset = body["next_offset"]
        assert b"".join(pages) == expected
        assert len(pages) >= len(expected) // (length or 32_768)


async def test_tool_call_errors(api_stack: ApiStack, message_store: MessageStore) -> None:
    api_stack.services.message_store = message_store
    await append(
        api_stack,
        "ag-err",
        "th1",
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "t", "arguments": "€€€"}],
        },
    )
    base = "/v1/agents/ag-err/journal/tool-calls"
    r = await api_stack.client.get(f"{base}/nope", headers=api_stack.headers())
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # another account cannot see it
    r = await api_stack.client.get(f"{base}/c1", headers=api_stack.headers(key=api_stack.other_key))
    assert r.status_code == 404
    for q, field in (("offset=-1", "offset"), ("offset=abc", "offset"), ("length=0", "length")):
        r = await api_stack.client.get(f"{base}/c1?{q}", headers=api_stack.headers())
        assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
    # "arguments":"€€€ -> byte 27 is the first € (3 bytes): 28 is inside it
    doc = orjson.dumps({"name": "t", "arguments": "€€€", "result": None})
    inside = doc.index("€".encode()) + 1
    r = await api_stack.client.get(f"{base}/c1?offset={inside}", headers=api_stack.headers())
    assert r.status_code == 400 and r.json()["error"]["field"] == "offset"


async def test_tool_call_in_private_thread_hidden_from_others(
    api_stack: ApiStack, message_store: MessageStore
) -> None:
    api_stack.services.message_store = message_store
    await append(
        api_stack,
        "ag-priv",
        "th-alice",
        {
            "messages": [
                {"role": "user", "content": "look up my bank balance"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c-bank", "name": "bank", "arguments": {}}],
                },
            ]
        },
        user="alice",
    )
    await project_thread(api_stack, message_store, "ag-priv", "th-alice")
    url = "/v1/agents/ag-priv/journal/tool-calls/c-bank"
    assert (await api_stack.client.get(url, headers=api_stack.headers("alice"))).status_code == 200
    assert (await api_stack.client.get(url, headers=api_stack.headers("bob"))).status_code == 404
    assert (await api_stack.client.get(url, headers=api_stack.headers())).status_code == 404


async def test_search_route(api_stack: ApiStack, message_store: MessageStore) -> None:
    api_stack.services.message_store = message_store
    await append(
        api_stack,
        "ag-search",
        "th1",
        {
            "messages": [
                {"role": "system", "content": "system prompt about penguins"},
                {"role": "user", "content": "Tell me about Emperor penguins"},
                {
                    "role": "assistant",
                    "content": "Emperor penguins breed in winter.",
                    "reasoning": "the user likes penguins, hidden thought",
                },
            ]
        },
    )
    await project_thread(api_stack, message_store, "ag-search", "th1")
    url = "/v1/agents/ag-search/journal/search"
    r = await api_stack.client.post(url, json={"query": "PENGUINS"}, headers=api_stack.headers())
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["role"] for x in body["results"]] == ["assistant", "user"]
    assert all("system prompt" not in x["content"] for x in body["results"])
    assert len(body["summaries"]) == 1 and body["summaries"][0]["thread_id"] == "th1"
    assert body["summaries"][0]["content"]
    r = await api_stack.client.post(
        url, json={"query": "hidden thought", "summarize": False}, headers=api_stack.headers()
    )
    assert r.json() == {"results": [], "summaries": []}
    for body_, field in (
        ({"query": "x", "limit": 51}, "limit"),
        ({"query": ""}, "query"),
        ({"query": "x", "scope": "current_thread"}, "thread_id"),
        ({"query": "x", "summarize": "yes"}, "summarize"),
    ):
        r = await api_stack.client.post(url, json=body_, headers=api_stack.headers())
        assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
    r = await api_stack.client.post(url, content=b"[1]", headers=api_stack.headers())
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"
