"""Request bodies over the limit are refused with 413 on a real HTTP server, chunked or not.

A chunked body carries no Content-Length: it must be cut while it streams in (not read
whole into memory first), and nothing of it may be stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import orjson
import pytest
import pytest_asyncio
import uvicorn

from memstream.agents_ctx.http.app import create_app
from memstream.schemas.records import ThreadRef
from tests.fixtures.api import ApiStack


@pytest_asyncio.fixture(loop_scope="session", params=[True, False], ids=["hot", "fastapi"])
async def server_port(api_stack: ApiStack, request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """A real server of the app; the append route served by ``HotRoutes`` (its own count
    of the body) or by FastAPI behind ``BodyLimit``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app = create_app(api_stack.services, hot_routes=request.param)
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    yield port
    server.should_exit = True
    await task


async def _chunked_post(port: int, path: str, key: str, chunks: list[bytes], repeat: int) -> bytes:
    """POST ``chunks`` (sent ``repeat`` times) chunked; returns the raw response head+body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: memstream.test\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()

    async def send_all() -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(head)
            for _ in range(repeat):
                for c in chunks:
                    writer.write(b"%x\r\n%s\r\n" % (len(c), c))
                    await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    sender = asyncio.create_task(send_all())
    response = b""
    with contextlib.suppress(ConnectionError):
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            data = await asyncio.wait_for(reader.read(65536), timeout=30)
            if not data:
                break
            response += data
    sender.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await sender
    writer.close()
    return response


async def test_chunked_40mb_body_is_cut_with_413_and_stores_nothing(
    api_stack: ApiStack, server_port: int
) -> None:
    ref = ThreadRef("acme", "bodies", "huge")
    before = await api_stack.journal.next_offset(ref)
    chunk = b"x" * (1024 * 1024)
    response = await _chunked_post(
        server_port,
        "/v1/agents/bodies/threads/huge/messages",
        api_stack.key,
        [b'{"role":"user","content":"', chunk],
        repeat=40,
    )
    status_line, _, rest = response.partition(b"\r\n")
    assert b" 413 " in status_line, response[:200]
    body = orjson.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["field"] == "body"
    assert await api_stack.journal.next_offset(ref) == before


async def test_small_chunked_body_is_accepted(api_stack: ApiStack, server_port: int) -> None:
    ref = ThreadRef("acme", "bodies", "small")
    before = await api_stack.journal.next_offset(ref)
    response = await _chunked_post(
        server_port,
        "/v1/agents/bodies/threads/small/messages",
        api_stack.key,
        [b'{"role":"user",', b'"content":"hello over chunks"}'],
        repeat=1,
    )
    assert response.split(b"\r\n", 1)[0].split()[1] in (b"200", b"201"), response[:300]
    assert await api_stack.journal.next_offset(ref) == before + 1
