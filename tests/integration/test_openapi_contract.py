"""The OpenAPI contract against the real API: every answer a route gives (success and error)
validates against the schema ``/openapi.json`` documents for its status, the document
declares bodies, answers, the bearer scheme and 400 (never FastAPI's 422), and a client
generated from it (openapi-python-client) calls routes successfully."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import orjson
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx.memory.store import MemoryService
from memstream.infra.summary_store import SummaryStore
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")

AGENT = "contract-bot"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(
    api_stack: ApiStack, redis_client: aioredis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ApiStack]:
    svc = api_stack.services
    svc.memory = MemoryService(api_stack.pool, api_stack.clock)
    svc.summary_store = SummaryStore(
        LocalStore(prefix=tmp_path_factory.mktemp("objects"), mkdir=True), redis_client
    )
    yield api_stack
    svc.memory = None
    svc.summary_store = None


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def doc(stack: ApiStack) -> dict[str, Any]:
    r = await stack.client.get("/openapi.json")
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


def operation(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    for template, item in doc["paths"].items():
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in item:
            op: dict[str, Any] = item[method.lower()]
            return op
    raise AssertionError(f"{method} {path} is not in /openapi.json")


def conforms(doc: dict[str, Any], r: httpx.Response) -> None:
    """The answer's status is documented for its route and its body validates."""
    op = operation(doc, r.request.method, r.request.url.path)
    status = str(r.status_code)
    assert status in op["responses"], (
        f"{r.request.method} {r.request.url.path}: {status} undocumented"
    )
    content = op["responses"][status].get("content")
    if r.status_code == 204 or content is None:
        assert not r.content
        return
    schema = dict(content["application/json"]["schema"])
    schema["components"] = doc["components"]
    errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(r.json())]
    assert errors == [], f"{r.request.method} {r.request.url.path} {status}: {errors} in {r.text}"


async def call(
    stack: ApiStack, doc: dict[str, Any], method: str, path: str, **kw: Any
) -> httpx.Response:
    kw.setdefault("headers", stack.headers(user="alice"))
    r = await stack.client.request(method, path, **kw)
    conforms(doc, r)
    return r


async def test_every_answer_validates_against_the_contract(
    stack: ApiStack, doc: dict[str, Any]
) -> None:
    a = f"/v1/agents/{AGENT}"
    calls: list[tuple[str, str, dict[str, Any], int]] = [
        ("PUT", a, {"json": {"memory": True}}, 200),
        ("PUT", a, {"json": {"memory": "yes"}}, 400),
        ("POST", f"{a}/threads", {"json": {"thread_id": "t1", "metadata": {"config": {}}}}, 201),
        ("POST", f"{a}/threads", {}, 201),
        (
            "POST",
            f"{a}/threads/t1/messages",
            {
                "json": {
                    "messages": [
                        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {"id": "k1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                            ],
                        },
                        {"role": "tool", "tool_call_id": "k1", "content": "done"},
                    ]
                }
            },
            201,
        ),
        ("POST", f"{a}/threads/t1/messages", {"json": {"role": "wizard"}}, 400),
        ("POST", f"{a}/threads/t1/messages", {"content": b"{not json"}, 400),
        ("GET", f"{a}/threads/t1/context", {}, 200),
        ("GET", f"{a}/threads/t1/context", {"params": {"format": "anthropic"}}, 200),
        ("GET", f"{a}/threads/t1/context", {"params": {"format": "yaml"}}, 400),
        ("GET", f"{a}/threads/t1/summary", {}, 404),
        (
            "POST",
            f"{a}/memory/store",
            {"json": {"key": "lang", "content": "prefers Rust", "category": "user_profile", "scope": "shared"}},
            200,
        ),
        ("POST", f"{a}/memory/store", {"json": {"key": "x", "content": "y", "category": "nope"}}, 400),
        ("POST", f"{a}/memory/recall", {"json": {"query": "Rust"}}, 200),
        ("POST", f"{a}/memory/forget", {"json": {"key": "lang"}}, 200),
        ("GET", f"{a}/memory/entries", {}, 200),
        ("GET", f"{a}/memory/entries", {"params": {"limit": "0"}}, 400),
        ("GET", f"{a}/memory/entries", {"params": {"user_id": "bob"}}, 403),
        ("GET", f"{a}/memory/entries/nope", {}, 404),
        ("PATCH", f"{a}/memory/entries/nope", {"json": {"importance": 0.5}}, 404),
        ("PATCH", f"{a}/memory/entries/nope", {"json": {}}, 400),
        ("POST", f"{a}/memory/import", {"content": b'{"key": "imp", "content": "imported fact", "category": "project_fact"}\n{"key": 1}\n'}, 200),
        ("GET", f"{a}/memory/entries/imp", {}, 200),
        ("PATCH", f"{a}/memory/entries/imp", {"json": {"importance": 0.9}}, 200),
        ("PATCH", f"{a}/memory/entries/imp", {"json": {"content": "x" * 5000}}, 422),
        ("POST", "/v1/users/alice/erase", {}, 403),
        ("GET", "/v1/erasures/nope", {}, 503),  # no erasure service in this stack
        ("POST", f"{a}/threads/t1/erase", {}, 503),  # no erasure service in this stack
        ("POST", f"{a}/journal/search", {"json": {"query": "hi"}}, 503),  # no transcript store here
        ("DELETE", f"{a}/threads/t1", {}, 204),
        ("DELETE", f"{a}/threads/t1", {}, 404),
        ("GET", f"{a}/threads/t1/context", {"headers": {"Authorization": "Bearer nope"}}, 401),
        ("GET", "/healthz", {}, 200),
    ]  # fmt: skip
    for method, path, kw, expected in calls:
        r = await call(stack, doc, method, path, **kw)
        assert r.status_code == expected, (method, path, r.text)


