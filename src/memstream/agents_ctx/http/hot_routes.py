"""``HotRoutes``: the per-turn routes served as pure ASGI, in front of FastAPI's stack.

An agent runtime calls two routes on every turn: ``POST .../threads/{tid}/messages`` (the
append) and ``GET .../threads/{tid}/context``. Through FastAPI each request pays for route
matching over every route, dependency solving (the ``Authorization`` / ``X-Memstream-*``
header parameters validated by pydantic, the path parameters, ``Request`` injection) and two
``AsyncExitStack`` scopes: ~0.3-0.6 ms of CPU per request on this machine, more than the
route's own work for an append (profile in ``docs/operations.md``).

This layer recognises exactly those two (method, path) shapes by splitting the path and
calls the **same** handlers the FastAPI routes call (``threads_routes.append_from_request``,
``context_routes.answer_from_request``) with the caller from the same
``deps.authenticate``; any other request, and any shape it does not recognise (a trailing
slash, an empty segment, ``HEAD``, a ``root_path``), goes to FastAPI's stack untouched. So
the two paths cannot drift: what differs is only who parses the path and the headers.

It is the **outermost** layer of the app's middleware stack (``app.MemstreamAPI``), so a hot
request resumes through one coroutine frame instead of seven (``ServerErrorMiddleware``,
FastAPI's telemetry and body-limit wrappers, ``Observe``, ``BodyLimit``, this, the handler):
it does their jobs itself, with their own pieces, in one pass over the headers:

- the request id, the metrics and the access line as ``Observe`` does
  (``observe.usable_id``, ``new_request_id``, a ``Recorder``); the ``x-request-id`` header
  goes on every answer, a 500 included;
- the body limit as ``BodyLimit`` does: a declared length over the limit is refused before
  anything is read, an undeclared one is counted as it streams in (``body_limit.counted``);
- errors: each is answered by the app's own exception handler for its class, exactly as
  Starlette's ``ExceptionMiddleware`` picks it (a ``MemstreamError`` names its field, a store
  outage is a 503 with ``Retry-After``); one no specific handler claims is answered by the
  app's 500 handler (a JSON ``internal`` error, logged) and then re-raised to the server, as
  ``ServerErrorMiddleware`` does.

The routes stay in the OpenAPI document (FastAPI still owns them) and the metrics' ``route``
label is the FastAPI route's template (``scope["route"]`` is set to it).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from memstream.agents_ctx.http import context_routes, threads_routes
from memstream.agents_ctx.http.body_limit import counted, declared_length, too_large
from memstream.agents_ctx.http.deps import authenticate
from memstream.agents_ctx.http.errors import error_response
from memstream.agents_ctx.http.observe import Recorder, new_request_id, usable_id
from memstream.agents_ctx.services import Services
from memstream.infra.logs import request_id
from memstream.schemas.records import Caller

Handler = Callable[[Services, Caller, str, Request], Awaitable[Response]]
ExceptionHandler = Callable[[Request, Any], Response | Awaitable[Response]]

#: (method, last path segment) -> (the FastAPI route's template, the shared handler)
_ROUTES: dict[tuple[str, str], tuple[str, Handler]] = {
    ("POST", "messages"): (
        "/v1/agents/{agent_id}/threads/{thread_id}/messages",
        threads_routes.append_from_request,
    ),
    ("GET", "context"): (
        "/v1/agents/{agent_id}/threads/{thread_id}/context",
        context_routes.answer_from_request,
    ),
}


def match(method: str, path: str) -> tuple[str, str, str] | None:
    """``(agent_id, thread_id, last segment)`` if ``method path`` is one of the hot routes,
    matched as Starlette would (each ``{param}`` one non-empty segment); else None. Pure."""
    parts = path.split("/")
    # ["", "v1", "agents", agent_id, "threads", thread_id, last]
    if (
        len(parts) != 7
        or parts[0]
        or parts[1] != "v1"
        or parts[2] != "agents"
        or parts[4] != "threads"
        or not parts[3]
        or not parts[5]
        or (method, parts[6]) not in _ROUTES
    ):
        return None
    return parts[3], parts[5], parts[6]


_WANTED = frozenset(
    (
        b"authorization",
        b"x-memstream-user",
        b"x-memstream-user-token",
        b"x-request-id",
        b"content-length",
    )
)


def headers_of(raw: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """The headers the hot routes read, each its first occurrence (as Starlette's
    ``Headers.get`` answers), from one pass over the raw list. Pure."""
    got: dict[bytes, bytes] = {}
    for name, value in raw:
        if name in _WANTED and name not in got:
            got[name] = value
    return got


def _internal_error(_request: Request, _exc: Exception) -> Response:
    return error_response(500, "internal", "internal error")


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class HotRoutes:
    """Pure ASGI in front of FastAPI's stack: serve the hot routes without it."""

    def __init__(
        self,
        app: ASGIApp,
        services: Services,
        exception_handlers: Mapping[Any, ExceptionHandler],
        max_body_bytes: int,
    ) -> None:
        """``app``: FastAPI's middleware stack, for every other request.
        ``exception_handlers``: the app's handlers by exception class (read per error, so
        handlers installed after this layer count). ``max_body_bytes``: ``BodyLimit``'s."""
        self.app = app
        self.services = services
        self._handlers = exception_handlers
        self._max_body = max_body_bytes
        self._recorder = Recorder(services)
        self._routes: dict[str, BaseRoute] = {
            r.path: r
            for r in (*threads_routes.router.routes, *context_routes.router.routes)
            if isinstance(r, APIRoute)
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        hit = match(scope["method"], scope["path"])
        if hit is None:
            await self.app(scope, receive, send)
            return
        agent_id, thread_id, last = hit
        template, handler = _ROUTES[(scope["method"], last)]
        route = self._routes.get(template)
        if route is not None:
            scope["route"] = route  # metrics are labelled by the route's template
        scope["path_params"] = {"agent_id": agent_id, "thread_id": thread_id}
        headers = headers_of(scope["headers"])
        given = headers.get(b"x-request-id")
        rid = (usable_id(given) if given is not None else None) or new_request_id()
        token = request_id.set(rid)
        status = 500
        started = time.perf_counter()
        try:
            length = headers.get(b"content-length")
            declared = declared_length(length) if length is not None else None
            if declared is None:
                receive = counted(receive, self._max_body)
            request = Request(scope, receive, send)
            unclaimed: Exception | None = None
            try:
                if declared is not None and declared > self._max_body:
                    raise too_large(self._max_body)
                caller = await authenticate(
                    self.services,
                    agent_id,
                    _text(headers.get(b"authorization")),
                    _text(headers.get(b"x-memstream-user")),
                    _text(headers.get(b"x-memstream-user-token")),
                )
                response = await handler(self.services, caller, thread_id, request)
            except Exception as exc:
                on_error = self._handler_for(exc)
                if on_error is None:  # as ServerErrorMiddleware: the 500, then to the server
                    unclaimed, on_error = exc, self._internal_handler()
                answered = on_error(request, exc)
                response = await answered if inspect.isawaitable(answered) else answered
            status = response.status_code
            response.raw_headers.append((b"x-request-id", rid.encode("latin-1")))
            await response(scope, receive, send)
            if unclaimed is not None:
                raise unclaimed
        finally:
            elapsed = time.perf_counter() - started
            request_id.reset(token)
            self._recorder.record(scope, status, elapsed, rid)

    def _internal_handler(self) -> ExceptionHandler:
        """The app's own 500 handler (``errors.install``'s: JSON ``internal``, logged),
        where ``ServerErrorMiddleware`` finds it; a plain JSON 500 for an app without one."""
        return self._handlers.get(Exception) or self._handlers.get(500) or _internal_error

    def _handler_for(self, exc: Exception) -> ExceptionHandler | None:
        """The app's handler for ``exc``'s class (nearest in its MRO), as Starlette's
        ``ExceptionMiddleware`` picks it; the catch-all ``Exception`` handler is
        ``ServerErrorMiddleware``'s, where Starlette puts it (:meth:`_internal_handler`)."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            found = self._handlers.get(cls)
            if found is not None:
                return found
        return None
