"""The HTTP protocol ``memstream up`` / ``memstream api`` serve with: uvicorn's httptools
protocol, writing each answer to the socket once.

uvicorn writes an answer's status line and headers (``http.response.start``) and its body
(``http.response.body``) with two ``transport.write`` calls, and asyncio sends each at once
when the socket's buffer is empty: two ``send`` system calls per request. On loopback a send
also runs the receiver's TCP path, and a profile of ``memstream up`` under append load put
~20% of the API loop in ``_SelectorSocketTransport.write`` (``docs/operations.md``).

:class:`CoalescingHttpTools` hands the protocol a transport that gathers the writes made
in one step of the event loop and sends them as one, at the end of that step
(``loop.call_soon``): the head and the body of an answer leave together. The bytes, their
order and the flow control are unchanged: the gathered bytes are sent before the socket is
closed or its write side shut, at once when they pass :data:`FLUSH_AT` (a streamed answer
never piles up here), and uvicorn's back-pressure still reads the real transport's buffer.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: gathered bytes past this are sent at once (streamed answers, large bodies)
FLUSH_AT: Final = 64 * 1024


class CoalescingTransport:
    """A transport proxy: ``write`` gathers, one ``write`` of the real transport per loop
    step; everything else is the real transport's."""

    __slots__ = ("_loop", "_parts", "_scheduled", "_size", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._parts: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._parts.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _flush_soon(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Send what is gathered (no-op when nothing is, or the socket is closing)."""
        if not self._parts:
            return
        parts, self._parts, self._size = self._parts, [], 0
        if not self._transport.is_closing():
            self._transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._parts, self._size = [], 0
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol over a :class:`CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        proxy = CoalescingTransport(transport, asyncio.get_running_loop())
        super().connection_made(proxy)  # type: ignore[arg-type]
