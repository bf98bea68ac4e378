"""The journal tools over HTTP: ``POST .../journal/search`` and
``GET .../journal/tool-calls/{tool_call_id}?thread_id=&offset=&length=``.

Agent surface only: these routes exist on the HTTP API and are never registered on the MCP
gateway. Bodies and query strings are parsed by hand so every error names its field.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from memstream.agents_ctx.http.bodies import read_object
from memstream.agents_ctx.http.contract import Query, contract
from memstream.agents_ctx.http.deps import CallerDep, ServicesDep
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.journal_tools import journal_message_search, journal_tool_call_view
from memstream.agents_ctx.read_your_writes import wait_for_messages
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import query_int
from memstream.errors import InfraError
from memstream.infra.llm.ports import SummaryModel
from memstream.infra.llm.summary import ExtractiveSummaryModel
from memstream.projections.messages import MessageStore
from memstream.schemas import wire
from memstream.schemas.limits import SEARCH_DEFAULT_LIMIT, TOOL_VIEW_MAX_BYTES

router = APIRouter(prefix="/v1/agents/{agent_id}")


def _store(svc: Services) -> MessageStore:
    if svc.message_store is None:
        raise InfraError("transcript search is not available in this process")
    return svc.message_store


def _summarizer(svc: Services) -> SummaryModel:
    return svc.summary_model if svc.summary_model is not None else ExtractiveSummaryModel()


def _query_int(request: Request, name: str, default: int) -> int:
    return query_int(request.query_params.get(name), name, default)


@router.post(
    "/journal/search",
    **contract(body=wire.SearchBody, answer=wire.SearchResult, errors=(400, 401, 404, 503)),
)
async def search(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    body = await read_object(request)
    await wait_for_messages(svc, caller, body.get("after"))  # read-your-writes
    result = await journal_message_search(
        caller,
        body.get("query"),
        scope=body.get("scope", "all_threads"),
        thread_id=body.get("thread_id"),
        limit=body.get("limit", SEARCH_DEFAULT_LIMIT),
        summarize=body.get("summarize", True),
        explain=body.get("explain", False),
        store=_store(svc),
        summarizer=_summarizer(svc),
        threads=svc.threads,
    )
    return JSONResponse(result.to_dict())


@router.get(
    "/journal/tool-calls/{tool_call_id}",
    **contract(
        answer=wire.ToolCallPage,
        errors=(400, 401, 404, 503),
        query=(
            Query("offset", "first byte of the page (default 0)", {"type": "integer"}),
            Query(
                "length",
                f"bytes in the page (default and maximum {TOOL_VIEW_MAX_BYTES})",
                {"type": "integer"},
            ),
            Query("thread_id", "the thread of the call, when one id is in several"),
        ),
    ),
)
async def tool_call(
    tool_call_id: str, request: Request, caller: CallerDep, svc: ServicesDep
) -> JSONResponse:
    page = await journal_tool_call_view(
        caller,
        tool_call_id,
        offset=_query_int(request, "offset", 0),
        length=_query_int(request, "length", TOOL_VIEW_MAX_BYTES),
        journal=svc.need_journal(),
        threads=svc.threads,
        thread_id=request.query_params.get("thread_id"),
    )
    return JSONResponse(page.to_dict())
