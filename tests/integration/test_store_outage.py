"""Defect 6 of issue 12: with Postgres down, routes answer 503 with the JSON error body and
``Retry-After`` (they answered ``Internal Server Error`` in text/plain)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.memory.store import MemoryService
from memstream.agents_ctx.services import Services
from memstream.clock import FixedClock
from memstream.infra.accounts import Accounts
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.journal import Journal, local_store
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.chaos
async def test_routes_answer_503_json_with_retry_after_while_postgres_is_down(
    traversable_tmp: Path, tmp_path: Path
) -> None:
    server = EmbeddedPostgres(traversable_tmp / "pg-outage")
    await server.start()
    pool = await create_pool(server.dsn)
    journal = await Journal.open(local_store(tmp_path), "journal", clock=FixedClock())
    try:
        await migrate(pool)
        accounts = Accounts(pool)
        key = await accounts.create_key("acme")
        await accounts.configure_agent("acme", "bot", memory=True)
        services = Services(
            settings=Settings(data_dir=tmp_path),
            accounts=accounts,
            journal=journal,
            clock=FixedClock(),
        )
        services.memory = MemoryService(pool, FixedClock())
        transport = httpx.ASGITransport(app=create_app(services), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://m.test") as c:
            h = {"Authorization": f"Bearer {key}"}
            r = await c.post("/v1/agents/bot/threads", json={"thread_id": "t1"}, headers=h)
            assert r.status_code == 201, r.text
            await server.kill()  # Postgres dies
            r = await c.post(  # the journal needs no Postgres: appends go on
                "/v1/agents/bot/threads/t1/messages",
                json={"messages": [{"role": "user", "content": "hi"}]},
                headers=h,
            )
            assert r.status_code == 201, r.text
            calls = [
                (
                    "POST",
                    "/v1/agents/bot/memory/store",
                    {"key": "k", "content": "uses uv", "category": "project_fact"},
                ),
                ("POST", "/v1/agents/bot/memory/recall", {"query": "uv"}),
            ]
            for method, path, body in calls:
                r = await c.request(method, path, json=body, headers=h)
                assert r.status_code == 503, f"{method} {path}: {r.status_code} {r.text}"
                assert r.headers["content-type"].startswith("application/json"), path
                assert r.json()["error"]["code"] == "store_unavailable", r.text
                assert int(r.headers["retry-after"]) >= 1
    finally:
        await journal.close()
        pool.terminate()
        await server.stop()
