"""Operators' view of the HTTP API: request ids, the access log, per-route metrics with a
latency histogram and the process collector on /metrics, and JSON log lines."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
import pytest
import pytest_asyncio

from memstream.infra.logs import JsonFormatter, TextFormatter, event_extra, request_id
from memstream.infra.metrics import Metrics
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")

CONTEXT_ROUTE = "/v1/agents/{agent_id}/threads/{thread_id}/context"
APPEND_ROUTE = "/v1/agents/{agent_id}/threads/{thread_id}/messages"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(api_stack: ApiStack) -> AsyncIterator[ApiStack]:
    api_stack.services.metrics = Metrics()
    yield api_stack
    api_stack.services.metrics = None


async def test_request_id_is_echoed_or_made(stack: ApiStack) -> None:
    r = await stack.client.get("/healthz", headers={"X-Request-Id": "req-42"})
    assert r.headers["x-request-id"] == "req-42"
    made = (await stack.client.get("/healthz")).headers["x-request-id"]
    other = (await stack.client.get("/healthz")).headers["x-request-id"]
    assert len(made) == 32 and made != other
    bad = await stack.client.get("/healthz", headers={"X-Request-Id": "x" * 500})
    assert len(bad.headers["x-request-id"]) == 32  # an unusable id is replaced, not echoed


async def test_metrics_per_route_template_and_status(stack: ApiStack) -> None:
    m = stack.services.metrics
    assert m is not None

    def count(method: str, route: str, status: str) -> float:
        v = m.sample(
            "memstream_http_requests_total", {"method": method, "route": route, "status": status}
        )
        return v or 0.0

    before_ok, before_bad = count("POST", APPEND_ROUTE, "201"), count("POST", APPEND_ROUTE, "400")
    for i in range(3):
        r = await stack.client.post(
            f"/v1/agents/obs{i}/threads/t{i}/messages",
            json={"role": "user", "content": "hi"},
            headers=stack.headers(),
        )
        assert r.status_code == 201
    r = await stack.client.post(
        "/v1/agents/obs/threads/t/messages", json={"role": "nope"}, headers=stack.headers()
    )
    assert r.status_code == 400
    assert count("POST", APPEND_ROUTE, "201") == before_ok + 3  # 3 ids, one label set
    assert count("POST", APPEND_ROUTE, "400") == before_bad + 1
    hist = m.sample(
        "memstream_http_request_seconds_count", {"method": "POST", "route": APPEND_ROUTE}
    )
    assert hist is not None and hist >= 4
    await stack.client.get("/no/such/route")
    assert count("GET", "unmatched", "404") >= 1
    text = (await stack.client.get("/metrics")).text
    assert "process_resident_memory_bytes" in text and "process_cpu_seconds_total" in text
    assert f'route="{APPEND_ROUTE}"' in text
    assert "/v1/agents/obs0/" not in text  # raw paths never become labels


async def test_access_log_line(stack: ApiStack, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="memstream.access"):
        await stack.client.get(
            "/v1/agents/a/threads/t/context", headers={**stack.headers(), "X-Request-Id": "acc-1"}
        )
    (rec,) = [r for r in caplog.records if r.name == "memstream.access"]
    assert rec.__dict__["request_id"] == "acc-1"
    assert rec.__dict__["route"] == CONTEXT_ROUTE
    assert rec.__dict__["status"] in (200, 503)
    line = orjson.loads(JsonFormatter().format(rec))
    assert line["request_id"] == "acc-1" and line["path"] == "/v1/agents/a/threads/t/context"
    assert line["duration_ms"] >= 0


async def test_json_lines_carry_request_id_and_event_fields() -> None:
    rec = logging.LogRecord(
        "memstream.streams", logging.ERROR, __file__, 1, "dead-letter", (), None
    )
    for k, v in event_extra("journal", 3, 1234, processor="counters").items():
        setattr(rec, k, v)
    token = request_id.set("rid-9")
    try:
        line = orjson.loads(JsonFormatter().format(rec))
        text = TextFormatter().format(rec)
    finally:
        request_id.reset(token)
    assert line["message"] == "dead-letter" and line["level"] == "ERROR"
    assert (line["topic"], line["partition"], line["offset"]) == ("journal", 3, 1234)
    assert line["request_id"] == "rid-9" and line["processor"] == "counters"
    assert "topic=journal partition=3 offset=1234" in text
