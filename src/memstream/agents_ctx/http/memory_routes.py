"""The memory tools over HTTP: ``POST /v1/agents/{agent_id}/memory/store|recall|forget``.

Bodies are parsed by hand so every error names its field; the rules themselves live in
``agents_ctx.memory`` (``MemoryService``). Answers, as ARCHITECTURE.md gives them:

- store  → ``{"status": "created" | "unchanged" | "replaced", "entry": entry}``
- recall → ``{"results": [entry + "score"], "source": "index" | "fallback"}``
- forget → ``{"forgotten": bool}``

Errors: ``invalid_request`` (with ``field``), ``prompt_injection``,
``private_requires_user``, ``content_too_long`` (422) and ``capacity_exceeded`` (409).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from memstream.agents_ctx.http.bodies import read_object
from memstream.agents_ctx.http.contract import contract
from memstream.agents_ctx.http.deps import CallerDep, ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.memory.store import MemoryService
from memstream.agents_ctx.read_your_writes import wait_for_memory
from memstream.agents_ctx.services import Services
from memstream.errors import InfraError
from memstream.schemas import wire
from memstream.schemas.records import JSONObject

router = APIRouter(prefix="/v1/agents/{agent_id}")

MEMORY_ERRORS = (400, 401, 403, 409, 422, 503)


def _memory(svc: Services) -> MemoryService:
    if svc.memory is None:
        raise InfraError("agent memory is not available in this process")
    return svc.memory


@router.post(
    "/memory/store", **contract(body=wire.StoreBody, answer=wire.Stored, errors=MEMORY_ERRORS)
)
async def memory_store(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    body = await read_object(request)
    result = await _memory(svc).store(
        caller,
        key=body.get("key"),
        content=body.get("content"),
        category=body.get("category"),
        scope=body.get("scope"),
        importance=body.get("importance"),
    )
    # position: the entry version; recall with "after" waits until the index applied it
    return JSONResponse(
        {"status": result.status, "entry": result.entry.to_dict(), "position": result.entry.version}
    )


@router.post(
    "/memory/recall", **contract(body=wire.RecallBody, answer=wire.Recalled, errors=MEMORY_ERRORS)
)
async def memory_recall(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    body = await read_object(request)
    await wait_for_memory(svc, caller, body.get("after"))  # read-your-writes
    result = await _memory(svc).recall(
        caller, body.get("query"), limit=body.get("limit"), category=body.get("category")
    )
    results: list[JSONObject] = []
    for entry, score in result.results:
        item = entry.to_dict()
        item["score"] = score
        results.append(item)
    return JSONResponse({"results": results, "source": result.source})


@router.post(
    "/memory/forget", **contract(body=wire.ForgetBody, answer=wire.Forgotten, errors=MEMORY_ERRORS)
)
async def memory_forget(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    body = await read_object(request)
    return JSONResponse({"forgotten": await _memory(svc).forget(caller, body.get("key"))})
