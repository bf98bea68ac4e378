"""``POST /admin/replay/{projection}``: rebuild a projection inside the serving process.

chdb and qdrant-edge lock their folder to one process, so with ``memstream up`` a replay
must run where the projections are open: here. The answer streams NDJSON, one line per
progress report (``{"type": "start"|"progress"|"report", "done", "total", "events_read",
"rows_written", "duplicates_skipped", "rate", "elapsed_s", ...}``) and, if the replay fails
midway, a last line ``{"type": "error", "code", "message"}``; ``memstream replay`` draws the
bar from them. A dropped client cancels the replay, which leaves a checkpoint the next call
resumes from. Query: ``from_journal`` (re-read the journal, not the topic), ``restart``
(ignore a checkpoint). Admin token required, as for every ``/admin`` route.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from memstream.agents_ctx.http.admin_routes import admin
from memstream.agents_ctx.http.contract import Query, contract
from memstream.agents_ctx.http.deps import ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.errors import InfraError, InvalidRequest, MemstreamError
from memstream.projections.replay import Progress, check_projection
from memstream.schemas import wire

log = logging.getLogger(__name__)

router = APIRouter(prefix="/admin", dependencies=[Depends(admin)])


def _flag(request: Request, name: str) -> bool:
    raw = request.query_params.get(name, "false").lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no", ""):
        return False
    raise InvalidRequest(f"{name} must be true or false", field=name)


@router.get("/replay", **contract(answer=wire.Generations, errors=(401, 503)))
async def generations(svc: ServicesDep) -> JSONResponse:
    """The current generation of each projection."""
    if svc.replays is None:
        raise InfraError("replays are not available in this process")
    gens = await svc.replays.state.generations()
    return JSONResponse({p: gens.get(p, 1) for p in svc.replays.sinks})


@router.post(
    "/replay/{projection}",
    **contract(
        errors=(400, 401, 503),
        media_type="application/x-ndjson",
        query=(
            Query("from_journal", "re-read the journal, not the topic", {"type": "boolean"}),
            Query("restart", "ignore a checkpoint", {"type": "boolean"}),
        ),
    ),
)
async def replay(projection: str, request: Request, svc: ServicesDep) -> StreamingResponse:
    name = check_projection(projection)
    from_journal = _flag(request, "from_journal")
    restart = _flag(request, "restart")
    if svc.replays is None:
        raise InfraError("replays are not available in this process")
    runs = svc.replays.run(name, from_journal=from_journal, restart=restart)
    # Start it before answering, so a bad request is a plain error status, not a stream.
    first: Progress = await anext(runs)

    async def lines() -> AsyncIterator[bytes]:
        yield orjson.dumps(first.to_dict()) + b"\n"
        try:
            async for p in runs:
                yield orjson.dumps(p.to_dict()) + b"\n"
        except MemstreamError as e:
            log.warning("replay of %s failed: %s", name, e.message)
            yield orjson.dumps({"type": "error", "code": e.code, "message": e.message}) + b"\n"
        except Exception as e:
            log.exception("replay of %s failed", name)
            yield orjson.dumps({"type": "error", "code": "internal", "message": str(e)}) + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")
