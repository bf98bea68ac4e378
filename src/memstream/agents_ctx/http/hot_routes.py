"""``HotRoutes``: the per-turn routes served as pure ASGI, beside FastAPI.

An agent runtime calls two routes on every turn: ``POST .../threads/{tid}/messages`` (the
append) and ``GET .../threads/{tid}/context``. Through FastAPI each request pays for route
matching over every route, dependency solving (the ``Authorization`` / ``X-Memstream-*``
header parameters validated by pydantic, the path parameters, ``Request`` injection) and two
``AsyncExitStack`` scopes: ~0.3-0.6 ms of CPU per request on this machine, more than the
route's own work for an append (profile in ``docs/operations.md``).

This middleware recognises exactly those two (method, path) shapes by splitting the path
and calls the **same** handlers the FastAPI routes call (``threads_routes.append``,
``context_routes.answer``) with the caller from the same ``deps.authenticate``; any other
request, and any shape it does not recognise (a trailing slash, an empty segment, ``HEAD``,
a ``root_path``), goes to FastAPI untouched. So the two paths cannot drift: what differs is
only who parses the path and the headers.

Guarantees kept: the routes stay in the OpenAPI document (FastAPI still owns them); the
metrics' ``route`` label is the FastAPI route's template (``scope["route"]`` is set to it);
an error is answered by the app's own exception handler for its class, exactly as
Starlette's ``ExceptionMiddleware`` would (a ``MemstreamError`` names its field, a store
outage is a 503 with ``Retry-After``); an exception no specific handler claims is re-raised
to ``ServerErrorMiddleware``, which answers the JSON 500 and logs it, as for any route. It is
installed inside ``Observe`` and ``BodyLimit``, so request ids, the access log, metrics and
the body limit apply as before.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from memstream.agents_ctx.http import context_routes, threads_routes
from memstream.agents_ctx.http.deps import authenticate
from memstream.agents_ctx.services import Services
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


class HotRoutes:
    """Pure ASGI: serve the hot routes without FastAPI's routing and dependency solving."""

    def __init__(
        self,
        app: ASGIApp,
        services: Services,
        exception_handlers: Mapping[Any, ExceptionHandler],
    ) -> None:
        """``exception_handlers``: the app's handlers by exception class (read per error,
        so handlers installed after this middleware count)."""
        self.app = app
        self.services = services
        self._handlers = exception_handlers
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
            scope["route"] = route  # Observe labels metrics by the route's template
        scope["path_params"] = {"agent_id": agent_id, "thread_id": thread_id}
        request = Request(scope, receive, send)
        try:
            headers = request.headers
            caller = await authenticate(
                self.services,
                agent_id,
                headers.get("authorization"),
                headers.get("x-memstream-user"),
                headers.get("x-memstream-user-token"),
            )
            response = await handler(self.services, caller, thread_id, request)
        except Exception as exc:
            on_error = self._handler_for(exc)
            if on_error is None:
                raise  # ServerErrorMiddleware answers the JSON 500 and logs it
            answered = on_error(request, exc)
            response = await answered if inspect.isawaitable(answered) else answered
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> ExceptionHandler | None:
        """The app's handler for ``exc``'s class (nearest in its MRO), as Starlette's
        ``ExceptionMiddleware`` picks it; the catch-all ``Exception`` handler is left to
        ``ServerErrorMiddleware``, where Starlette puts it."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            found = self._handlers.get(cls)
            if found is not None:
                return found
        return None
