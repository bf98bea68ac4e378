"""Error responses: every failure is ``{"error": {"code", "message", "field"?}}``.

``MemstreamError`` subclasses carry their own code and status; FastAPI's own validation
errors are mapped to ``invalid_request`` with the offending field's dotted path. A driver's
connection error (``infra.outage.OUTAGE_ERRORS``: Postgres, Valkey or the broker down) is
answered as :class:`StoreUnavailable`; every 503 carries ``Retry-After``; anything else
unexpected is a JSON 500 ``internal`` (logged with its traceback), never text/plain.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from memstream.agents_ctx.http.responses import JSONResponse
from memstream.errors import RETRY_AFTER_S, MemstreamError, NotReady, StoreUnavailable
from memstream.infra.outage import OUTAGE_ERRORS

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    err: dict[str, object] = {"code": code, "message": message}
    if field is not None:
        err["field"] = field
    resp = JSONResponse({"error": err}, status_code=status)
    if status == 503:
        resp.headers["Retry-After"] = str(RETRY_AFTER_S)
    return resp


def _loc_to_field(loc: tuple[object, ...]) -> str:
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(MemstreamError)
    async def _memstream(_: Request, exc: MemstreamError) -> JSONResponse:
        if exc.status >= 500:
            log.warning("%s: %s", exc.code, exc.message)
        resp = error_response(exc.status, exc.code, exc.message, exc.field)
        if isinstance(exc, NotReady) and exc.position is not None:
            resp = JSONResponse(
                {"error": {"code": exc.code, "message": exc.message, "position": exc.position}},
                status_code=exc.status,
            )
        return resp

    async def _outage(request: Request, exc: Exception) -> JSONResponse:
        log.warning("%s %s: a store is unavailable: %r", request.method, request.url.path, exc)
        return await _memstream(request, StoreUnavailable(f"a store is unavailable: {exc}"))

    for cls in OUTAGE_ERRORS:
        app.add_exception_handler(cls, _outage)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal", "internal error")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        field = _loc_to_field(tuple(first.get("loc", ("body",))))
        return error_response(400, "invalid_request", f"{field}: {first.get('msg')}", field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 404: "not_found", 405: "invalid_request"}.get(
            exc.status_code, "invalid_request"
        )
        return error_response(exc.status_code, code, str(exc.detail))
