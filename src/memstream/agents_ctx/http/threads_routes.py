"""Agents, threads and message appends: ``PUT /v1/agents/{id}``, ``POST .../threads``,
``POST .../threads/{tid}/messages``, ``DELETE .../threads/{tid}``.

An append is durable in the journal before it is answered. Agents and threads are created
implicitly on first use; creating a thread also journals a ``thread.created`` event. A
thread belongs to the user who opened it (see ``agents_ctx.access``): for anyone else every
route of it answers 404 ``not_found``; appending to a deleted thread is 404 too (it is
revived only by ``POST .../threads`` with its id, by its owner).
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request, Response

from memstream.agents_ctx.http.bodies import read_json
from memstream.agents_ctx.http.contract import contract
from memstream.agents_ctx.http.deps import CallerDep, ServicesDep, refuse_user_token
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import parse_append_body, parse_thread_body
from memstream.clock import epoch_ms
from memstream.errors import InvalidRequest
from memstream.infra.accounts import Thread
from memstream.schemas import wire
from memstream.schemas.events import thread_event
from memstream.schemas.records import Caller, ThreadRef

router = APIRouter(prefix="/v1/agents/{agent_id}")


async def journal_created(svc: Services, thread: Thread) -> None:
    """Journal ``thread.created`` for a thread whose record was just inserted."""
    ref = thread.ref
    await svc.need_journal().append_event(
        thread_event(
            "thread.created",
            ref.account_id,
            ref.agent_id,
            ref.thread_id,
            epoch_ms(svc.clock.now()),
            {"metadata": thread.metadata},
        )
    )


@router.put("", **contract(body=wire.AgentBody, answer=wire.Agent, errors=(400, 401, 403, 503)))
async def configure_agent(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    # binding Memory changes the agent for every user: not for a user token's holder
    refuse_user_token(request.headers.get("authorization"), "configuring an agent")
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("memory"), bool):
        raise InvalidRequest("memory must be true or false", field="memory")
    agent = await svc.accounts.configure_agent(
        caller.account_id, caller.agent_id, memory=body["memory"]
    )
    return JSONResponse({"agent_id": agent.agent_id, "memory": agent.memory})


@router.post(
    "/threads",
    status_code=201,
    **contract(
        body=wire.ThreadBody,
        answer=wire.Thread,
        errors=(400, 401, 404, 409, 503),
        body_required=False,
        other={200: wire.Thread},  # the thread existed: returned as it is (or revived)
    ),
)
async def create_thread(request: Request, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    thread_id, metadata = parse_thread_body(await read_json(request))
    ref = ThreadRef(caller.account_id, caller.agent_id, thread_id or uuid.uuid4().hex)
    thread, created = await svc.threads.create(caller, ref, metadata or {})
    if created:
        await journal_created(svc, thread)
    return JSONResponse(
        {"thread_id": ref.thread_id, "metadata": thread.metadata, "shared": thread.owner is None},
        status_code=201 if created else 200,
    )


@router.post(
    "/threads/{thread_id}/messages",
    status_code=201,
    **contract(body=wire.AppendBody, answer=wire.Appended, errors=(400, 401, 404, 413, 503)),
)
async def append_messages(
    request: Request, thread_id: str, caller: CallerDep, svc: ServicesDep
) -> JSONResponse:
    return await append_from_request(svc, caller, thread_id, request)


async def append_from_request(
    svc: Services, caller: Caller, thread_id: str, request: Request
) -> JSONResponse:
    """The append itself, shared by the FastAPI route and ``hot_routes.HotRoutes``."""
    ref = svc.threads.ref(caller, thread_id)
    messages = parse_append_body(await read_json(request), caller.user_id)
    journal = svc.need_journal()
    thread, created = await svc.threads.open(caller, ref)
    if created:
        await journal_created(svc, thread)
    appended = await journal.append(ref, messages)
    return JSONResponse(
        {
            "appended": [{"offset": m.offset, "message_id": m.message_id} for m in appended],
            "position": appended[-1].seq if appended else None,
        },
        status_code=201,
    )


@router.delete(
    "/threads/{thread_id}", status_code=204, **contract(errors=(400, 401, 403, 404, 503))
)
async def delete_thread(thread_id: str, caller: CallerDep, svc: ServicesDep) -> Response:
    ref = svc.threads.ref(caller, thread_id)
    await svc.threads.delete(caller, ref)
    await svc.need_journal().append_event(
        thread_event(
            "thread.deleted", ref.account_id, ref.agent_id, ref.thread_id, epoch_ms(svc.clock.now())
        )
    )
    return Response(status_code=204)
