"""``Observe``: pure ASGI middleware for request ids, the access log and HTTP metrics.

Per HTTP request it:

- takes the caller's ``X-Request-Id`` (if printable, at most 128 characters) or makes one,
  sets it in ``infra.logs.request_id`` for every line logged meanwhile, and returns it in
  the ``x-request-id`` answer header;
- counts ``memstream_http_requests_total{method, route, status}`` and observes
  ``memstream_http_request_seconds{method, route}``; ``route`` is the route template
  (``/v1/agents/{agent_id}/threads/{thread_id}/context``), never the raw path, so ids do
  not explode the label set (``unmatched`` for a 404 outside every route);
- logs one access line on ``memstream.access`` (INFO): method, path, route, status,
  duration_ms, client, request_id.

Cheap by construction: no request/response objects, one ``perf_counter`` pair, label
children cached per (method, route, status). Streaming answers are timed to their last byte.
``HotRoutes`` serves the per-turn routes outside this middleware and does the same through
:func:`usable_id`, :func:`new_request_id` and a :class:`Recorder` of its own.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memstream.infra.logs import request_id

if TYPE_CHECKING:
    from memstream.agents_ctx.services import Services
    from memstream.infra.metrics import Metrics

access_log = logging.getLogger("memstream.access")
_MAX_ID = 128


def usable_id(value: bytes) -> str | None:
    """A caller's ``X-Request-Id`` if it can be echoed and logged (printable, 1-128
    characters), else None (a fresh id replaces it). Pure."""
    rid = value.decode("latin-1")
    return rid if 0 < len(rid) <= _MAX_ID and rid.isprintable() else None


def new_request_id() -> str:
    """A fresh request id: 32 random hex digits (a uuid4's length). An id must be unique,
    not secret, so it comes from ``random`` (seeded from the OS, reseeded in a forked
    child): no ``uuid.UUID`` built and no ``getrandom`` system call per request (each
    was ~2% of a busy loop in a profile of ``memstream up``)."""
    return f"{random.getrandbits(128):032x}"  # noqa: S311 - an id, not a secret


def _incoming_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return usable_id(value)
    return None


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    return "unmatched"


class Recorder:
    """The metrics and the access line of one answered request."""

    def __init__(self, services: Services) -> None:
        self.services = services  # metrics read per request: a container may gain them later
        self._for: Metrics | None = None
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    def record(self, scope: Scope, status: int, elapsed: float, rid: str) -> None:
        method: str = scope["method"]
        route = _route(scope)
        metrics = self.services.metrics
        if metrics is not None:
            if metrics is not self._for:
                self._for, self._children = metrics, {}
            key = (method, route, status)
            children = self._children.get(key)
            if children is None:
                children = (
                    metrics.http_requests.labels(method, route, str(status)),
                    metrics.http_latency.labels(method, route),
                )
                self._children[key] = children
            children[0].inc()
            children[1].observe(elapsed)
        if access_log.isEnabledFor(logging.INFO):
            client = scope.get("client")
            access_log.info(
                "%s %s %d %.1fms",
                method,
                scope["path"],
                status,
                elapsed * 1000,
                extra={
                    "method": method,
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 3),
                    "client": f"{client[0]}:{client[1]}" if client else None,
                    "request_id": rid,
                },
            )


class Observe:
    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.recorder = Recorder(services)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = _incoming_id(scope) or new_request_id()
        token = request_id.set(rid)
        status = 500
        header = (b"x-request-id", rid.encode("latin-1"))

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        started = time.perf_counter()
        try:
            await self.app(scope, receive, send_observed)
        finally:
            elapsed = time.perf_counter() - started
            request_id.reset(token)
            self.recorder.record(scope, status, elapsed, rid)
