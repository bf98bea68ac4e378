"""The MCP endpoint of the API process: ``/v1/agents/{agent_id}/mcp`` (streamable HTTP).

Every request is authenticated like any route (``deps.authenticate``: bearer API key →
account, path → agent, ``X-Memstream-User`` → user; 401 ``unauthorized`` without a valid
key, before any MCP processing); the caller is put in the request's state and the tools
run on ``services.memory`` for that caller, i.e. the same service, index and rules as
``POST .../memory/*``.

The session manager runs **stateless** with JSON answers: every POST carries its own
credentials and is answered on its own, so a session can never outlive or change its
caller. With no session there is no server stream to open and no session to end, so a
``GET`` or ``DELETE`` is answered ``405`` with ``Allow: POST``, as the MCP transport spec
lets a server do (the SDK's stateless transport would hold a ``GET`` open, idle, for as long
as the caller likes). Bodies obey the API's one limit (``BodyLimit``, 413 with the usual
error body naming ``body``): the SDK's own, smaller limit answered plain text. It is started
lazily on the first request (``memstream up`` serves uvicorn with ``lifespan="off"``) and
stopped by :meth:`McpEndpoint.close`.
"""

from __future__ import annotations

import asyncio
import contextlib

from mcp.server.mcpserver import Context
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from memstream.agents_ctx.http.deps import authenticate
from memstream.agents_ctx.http.errors import error_response
from memstream.agents_ctx.mcp_server import MemoryTools, ServiceTools, build_mcp_server
from memstream.agents_ctx.services import Services
from memstream.errors import InfraError, MemstreamError
from memstream.schemas.limits import MAX_REQUEST_BYTES
from memstream.schemas.records import Caller

_CALLER = "memstream_caller"


class McpEndpoint:
    """An ASGI app serving the MCP tools for the agent in the path."""

    def __init__(self, services: Services) -> None:
        self._svc = services
        server = build_mcp_server(self._tools_for)
        # bearer-key authentication makes DNS-rebinding protection moot (a browser page
        # cannot add the key), and the API may listen on any host name
        server.streamable_http_app(
            json_response=True,
            stateless_http=True,
            max_request_body_size=MAX_REQUEST_BYTES + 1,  # BodyLimit answers first
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._manager: StreamableHTTPSessionManager = server.session_manager
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._stop = asyncio.Event()

    def _tools_for(self, ctx: Context) -> MemoryTools:
        state = getattr(ctx.request_context.request, "state", None)
        caller = getattr(state, _CALLER, None)
        if not isinstance(caller, Caller):  # pragma: no cover - every request is authenticated
            raise InfraError("an MCP call without an authenticated caller")
        if self._svc.memory is None:
            raise InfraError("agent memory is not available in this process")
        return ServiceTools(self._svc.memory, caller)

    async def _run(self) -> None:
        async with self._manager.run():
            self._started.set()
            await self._stop.wait()

    async def _ensure_started(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="mcp-session-manager")
        await self._started.wait()

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        agent_id = str(scope.get("path_params", {}).get("agent_id", ""))
        try:
            caller = await authenticate(
                self._svc,
                agent_id,
                request.headers.get("authorization"),
                request.headers.get("x-memstream-user"),
                request.headers.get("x-memstream-user-token"),
            )
        except MemstreamError as e:
            resp = error_response(e.status, e.code, e.message, e.field)
            await resp(scope, receive, send)
            return
        if scope.get("method") != "POST":
            resp = error_response(
                405,
                "invalid_request",
                "this MCP endpoint is stateless: POST each JSON-RPC message "
                "(there is no server stream to GET and no session to DELETE)",
            )
            resp.headers["Allow"] = "POST"
            await resp(scope, receive, send)
            return
        scope.setdefault("state", {})[_CALLER] = caller
        await self._ensure_started()
        await self._manager.handle_request(scope, receive, send)