async def test_the_document_declares_the_contract(doc: dict[str, Any]) -> None:
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "an account API key",
    }
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for template, item in doc["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {template}"
            errors = [c for c in op["responses"] if c[0] in "45"]
            assert errors, f"{where} documents no error"
            if template.startswith("/v1/"):
                assert op.get("security") == [{"bearer": []}], where
                names = [p["name"].lower() for p in op.get("parameters", [])]
                assert "authorization" not in names, where
            if "422" in op["responses"]:  # only memstream's own content_too_long
                assert "content_too_long" in op["responses"]["422"]["description"], where
    append = doc["paths"]["/v1/agents/{agent_id}/threads/{thread_id}/messages"]["post"]
    ref = append["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref == "#/components/schemas/AppendBody"
    message = doc["components"]["schemas"]["MessageIn"]
    assert "developer" in str(message["properties"]["role"])


async def test_a_generated_client_calls_routes(
    stack: ApiStack, doc: dict[str, Any], tmp_path: Path
) -> None:
    spec = tmp_path / "openapi.json"
    spec.write_bytes(orjson.dumps(doc))
    out = tmp_path / "memstream_api"
    subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(spec),
         "--meta", "none", "--output-path", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    sys.path.insert(0, str(tmp_path))
    try:
        api = importlib.import_module("memstream_api")
        default = importlib.import_module("memstream_api.api.default")
        models = importlib.import_module("memstream_api.models")
        client = api.AuthenticatedClient(base_url="http://memstream.test", token=stack.key)
        transport = stack.client._transport  # the in-process app
        client.set_async_httpx_client(
            httpx.AsyncClient(
                transport=transport,
                base_url="http://memstream.test",
                headers={"Authorization": f"Bearer {stack.key}"},
            )
        )
        create = importlib.import_module(
            f"{default.__name__}.create_thread_v1_agents_agent_id_threads_post"
        )
        thread = await create.asyncio(
            client=client, agent_id="gen-bot", body=models.ThreadBody(thread_id="g1")
        )
        assert thread is not None and thread.thread_id == "g1"
        append = importlib.import_module(
            f"{default.__name__}.append_messages_v1_agents_agent_id_threads_thread_id_messages_post"
        )
        body = models.AppendBody.from_dict({"messages": [{"role": "user", "content": "hello"}]})
        appended = await append.asyncio(
            client=client, agent_id="gen-bot", thread_id="g1", body=body
        )
        assert appended is not None and appended.appended[0].offset == 0
        ctx_mod = importlib.import_module(
            f"{default.__name__}.get_context_v1_agents_agent_id_threads_thread_id_context_get"
        )
        ctx = await ctx_mod.asyncio(client=client, agent_id="gen-bot", thread_id="g1")
        assert ctx is not None and ctx.to_dict()["messages"] == [
            {"role": "user", "content": "hello"}
        ]
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("memstream_api")]:
            del sys.modules[name]


async def test_the_search_scopes_the_document_lists_are_the_ones_the_route_takes(
    doc: dict[str, Any],
) -> None:
    """The document once listed ``thread`` for ``scope`` while the route took only
    ``current_thread`` (a generated client's ``thread`` got a 400)."""
    from memstream.agents_ctx.journal_tools.search import SCOPES

    scope = doc["components"]["schemas"]["SearchBody"]["properties"]["scope"]
    assert scope["enum"] == list(SCOPES) == ["all_threads", "current_thread"]
