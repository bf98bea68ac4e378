"""docs/python-api.md's "One agent turn" example runs as it is written, with no OpenAI key,
against a real stack: the app over real Postgres, Valkey and a SlateDB journal, served by
uvicorn; the example runs in its own Python process (it calls ``asyncio.run``), with only
its address replaced by the served one."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.memory.store import MemoryService
from memstream.infra.summary_store import SummaryStore
from tests.fixtures.api import ApiStack
from tests.fixtures.served import served

pytestmark = pytest.mark.asyncio(loop_scope="session")

ROOT = Path(__file__).resolve().parents[2]
DOC_URL = "http://127.0.0.1:8080"


def example(page: Path, heading: str) -> str:
    """The first ```python block after ``heading`` on ``page``."""
    text = page.read_text(encoding="utf-8")
    after = text.split(f"\n{heading}\n", 1)
    assert len(after) == 2, f"{page.name} has no heading {heading!r}"
    m = re.search(r"```python\n(.*?)\n```", after[1], re.S)
    assert m is not None, f"no python block under {heading!r}"
    return m.group(1)


@pytest_asyncio.fixture(loop_scope="session")
async def stack(
    api_stack: ApiStack, redis_client: aioredis.Redis, tmp_path: Path
) -> AsyncIterator[ApiStack]:
    svc = api_stack.services
    before = svc.memory, svc.summary_store
    # the real Memory binding (Accounts): the example binds it with configure_agent
    svc.memory = MemoryService(api_stack.pool, api_stack.clock, binding=svc.accounts)
    svc.summary_store = SummaryStore(LocalStore(prefix=tmp_path, mkdir=True), redis_client)
    yield api_stack
    svc.memory, svc.summary_store = before


async def test_the_agent_turn_example_runs(stack: ApiStack) -> None:
    code = example(ROOT / "docs" / "python-api.md", "## One agent turn")
    assert DOC_URL in code
    async with served(create_app(stack.services)) as url:
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        env["MEMSTREAM_API_KEY"] = stack.key
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code.replace(DOC_URL, url),
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()
    # the pinned fact and the user's message reached the (stand-in) model
    assert out.decode().strip() == "(no model configured: 2 context messages received)"
    r = await stack.client.get(
        "/v1/agents/support-bot/threads/ticket-42/context", headers=stack.headers(user="alice")
    )
    assert r.status_code == 200, r.text
    messages = r.json()["messages"]
    assert "Alice" in messages[0]["content"]  # the pinned fact, in the first system message
    assert [m["role"] for m in messages[1:]] == ["user", "assistant"]
    assert messages[2]["content"].startswith("(no model configured")
