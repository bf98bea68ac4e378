"""``GET /v1/agents/{agent_id}/threads/{thread_id}/summary``: a thread's rolling summary.

Answers the spec's seven fields (``version``, ``timestamp``, ``last_message_offset``,
``last_message_id``, ``content``, ``token_count``, ``message_count``), read from the Redis
cache or, on a miss, from object storage; 404 ``not_found`` while the thread has none, and
for a thread that is deleted or belongs to another user.
"""

from __future__ import annotations

from fastapi import APIRouter

from memstream.agents_ctx.http.contract import contract
from memstream.agents_ctx.http.deps import CallerDep, ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.errors import InfraError, NotFound
from memstream.schemas import wire

router = APIRouter(prefix="/v1/agents/{agent_id}")


@router.get(
    "/threads/{thread_id}/summary", **contract(answer=wire.Summary, errors=(400, 401, 404, 503))
)
async def get_summary(thread_id: str, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    ref = svc.threads.ref(caller, thread_id)
    if svc.summary_store is None:
        raise InfraError("the summary store is not available in this process")
    await svc.threads.readable(caller, ref)  # someone else's thread: 404, as for none
    summary = await svc.summary_store.get(ref)
    if summary is None:
        raise NotFound(f"thread {thread_id} has no summary yet")
    return JSONResponse(summary.to_dict())
