"""The HTTP protocol memstream serves with (one socket write per answer) answers exactly as
uvicorn's own: keep-alive answers in order, a streamed answer of several MB complete and in
order, ``Connection: close`` honoured. Real uvicorn on a real socket."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from memstream.infra.cli.http_protocol import FLUSH_AT, CoalescingHttpTools

pytestmark = pytest.mark.asyncio(loop_scope="session")
CHUNK = b"0123456789abcdef" * 4096  # 64 KiB


async def echo(request: Request) -> JSONResponse:
    return JSONResponse(
        {"n": int(request.path_params["n"]), "body": (await request.body()).decode()}
    )


async def stream(_: Request) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(64):  # 4 MiB, most chunks written without a real await between them
            yield bytes([65 + i % 26]) + CHUNK[1:]
            if i % 16 == 0:
                await asyncio.sleep(0)

    return StreamingResponse(chunks(), media_type="application/octet-stream")


async def _serve() -> tuple[uvicorn.Server, asyncio.Task[None], int]:
    app = Starlette(routes=[Route("/echo/{n}", echo, methods=["POST"]), Route("/stream", stream)])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=CoalescingHttpTools, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    return server, task, sock.getsockname()[1]


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    if b"content-length:" in lower:
        start = lower.index(b"content-length:") + 15
        return head, await reader.readexactly(int(lower[start : lower.index(b"\r\n", start)]))
    body = b""
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return head, body
        body += data[:-2]


async def test_answers_arrive_whole_and_in_order() -> None:
    server, task, port = await _serve()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # pipelined on one keep-alive connection: each answer whole, in order
        for n in range(20):
            body = f"payload {n}".encode()
            writer.write(
                f"POST /echo/{n} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        for n in range(20):
            head, body = await _read_answer(reader)
            assert head.startswith(b"HTTP/1.1 200")
            assert body == f'{{"n":{n},"body":"payload {n}"}}'.encode()
        writer.write(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
        head, body = await _read_answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and len(body) == 64 * len(CHUNK) > FLUSH_AT
        assert [body[i * len(CHUNK)] for i in range(64)] == [65 + i % 26 for i in range(64)]
        assert body[1 : len(CHUNK)] == CHUNK[1:]
        writer.write(
            b"POST /echo/7 HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        )
        head, body = await _read_answer(reader)
        assert body == b'{"n":7,"body":""}'
        assert await reader.read() == b""  # the server closed the connection after it
        writer.close()
    finally:
        server.should_exit = True
        await task
