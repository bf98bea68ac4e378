"""``GET /v1/agents/{agent_id}/threads/{thread_id}/context``: one turn's context.

Answers ``{"messages": [...], "pinned": [entry], "summary": summary or null, "window": n}``
(see ``agents_ctx.context`` for the order and the guarantees). The messages are in the
OpenAI Chat Completions shape (hand them to ``chat.completions.create`` as they are); with
``?format=anthropic`` they are Anthropic Messages turns and the system text is apart in
``"system"``.

``?recap=true`` adds a digest of the messages in neither the summary nor the window (a
system message after the summary, and ``"recap"`` in the answer; see ``agents_ctx.context``).

Query parameters, for a delegated sub-agent: ``parent_thread_id`` (the thread it was
delegated from) and optionally ``parent_agent_id`` (default: the same agent). The sub-agent
inherits the parent's pinned entries and starts with an empty conversation and no summary.

Errors: 404 ``not_found`` for a deleted thread or an unknown parent thread; 503
``journal_unavailable`` when the journal cannot be read (never a stale window).
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from memstream.agents_ctx.context import ContextReader, parse_parent
from memstream.agents_ctx.http.contract import Query, contract
from memstream.agents_ctx.http.deps import CallerDep, ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.message_shapes import FORMATS, check_format
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import check_flag
from memstream.schemas import wire
from memstream.schemas.records import Caller

router = APIRouter(prefix="/v1/agents/{agent_id}")


@router.get(
    "/threads/{thread_id}/context",
    **contract(
        answer=wire.Context,
        errors=(400, 401, 404, 503),
        query=(
            Query("format", "the messages' shape", {"type": "string", "enum": list(FORMATS)}),
            Query(
                "recap",
                "add a digest of the messages in neither the summary nor the window",
                {"type": "boolean", "default": False},
            ),
            Query("parent_thread_id", "a delegated sub-agent's parent thread"),
            Query("parent_agent_id", "the parent thread's agent (default: this agent)"),
        ),
    ),
)
async def get_context(
    thread_id: str, request: Request, caller: CallerDep, svc: ServicesDep
) -> JSONResponse:
    return await answer_from_request(svc, caller, thread_id, request)


async def answer_from_request(
    svc: Services, caller: Caller, thread_id: str, request: Request
) -> JSONResponse:
    """The context answer, shared by the FastAPI route and ``hot_routes.HotRoutes``."""
    q = request.query_params
    fmt = check_format(q.get("format"))
    parent = parse_parent(q.get("parent_thread_id"), q.get("parent_agent_id"), caller.agent_id)
    recap = check_flag(q.get("recap"), "recap")
    ctx = await ContextReader.from_services(svc).context(caller, thread_id, parent, recap=recap)
    return JSONResponse(ctx.to_dict(fmt))
