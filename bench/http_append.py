"""Append over HTTP vs in process, and uvicorn's HTTP parser: h11 vs httptools.

Run: ``python bench/http_append.py [--appends 1280] [--clients 64] [--rounds 3]``.

One real API (``create_app``) over embedded PostgreSQL 18 and a real SlateDB journal (local
folder) is served by two uvicorn servers in this process, one per HTTP parser (``h11``, the
pure-Python default, and ``httptools``). ``--clients`` concurrent httpx clients, each on its
own thread, send batch-1 appends (``POST .../threads/{tid}/messages``); the same number of
concurrent in-process ``Journal.append`` calls is the ceiling, and ``GET /healthz`` on each
server the HTTP floor. Every variant runs in each of ``--rounds`` interleaved rounds so the
machine's load hits all alike; it prints appends/s, p50/p99 and the ratios (the httpx client
runs in the same process, so absolute figures understate the server).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import uvicorn

from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.services import Services
from memstream.clock import SystemClock
from memstream.infra.accounts import Accounts
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.journal import Journal, local_store
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.settings import Settings
from memstream.schemas.records import NewMessage, ThreadRef

PARSERS = ("h11", "httptools")


async def _serve(services: Services, http: str) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(services),
        log_level="warning",
        lifespan="off",
        access_log=False,
        http=http,
        timeout_keep_alive=120,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]


async def _concurrent(
    n: int, clients: int, op: Callable[[int, int], Awaitable[None]]
) -> tuple[float, list[float]]:
    lat: list[float] = []
    per = n // clients

    async def one(c: int) -> None:
        for i in range(per):
            t = time.perf_counter()
            await op(c, i)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(clients)))
    return per * clients / (time.perf_counter() - t0), lat


async def main(appends: int, clients: int, rounds: int) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one log line per request otherwise
    work = Path(tempfile.mkdtemp(prefix="httpappend-"))
    pg = EmbeddedPostgres(work / "pg")
    await pg.start()
    pool = await create_pool(pg.dsn, max_size=10)
    await migrate(pool)
    journal = await Journal.open(local_store(work / "journal"), "journal", clock=SystemClock())
    accounts = Accounts(pool)
    key = await accounts.create_key("bench")
    services = Services(
        settings=Settings(data_dir=work),  # type: ignore[arg-type]
        accounts=accounts,
        journal=journal,
    )
    servers = {p: await _serve(services, p) for p in PARSERS}
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    http = {
        p: httpx.AsyncClient(base_url=f"http://127.0.0.1:{servers[p][2]}", limits=limits)
        for p in PARSERS
    }
    rates: dict[str, list[float]] = {}
    lats: dict[str, list[float]] = {}

    def record(name: str, result: tuple[float, list[float]]) -> None:
        rates.setdefault(name, []).append(result[0])
        lats.setdefault(name, []).extend(result[1])

    try:
        for r in range(rounds + 1):  # round 0 warms up (threads created, caches filled)
            for p in PARSERS:
                c = http[p]

                async def append(k: int, i: int, c: httpx.AsyncClient = c) -> None:
                    resp = await c.post(
                        f"/v1/agents/a/threads/t{k}/messages",
                        json={"role": "user", "content": f"message {i} from client {k}"},
                        headers=headers,
                    )
                    assert resp.status_code == 201, resp.text

                async def healthz(k: int, i: int, c: httpx.AsyncClient = c) -> None:
                    assert (await c.get("/healthz")).status_code == 200

                a, h = (
                    await _concurrent(appends, clients, append),
                    await _concurrent(appends, clients, healthz),
                )
                if r:
                    record(f"append {p}", a)
                    record(f"healthz {p}", h)

            async def direct(k: int, i: int) -> None:
                await journal.append(
                    ThreadRef("bench", "a", f"t{k}"), [NewMessage("user", f"m {i} from {k}")]
                )

            d = await _concurrent(appends, clients, direct)
            if r:
                record("in-process", d)
    finally:
        for c in http.values():
            await c.aclose()
        for server, task, _ in servers.values():
            server.should_exit = True
            await task
        await journal.close()
        await pool.close()
        await pg.stop()
    ceiling = statistics.median(rates["in-process"])
    print(f"{clients} clients, {appends} batch-1 appends x {rounds} rounds (interleaved)")
    print(f"{'path':<18} {'ops/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'/in-process':>12}")
    for name, name_rates in rates.items():
        rate = statistics.median(name_rates)
        q = statistics.quantiles(lats[name], n=100)
        print(
            f"{name:<18} {rate:8.0f} {q[49] * 1e3:8.1f} {q[98] * 1e3:8.1f} {rate / ceiling:12.3f}"
        )
    for p in PARSERS:
        ratio = statistics.median(rates[f"append {p}"]) / statistics.median(rates[f"healthz {p}"])
        print(f"append / healthz ({p}): {ratio:.2f}")
    speed = statistics.median(rates["append httptools"]) / statistics.median(rates["append h11"])
    print(f"append httptools / h11: {speed:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--appends", type=int, default=1280)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.appends, a.clients, a.rounds))
