"""Issue 12, defect 4: ``/healthz`` reports each part's real state, and ``memstream up``
restarts a child server that died.

One embedded stack (what ``memstream up`` runs, in this process): the Postgres child, the
Valkey child and the Kafka broker are SIGKILLed one at a time. Each time readiness must go
503 naming the part, the keeper must bring the server back on the same port, readiness must
return to 200, and an append + context round trip must work. Last, a second journal writer
fences the stack's: appends fail and readiness names ``journal``.

The stack runs in a child Python process: chdb accepts one data path per process, and the
suite's session engine already holds one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from memstream.infra.cli.wiring import Stack
from memstream.infra.journal import open_journal
from memstream.infra.settings import Settings

pytestmark = [pytest.mark.chaos]
ROOT = Path(__file__).resolve().parents[2]

KEY = "readiness-key-1"


async def wait_health(
    c: httpx.AsyncClient, *, status: int, timeout: float, part: str | None = None
) -> dict[str, Any]:
    """Poll ``/healthz`` until it answers ``status`` (and, for 503, names ``part``)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        r = await c.get("/healthz")
        last = (r.status_code, r.text)
        if r.status_code == status:
            body: dict[str, Any] = r.json()
            if part is None or part in body["failing"]:
                return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"/healthz never answered {status} (part {part}); last: {last}")


async def round_trip(c: httpx.AsyncClient, text: str) -> None:
    r = await c.post("/v1/agents/bot/threads/t1/messages", json={"role": "user", "content": text})
    assert r.status_code == 201, r.text
    r = await c.get("/v1/agents/bot/threads/t1/context")
    assert r.status_code == 200, r.text
    assert text in r.text


@pytest.mark.timeout(600)
def test_a_dead_child_server_fails_readiness_then_is_restarted(traversable_tmp: Path) -> None:
    res = subprocess.run(  # noqa: S603 - this interpreter, this module
        [sys.executable, "-m", "tests.integration.test_readiness", str(traversable_tmp)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=560,
        check=False,
    )
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-8000:]}"
    assert "scenario passed" in res.stdout


async def scenario(root: Path) -> None:
    settings = Settings(
        data_dir=root / "ready-data",
        port=0,
        api_keys=f"acme:{KEY}",
        server_restart_max_backoff_s=2.0,
        readiness_interval_s=0.5,
    )
    stack = Stack(settings, embedded=True)
    await stack.start()
    try:
        assert stack.keepers is not None
        h = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=stack.api_url, headers=h, timeout=30) as c:
            body = await wait_health(c, status=200, timeout=60)
            assert body["failing"] == [] and body["status"] == "ready"
            assert {"journal", "postgres", "redis", "kafka", "clickhouse", "qdrant"} <= set(
                body["parts"]
            )
            assert (await c.get("/livez")).status_code == 200
            await round_trip(c, "before any fault")

            for name, part in (("postgres", "postgres"), ("valkey", "redis"), ("kafka", "kafka")):
                keeper = stack.keepers.get(name)
                server = keeper.server
                port, pid = server.port, server.pid
                assert pid is not None
                os.kill(pid, signal.SIGKILL)  # a crash, not a stop
                down = await wait_health(c, status=503, timeout=30, part=part)
                assert part in down["errors"], down
                assert (await c.get("/livez")).status_code == 200  # alive, not ready
                assert await keeper.wait_restarted(keeper.state.restarts + 1, timeout=120), (
                    keeper.state
                )
                assert server.port == port and server.pid != pid  # same address, new process
                up = await wait_health(c, status=200, timeout=90)
                servers = up["servers"]
                assert servers[name]["restarts"] == 1, servers
                await round_trip(c, f"after the {name} restart")

            # a second writer fences this one: appends fail and readiness says why
            other = await open_journal(stack.settings)
            try:
                r = await c.post(
                    "/v1/agents/bot/threads/t1/messages", json={"role": "user", "content": "x"}
                )
                assert r.status_code == 503, r.text
                fenced = await wait_health(c, status=503, timeout=10, part="journal")
                assert "fenced" in fenced["errors"]["journal"]
            finally:
                await other.close()
    finally:
        await stack.stop()


if __name__ == "__main__":
    asyncio.run(scenario(Path(sys.argv[1])))
    print("scenario passed")
