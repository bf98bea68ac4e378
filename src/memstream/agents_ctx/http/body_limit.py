"""``BodyLimit``: a pure ASGI middleware that refuses request bodies over a size limit.

A declared ``Content-Length`` over the limit is answered 413 before anything is read. A
body without one (``Transfer-Encoding: chunked``) is counted as it streams in: the chunk
that crosses the limit raises :class:`~memstream.errors.BodyTooLarge` from ``receive``, so
the route, which reads its whole body before acting, never sees a partial body and stores
nothing; the error is answered 413 with the usual error body. Pure ASGI (no
``BaseHTTPMiddleware``), so it costs one header lookup per request. ``HotRoutes`` applies the
same rule to the per-turn routes through :func:`declared_length` and :func:`too_large`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstream.agents_ctx.http.errors import error_response
from memstream.errors import BodyTooLarge


def declared_length(value: bytes) -> int | None:
    """A ``Content-Length`` header's value as a length, None if it is not one. Pure.
    Over 18 digits it is over any limit, and is not parsed: ``int()`` refuses a string of
    more than 4,300 digits with ``ValueError``, which would have answered 500."""
    if not value.isdigit():
        return None
    return int(value) if len(value) <= 18 else 1 << 63


def too_large(max_bytes: int) -> BodyTooLarge:
    """The refusal of a body over ``max_bytes``: it names the field ``body``."""
    return BodyTooLarge(f"the body must be at most {max_bytes} bytes", field="body")


def counted(receive: Receive, max_bytes: int) -> Receive:
    """``receive`` counting a body as it streams in: the chunk that crosses ``max_bytes``
    raises :func:`too_large`, so the route, which reads its whole body before acting,
    never sees a partial body."""
    seen = 0

    async def counted_receive() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > max_bytes:
                raise too_large(max_bytes)
        return message

    return counted_receive


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = declared_length(value)
                break
        if declared is not None:
            if declared > self.max_bytes:
                await self._answer(scope, receive, send, too_large(self.max_bytes))
                return
            # A declared length within the limit: the server refuses bodies longer than
            # they declare, so there is nothing to count.
            await self.app(scope, receive, send)
            return

        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted(receive, self.max_bytes), tracked_send)
        except BodyTooLarge as exc:
            # Raised where no exception handler answered it (e.g. a raw ASGI endpoint).
            if started:
                raise
            await self._answer(scope, receive, send, exc)

    @staticmethod
    async def _answer(scope: Scope, receive: Receive, send: Send, exc: BodyTooLarge) -> None:
        response = error_response(exc.status, exc.code, exc.message, exc.field)
        await response(scope, receive, send)
