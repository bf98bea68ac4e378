"""The observe middleware's cost (request id, access log decision, per-route metrics) on a
real HTTP server, for ``GET /healthz`` and an append.

Run: ``python bench/http_observe.py [--requests 2000] [--clients 32] [--rounds 3]``.

Two uvicorn servers in this process serve the same ``create_app`` over the same services
(embedded Postgres, a SlateDB journal on a temp folder, one ``Metrics``): one as built (with
``Observe``), one with ``Observe`` taken out of the middleware list (the baseline). Rounds
alternate between them so machine load hits both alike. Prints requests/s and p50/p99 per
variant and route, and the ratio with/without.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import socket
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from memstream.agents_ctx.http.app import create_app
from memstream.agents_ctx.http.observe import Observe
from memstream.agents_ctx.services import Services
from memstream.clock import SystemClock
from memstream.infra.accounts import Accounts
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.journal import Journal, local_store
from memstream.infra.metrics import Metrics
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.settings import Settings


async def _serve(app: FastAPI) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]


_ids = itertools.count()


async def _load(
    port: int, route: str, key: str, requests: int, clients: int
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    per_client = requests // clients
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, headers=headers
    ) as c:

        async def one_client() -> None:
            for _ in range(per_client):
                t = time.perf_counter()
                if route == "healthz":
                    r = await c.get("/healthz")
                else:
                    r = await c.post(
                        f"/v1/agents/bench/threads/t{next(_ids) % 500}/messages",
                        json={"role": "user", "content": "hello there"},
                    )
                latencies.append(time.perf_counter() - t)
                assert r.status_code in (200, 201), r.text

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return per_client * clients / elapsed, latencies


async def main(requests: int, clients: int, rounds: int) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per client request
    # the access log is an operator's choice (--access-log); measured here: ids + metrics
    logging.getLogger("memstream.access").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="memstream-observe-"))
    pg = EmbeddedPostgres(work / "pg")
    await pg.start()
    pool = await create_pool(pg.dsn, max_size=10)
    await migrate(pool)
    journal = await Journal.open(local_store(work / "journal"), "journal", clock=SystemClock())
    accounts = Accounts(pool)
    key = await accounts.create_key("acme")
    services = Services(
        settings=Settings(data_dir=work),
        accounts=accounts,
        journal=journal,
        clock=SystemClock(),
        metrics=Metrics(),
    )
    services.readiness.add_flag("journal", journal.problem)
    with_obs = create_app(services)
    without = create_app(services)
    # compared as objects: Starlette types ``Middleware.cls`` as a factory protocol
    observe: object = Observe
    without.user_middleware = [m for m in without.user_middleware if m.cls is not observe]
    servers = [await _serve(with_obs), await _serve(without)]
    names = ["with observe", "without (baseline)"]
    try:
        for route in ("healthz", "append"):
            await _load(servers[0][2], route, key, 200, clients)  # warm both
            await _load(servers[1][2], route, key, 200, clients)
            rates: dict[str, list[float]] = {n: [] for n in names}
            lats: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(rounds):
                for name, (_, _, port) in zip(names, servers, strict=True):
                    rate, lat = await _load(port, route, key, requests, clients)
                    rates[name].append(rate)
                    lats[name].extend(lat)
            for name in names:
                lat = sorted(lats[name])
                print(
                    f"{route:8s} {name:20s} {statistics.median(rates[name]):8.0f} req/s  "
                    f"p50={lat[len(lat) // 2] * 1000:6.2f} ms  p99={lat[int(len(lat) * 0.99)] * 1000:6.2f} ms"
                )
            ratio = statistics.median(rates[names[0]]) / statistics.median(rates[names[1]])
            print(f"{route:8s} throughput with/without observe: {ratio:.2f}x")
    finally:
        for server, task, _ in servers:
            server.should_exit = True
            await task
        await journal.close()
        await pool.close()
        await pg.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.requests, a.clients, a.rounds))
