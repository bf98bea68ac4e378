"""The console's numeric query parameters (a thread's summary ``version``, a tool result's
``offset``) over the real app: a value that is not an integer, superscript digits included
(``str.isdigit`` accepts ``"²"``, ``int`` does not), is a 400 naming the parameter, never a
500; a real version still picks that summary."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import pytest_asyncio

from memstream.schemas.records import Summary, ThreadRef
from tests.fixtures.api import ApiStack

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(summary_stack: ApiStack) -> ApiStack:
    # a console session: the login sets its cookie on the client
    r = await summary_stack.client.post("/console/login", data={"key": "admin-secret"})
    assert r.status_code == 303, r.text
    return summary_stack


async def test_non_integer_version_and_offset_are_400_naming_the_parameter(
    stack: ApiStack,
) -> None:
    c = stack.client
    r = await c.post(
        "/v1/agents/life/threads", json={"thread_id": "diary"}, headers=stack.headers()
    )
    assert r.status_code == 201, r.text
    store = stack.services.summary_store
    assert store is not None
    ref = ThreadRef("acme", "life", "diary")
    for v in (1, 2):
        summary = Summary(v, datetime(2026, 1, v, tzinfo=UTC), 4, "m4", f"summary {v}", 3, 5)
        await store.write(ref, summary, v - 1)

    page = "/console/threads/acme/life/diary"
    r = await c.get(page, params={"version": "1"})
    assert r.status_code == 200 and "summary 1" in r.text
    for bad in ("²", "١x", "abc", "1.5"):
        r = await c.get(page, params={"version": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
        assert r.json()["error"]["field"] == "version"

    for bad in ("²", "abc"):
        r = await c.get(
            "/console/toolcalls/acme/iso/call_1", params={"thread": "xss", "offset": bad}
        )
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
        assert r.json()["error"]["field"] == "offset"
