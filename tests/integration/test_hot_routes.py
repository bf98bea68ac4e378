"""The append and context routes answer the same through ``HotRoutes`` (pure ASGI) as
through FastAPI alone: successes, every refusal (status, code and field), the request id
and the metrics' route label. Real Postgres, SlateDB journal, Valkey and object store."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.memory.store import MemoryService
from memstream.infra.metrics import Metrics
from memstream.infra.summary_store import SummaryStore
from memstream.schemas.limits import MAX_REQUEST_BYTES
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")

_ids = itertools.count(1)
Clients = tuple[httpx.AsyncClient, httpx.AsyncClient]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def both(
    api_stack: ApiStack, redis_client: aioredis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Clients]:
    """(the app as served, with HotRoutes; the same app with FastAPI alone)."""
    svc = api_stack.services
    folder: Path = tmp_path_factory.mktemp("objects")
    svc.memory = MemoryService(api_stack.pool, api_stack.clock, binding=svc.accounts)
    svc.summary_store = SummaryStore(LocalStore(prefix=folder, mkdir=True), redis_client)
    svc.metrics = Metrics()
    plain = create_app(svc, hot_routes=False)
    transport = httpx.ASGITransport(app=plain)
    async with httpx.AsyncClient(transport=transport, base_url="http://memstream.test") as c:
        yield api_stack.client, c
    svc.memory = None
    svc.summary_store = None
    svc.metrics = None


async def same(both: Clients, method: str, url: str, **kw: object) -> list[httpx.Response]:
    out = [await c.request(method, url, **kw) for c in both]  # type: ignore[arg-type]  # httpx's keywords, as each test gives them
    hot, plain = out
    assert hot.status_code == plain.status_code, (url, hot.text, plain.text)
    assert hot.headers.get("content-type") == plain.headers.get("content-type")
    if hot.status_code >= 400:
        assert hot.json() == plain.json(), url
    return out


def messages(thread: str) -> str:
    return f"/v1/agents/bot/threads/{thread}/messages"


async def test_an_append_answers_alike(both: Clients, api_stack: ApiStack) -> None:
    h = api_stack.headers(user="alice")
    answers = []
    for client in both:  # each on a thread of its own: offsets start at 0 for both
        r = await client.post(
            messages(f"a{next(_ids)}"),
            json={
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "yo"},
                ]
            },
            headers=h,
        )
        assert r.status_code == 201, r.text
        assert r.headers["x-request-id"]
        answers.append(r.json())
    hot, plain = answers
    assert (
        [a["offset"] for a in hot["appended"]] == [a["offset"] for a in plain["appended"]] == [0, 1]
    )
    assert isinstance(hot["position"], int) and isinstance(plain["position"], int)


async def test_append_refusals_answer_alike(both: Clients, api_stack: ApiStack) -> None:
    alice, bob = api_stack.headers(user="alice"), api_stack.headers(user="bob")
    owned = f"own{next(_ids)}"
    r = await both[1].post(messages(owned), json={"role": "user", "content": "mine"}, headers=alice)
    assert r.status_code == 201
    ok = {"role": "user", "content": "x"}
    cases: list[tuple[str, dict[str, object]]] = [
        (messages("t"), {"json": ok}),  # no key
        (messages("t"), {"json": ok, "headers": {"Authorization": "Bearer nope"}}),
        (messages("t"), {"json": ok, "headers": {"Authorization": "Basic x"}}),
        (messages("t"), {"content": b"{not json", "headers": alice}),
        (messages("t"), {"json": {"role": "robot", "content": "x"}, "headers": alice}),
        (messages("t"), {"json": {"messages": []}, "headers": alice}),
        (messages("t"), {"json": [1, 2], "headers": alice}),
        (messages("t"), {"json": {"role": "user", "content": "a\x00b"}, "headers": alice}),
        (messages(owned), {"json": ok, "headers": bob}),  # someone else's thread
        (messages(owned), {"json": ok, "headers": api_stack.headers()}),  # no user
        ("/v1/agents/b%20ot/threads/t/messages", {"json": ok, "headers": alice}),
        (messages("t%20x"), {"json": ok, "headers": alice}),
        (messages("t") + "/", {"json": ok, "headers": alice}),
        (
            messages("t"),
            {"json": ok, "headers": {**alice, "X-Memstream-User-Token": "mst_bogus"}},
        ),
        (
            messages("t"),
            {
                "content": b"x" * 10,
                "headers": {**alice, "Content-Length": str(MAX_REQUEST_BYTES + 1)},
            },
        ),
    ]
    for url, kw in cases:
        hot, _ = await same(both, "POST", url, **kw)
        if url == messages(owned):
            assert hot.status_code == 404
        elif hot.status_code >= 400 and hot.status_code != 404:
            assert hot.json()["error"].get("field") or hot.status_code == 405, (url, hot.text)


async def test_a_context_answers_alike(both: Clients, api_stack: ApiStack) -> None:
    h = api_stack.headers(user="alice")
    thread = f"c{next(_ids)}"
    for i in range(3):
        r = await both[1].post(
            messages(thread), json={"role": "user", "content": f"m{i}"}, headers=h
        )
        assert r.status_code == 201
    url = f"/v1/agents/bot/threads/{thread}/context"
    for params in ({}, {"format": "anthropic"}):
        hot, plain = await same(both, "GET", url, params=params, headers=h)
        assert hot.status_code == 200 and hot.json() == plain.json()
        assert "m2" in str(hot.json()["messages"][-1]["content"])
    for params in (
        {"format": "xml"},
        {"parent_thread_id": "nope"},
        {"parent_thread_id": thread},
        {"parent_agent_id": "other"},
    ):
        hot, _ = await same(both, "GET", url, params=params, headers=h)
        assert hot.status_code in (400, 404) and hot.json()["error"]["field"], hot.text
    hot, _ = await same(both, "GET", url, headers=api_stack.headers(user="bob"))
    assert hot.status_code == 404
    hot, _ = await same(both, "GET", url)
    assert hot.status_code == 401


async def test_metrics_name_the_route_template(both: Clients, api_stack: ApiStack) -> None:
    metrics = api_stack.services.metrics
    assert metrics is not None
    template = "/v1/agents/{agent_id}/threads/{thread_id}/messages"

    def count(status: str) -> float:
        value = metrics.registry.get_sample_value(
            "memstream_http_requests_total",
            {"method": "POST", "route": template, "status": status},
        )
        return value or 0.0

    before = count("201"), count("400")
    h = api_stack.headers(user="alice")
    await both[0].post(messages(f"m{next(_ids)}"), json={"role": "user", "content": "x"}, headers=h)
    await both[0].post(messages("m"), json={"role": "nobody"}, headers=h)
    assert (count("201"), count("400")) == (before[0] + 1, before[1] + 1)


async def test_the_request_id_is_echoed_or_replaced_alike(
    both: Clients, api_stack: ApiStack
) -> None:
    h = api_stack.headers(user="alice")
    body = {"role": "user", "content": "x"}
    for given, echoed in (("req-7", True), ("a\x01b", False), ("r" * 129, False)):
        for client in both:
            r = await client.post(
                messages(f"r{next(_ids)}"), json=body, headers={**h, "X-Request-Id": given}
            )
            assert r.status_code == 201
            rid = r.headers["x-request-id"]
            if echoed:
                assert rid == given
            else:  # an id that cannot be echoed or logged is replaced by a fresh one
                assert rid != given and len(rid) == 32 and int(rid, 16) >= 0
    hot = [
        (await both[0].post(messages(f"r{next(_ids)}"), json=body, headers=h)).headers[
            "x-request-id"
        ]
        for _ in range(2)
    ]
    assert hot[0] != hot[1]


async def test_a_failure_no_handler_claims_is_a_json_500_counted_once(
    api_stack: ApiStack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``ServerErrorMiddleware`` does for FastAPI, the hot path does for itself: the
    app's 500 answer (JSON, logged), then the exception on to the server."""
    svc = api_stack.services
    svc.metrics = Metrics()
    template = "/v1/agents/{agent_id}/threads/{thread_id}/messages"

    def count500() -> float:
        assert svc.metrics is not None
        value = svc.metrics.registry.get_sample_value(
            "memstream_http_requests_total", {"method": "POST", "route": template, "status": "500"}
        )
        return value or 0.0

    async def broken(*_: object) -> None:
        raise RuntimeError("the disk caught fire")

    monkeypatch.setattr(svc.threads, "open", broken)
    h = api_stack.headers(user="alice")
    try:
        answers = []
        for hot in (True, False):
            app = create_app(svc, hot_routes=hot)
            quiet = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=quiet, base_url="http://t") as c:
                before = count500()
                caplog.clear()
                r = await c.post(messages("fire"), json={"role": "user", "content": "x"}, headers=h)
                assert count500() == before + 1
                assert [rec for rec in caplog.records if "failed" in rec.getMessage()]
                answers.append(r)
            loud = httpx.ASGITransport(app=app)  # the server sees the exception, as before
            async with httpx.AsyncClient(transport=loud, base_url="http://t") as c:
                with pytest.raises(RuntimeError, match="caught fire"):
                    await c.post(messages("fire"), json={"role": "user", "content": "x"}, headers=h)
        hot_r, plain_r = answers
        assert hot_r.status_code == plain_r.status_code == 500
        assert (
            hot_r.json()
            == plain_r.json()
            == {"error": {"code": "internal", "message": "internal error"}}
        )
        assert hot_r.headers["content-type"] == plain_r.headers["content-type"]
        assert len(hot_r.headers["x-request-id"]) == 32  # the 500 carries the request id too
    finally:
        svc.metrics = None
