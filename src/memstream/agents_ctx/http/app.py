"""The FastAPI application factory: ``create_app(services)``.

Routers are included here, one per area. ``/livez`` is liveness (the process answers);
``/readyz`` and ``/healthz`` are readiness: 200 only when every part the process runs is
usable now, else 503 naming the failing parts (``services.readiness``, see
``infra/readiness.py``); ``/metrics`` serves the one Prometheus registry.
Bodies over ``MAX_REQUEST_BYTES`` are refused with 413, chunked or not (``BodyLimit``).
The append and context routes are served by ``HotRoutes`` (pure ASGI, the same handlers),
put in front of FastAPI's whole middleware stack by :class:`MemstreamAPI`: no routing,
dependency solving or middleware frames of FastAPI's; FastAPI still documents them.
"""

from __future__ import annotations

import inspect
from typing import Any

from fastapi import FastAPI, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from memstream import __version__
from memstream.agents_ctx import console
from memstream.agents_ctx.http import (
    admin_routes,
    context_routes,
    contract,
    entries_routes,
    erasure_routes,
    errors,
    journal_routes,
    memory_routes,
    replay_routes,
    summary_routes,
    threads_routes,
)
from memstream.agents_ctx.http.body_limit import BodyLimit
from memstream.agents_ctx.http.hot_routes import HotRoutes
from memstream.agents_ctx.http.observe import Observe
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.mcp_http import McpEndpoint
from memstream.agents_ctx.services import Services
from memstream.errors import RETRY_AFTER_S
from memstream.schemas import wire
from memstream.schemas.limits import MAX_REQUEST_BYTES

#: FastAPI's native OpenTelemetry off (FastAPI >= 0.16x asks the global tracer, meter and
#: logger providers on every request whether telemetry is configured: ~5% of the API loop
#: under append load, for spans nobody exports; memstream's metrics are Prometheus, through
#: ``Observe``). Older FastAPI has no such argument and no such cost.
_NO_NATIVE_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class MemstreamAPI(FastAPI):
    """FastAPI with ``HotRoutes`` in front of its middleware stack (when ``hot`` is set)."""

    hot: bool = False

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        if not self.hot:
            return stack
        return HotRoutes(
            stack,
            services=self.state.services,
            exception_handlers=self.exception_handlers,
            max_body_bytes=MAX_REQUEST_BYTES,
        )


def create_app(services: Services, *, hot_routes: bool = True) -> FastAPI:
    """The API over ``services``. ``hot_routes=False`` serves every route through FastAPI
    alone (the tests compare both ways; the answers must not differ)."""
    app = MemstreamAPI(
        title="memstream",
        version=__version__,
        description="Memory for LLM agents: thread memory, agent memory, transcript search.",
        default_response_class=JSONResponse,
        **_NO_NATIVE_TELEMETRY,
    )
    app.state.services = services
    errors.install(app)
    contract.install(app)

    app.hot = hot_routes  # the per-turn routes in front of the stack below (hot_routes.py)
    app.add_middleware(BodyLimit, max_bytes=MAX_REQUEST_BYTES)
    app.add_middleware(Observe, services=services)  # every answer HotRoutes does not give

    ready = contract.contract(answer=wire.Health, errors=(), other={503: wire.Health})

    async def readiness() -> JSONResponse:
        report = await services.readiness.report()
        if report["ok"]:
            return JSONResponse(report)
        headers = {"Retry-After": str(RETRY_AFTER_S)}
        return JSONResponse(report, status_code=503, headers=headers)

    app.get(
        "/healthz",
        summary="Readiness (same as /readyz): every part usable, else 503 naming them",
        **ready,
    )(readiness)
    app.get("/readyz", summary="Readiness: every part usable, else 503 naming them", **ready)(
        readiness
    )

    @app.get(
        "/livez",
        summary="Liveness: the process answers (no dependency is checked)",
        **contract.contract(answer=wire.Live, errors=()),
    )
    async def livez() -> JSONResponse:
        return JSONResponse({"ok": True, "status": "live"})

    @app.get("/metrics", **contract.contract(errors=(), media_type="text/plain; version=1.0.0"))
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        if services.metrics is None:
            return Response(b"", media_type=CONTENT_TYPE_LATEST)
        return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(threads_routes.router)
    app.include_router(admin_routes.router)
    app.include_router(replay_routes.router)
    app.include_router(journal_routes.router)
    app.include_router(summary_routes.router)
    app.include_router(memory_routes.router)
    app.include_router(entries_routes.router)
    app.include_router(erasure_routes.router)
    app.include_router(context_routes.router)
    mcp = McpEndpoint(services)
    app.state.mcp = mcp
    app.router.routes.append(
        Route("/v1/agents/{agent_id}/mcp", endpoint=mcp, methods=["GET", "POST", "DELETE"])
    )
    console.mount(app)  # /console: the operator pages (not in the OpenAPI schema)
    return app
