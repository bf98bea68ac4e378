"""``GET /v1/agents/{agent_id}/threads/{thread_id}/summary``: a thread's rolling summary.

Answers the spec's seven fields (``version``, ``timestamp``, ``last_message_offset``,
``last_message_id``, ``content``, ``token_count``, ``message_count``), read from the Redis
cache or, on a miss, from object storage.

404 ``not_found``: ``no thread 'T'`` (``field: thread_id``, ``access.not_found``) for a
thread that was never opened, is deleted or belongs to another user, all three alike so the
answer reveals nothing; ``thread 'T' has no summary yet`` for a thread the caller may read
that has none yet.
"""

from __future__ import annotations

from fastapi import APIRouter

from memstream.agents_ctx.access import not_found
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
    # someone else's or a deleted thread: access.not_found, the answer for no thread
    thread = await svc.threads.readable(caller, ref)
    summary = await svc.summary_store.get(ref)
    if summary is None:
        if thread is None:  # never opened: the same answer as someone else's thread
            raise not_found(ref.thread_id)
        raise NotFound(f"thread {ref.thread_id!r} has no summary yet")
    return JSONResponse(summary.to_dict())
