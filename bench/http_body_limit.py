"""The body-limit middleware's cost on a real HTTP server: pure ASGI vs BaseHTTPMiddleware.

Run: ``python bench/http_body_limit.py [--requests 3000] [--clients 64] [--rounds 3]``.

Two uvicorn servers in this process serve the same trivial ``GET /healthz`` route: one
wrapped in memstream's ``BodyLimit`` (pure ASGI, what the API uses now), one in the
``@app.middleware("http")`` check the API used before (a ``BaseHTTPMiddleware``), and a
third with no middleware at all (the ceiling). ``--clients`` concurrent httpx clients send
``--requests`` requests to each, interleaved in rounds so machine load hits all three
alike. It prints requests/s and p50/p99 latency per variant and the ratios to the bare app.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from memstream.agents_ctx.http.body_limit import BodyLimit
from memstream.schemas.limits import MAX_REQUEST_BYTES


def _app(variant: str) -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    if variant == "pure-asgi":
        app.add_middleware(BodyLimit, max_bytes=MAX_REQUEST_BYTES)
    elif variant == "base-http":

        @app.middleware("http")
        async def limit_body(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_REQUEST_BYTES:
                return JSONResponse({"error": {"code": "invalid_request"}}, status_code=413)
            return await call_next(request)

    return app


async def _serve(app: FastAPI) -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=120)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]


async def _load(port: int, requests: int, clients: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    per_client = requests // clients
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits) as c:

        async def one_client() -> None:
            for _ in range(per_client):
                t = time.perf_counter()
                r = await c.get("/healthz")
                latencies.append(time.perf_counter() - t)
                assert r.status_code == 200

        t0 = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return per_client * clients / elapsed, latencies


async def main(requests: int, clients: int, rounds: int) -> None:
    variants = ["bare", "pure-asgi", "base-http"]
    servers = {v: await _serve(_app(v)) for v in variants}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    lats: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            rate, lat = await _load(servers[v][2], requests, clients)
            rates[v].append(rate)
            lats[v].extend(lat)
    for server, task, _ in servers.values():
        server.should_exit = True
        await task
    bare = statistics.median(rates["bare"])
    print(f"{clients} clients, {requests} requests x {rounds} rounds (interleaved), GET /healthz")
    print(f"{'variant':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'vs bare':>8}")
    for v in variants:
        rate = statistics.median(rates[v])
        q = statistics.quantiles(lats[v], n=100)
        print(f"{v:<10} {rate:8.0f} {q[49] * 1e3:8.1f} {q[98] * 1e3:8.1f} {rate / bare:8.2f}")
    ratio = statistics.median(rates["pure-asgi"]) / statistics.median(rates["base-http"])
    print(f"pure-asgi / base-http throughput: {ratio:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    asyncio.run(main(a.requests, a.clients, a.rounds))
