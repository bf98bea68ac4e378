"""``GET /v1/agents/{agent_id}/threads/{thread_id}/summary``: a thread's rolling summary.

Answers the spec's seven fields (``version``, ``timestamp``, ``last_message_offset``,
``last_message_id``, ``content``, ``token_count``, ``message_count``), read from the Redis
cache or, on a miss, from object storage; 404 ``not_found`` while the thread has none.
"""

from __future__ import annotations

from fastapi import APIRouter

from memstream.agents_ctx.http.deps import CallerDep, ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.validation import check_id
from memstream.errors import InfraError, NotFound
from memstream.schemas.records import ThreadRef

router = APIRouter(prefix="/v1/agents/{agent_id}")


@router.get("/threads/{thread_id}/summary")
async def get_summary(thread_id: str, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    check_id(thread_id, "thread_id")
    if svc.summary_store is None:
        raise InfraError("the summary store is not available in this process")
    ref = ThreadRef(caller.account_id, caller.agent_id, thread_id)
    summary = await svc.summary_store.get(ref)
    if summary is None:
        raise NotFound(f"thread {thread_id} has no summary yet")
    return JSONResponse(summary.to_dict())
