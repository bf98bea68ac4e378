"""Owning memory over HTTP: browse, get, edit, export and import an agent's entries.

- ``GET  /v1/agents/{agent_id}/memory/entries?category=&visibility=&user_id=&q=&limit=&cursor=``
  → ``{"entries": [entry], "next_cursor": str | null}`` (newest first; ``limit`` 1–200,
  default 50; ``user_id`` needs an admin key, or must be the caller's own user)
- ``GET  /v1/agents/{agent_id}/memory/entries/{key}?user_id=`` → entry, or 404
- ``PATCH /v1/agents/{agent_id}/memory/entries/{key}?user_id=`` with any of ``content``,
  ``importance``, ``category``, ``expires_at`` → ``{"status": "replaced" | "unchanged",
  "entry": entry, "position": version}``
- ``GET  /v1/agents/{agent_id}/memory/export?category=&user_id=`` → NDJSON, one entry per
  line, streamed
- ``POST /v1/agents/{agent_id}/memory/import`` (NDJSON body) → ``{"created", "replaced",
  "unchanged", "failed": [{"line", "error"}]}``

Every route takes the same ``Caller`` as the memory tools (``deps.caller``); which entries
it may see is ``editing.view_of`` (one place). Errors: ``invalid_request`` (field),
``forbidden`` (403, ``user_id`` without an admin key), ``not_found``, ``prompt_injection``,
``private_requires_user``, ``content_too_long``, ``capacity_exceeded``, ``conflict``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from starlette.responses import StreamingResponse

from memstream.agents_ctx.http.bodies import read_object
from memstream.agents_ctx.http.contract import contract
from memstream.agents_ctx.http.deps import CallerDep, ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.memory import editing, policy
from memstream.agents_ctx.memory.editing import Cursor, View
from memstream.agents_ctx.memory.entries import Filters, MemoryEntries
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import check_id, check_json
from memstream.errors import InfraError
from memstream.schemas import wire
from memstream.schemas.records import Caller

router = APIRouter(prefix="/v1/agents/{agent_id}/memory")

NDJSON = "application/x-ndjson"
OptStr = Annotated[str | None, Query()]


def _entries(svc: Services) -> MemoryEntries:
    if svc.memory is None:
        raise InfraError("agent memory is not available in this process")
    return svc.memory.entries


def _view(caller: Caller, user_id: str | None) -> View:
    return editing.view_of(caller, None if user_id is None else check_id(user_id, "user_id"))


def _filters(category: str | None, visibility: str | None = None, q: str | None = None) -> Filters:
    if q is not None:
        check_json(q, "q")  # no NUL: Postgres refuses it in text (a 500, not a 400)
    return Filters(
        category=None if category is None else policy.validate_category(category),
        visibility=None if visibility is None else editing.validate_visibility(visibility),
        q=q or None,
    )


def _import_contract() -> dict[str, Any]:
    out = contract(answer=wire.ImportReport, errors=(400, 401, 403, 413, 503))
    out["openapi_extra"] = {
        "requestBody": {"required": True, "content": {NDJSON: {"schema": {"type": "string"}}}}
    }
    return out


@router.get("/entries", **contract(answer=wire.EntriesPage, errors=(400, 401, 403, 503)))
async def list_entries(
    caller: CallerDep,
    svc: ServicesDep,
    category: OptStr = None,
    visibility: OptStr = None,
    user_id: OptStr = None,
    q: OptStr = None,
    limit: OptStr = None,
    cursor: OptStr = None,
) -> JSONResponse:
    page = await _entries(svc).list(
        caller,
        _view(caller, user_id),
        _filters(category, visibility, q),
        editing.resolve_limit(limit),
        Cursor.decode(cursor),
    )
    return JSONResponse(
        {"entries": [e.to_dict() for e in page.entries], "next_cursor": page.next_cursor}
    )


@router.get(
    "/entries/{key:path}", **contract(answer=wire.MemoryEntry, errors=(400, 401, 403, 404, 503))
)
async def get_entry(
    key: str, caller: CallerDep, svc: ServicesDep, user_id: OptStr = None
) -> JSONResponse:
    entry = await _entries(svc).get(caller, _view(caller, user_id), key)
    return JSONResponse(entry.to_dict())


@router.patch(
    "/entries/{key:path}",
    **contract(
        body=wire.EntryPatchBody, answer=wire.Edited, errors=(400, 401, 403, 404, 409, 422, 503)
    ),
)
async def patch_entry(
    key: str, request: Request, caller: CallerDep, svc: ServicesDep, user_id: OptStr = None
) -> JSONResponse:
    body = dict(await read_object(request))
    result = await _entries(svc).patch(caller, _view(caller, user_id), key, body)
    # position: the entry version; recall with "after" waits until the index applied it
    return JSONResponse(
        {"status": result.status, "entry": result.entry.to_dict(), "position": result.entry.version}
    )


@router.get("/export", **contract(errors=(400, 401, 403, 503), media_type=NDJSON))
async def export_entries(
    caller: CallerDep, svc: ServicesDep, category: OptStr = None, user_id: OptStr = None
) -> StreamingResponse:
    entries, view, filters = _entries(svc), _view(caller, user_id), _filters(category)

    async def lines() -> AsyncIterator[bytes]:
        async for e in entries.export(caller, view, filters):
            yield orjson.dumps(e.to_dict()) + b"\n"

    return StreamingResponse(lines(), media_type=NDJSON)


@router.post("/import", **_import_contract())
async def import_entries(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    entries = _entries(svc)

    async def lines() -> AsyncIterator[bytes]:
        # a line may span chunks; only the unfinished tail is kept (linear in the body)
        rest = bytearray()
        async for chunk in request.stream():
            rest += chunk
            start = 0
            while (end := rest.find(b"\n", start)) >= 0:
                yield bytes(rest[start:end])
                start = end + 1
            del rest[:start]
        if rest:
            yield bytes(rest)

    report = await entries.import_lines(caller, lines())
    return JSONResponse(report.to_dict())
