"""Operator routes under ``/admin`` (not for agents): bulk journal appends for
``memstream produce``. Authenticated by the deployment's admin token
(``X-Memstream-Admin-Token``), never by an account API key: an operator may write to any
account, an agent never can.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request

from memstream.agents_ctx.http.bodies import read_object
from memstream.agents_ctx.http.contract import contract
from memstream.agents_ctx.http.deps import ServicesDep, services
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.http.threads_routes import journal_created
from memstream.agents_ctx.validation import check_id, parse_append_body
from memstream.errors import NotFound, Unauthorized
from memstream.schemas import wire
from memstream.schemas.records import ThreadRef


async def admin(
    request: Request, x_memstream_admin_token: Annotated[str | None, Header()] = None
) -> None:
    token = services(request).settings.admin_token.get_secret_value()
    given = x_memstream_admin_token or ""
    if not token or not hmac.compare_digest(token.encode(), given.encode()):
        raise Unauthorized(
            "admin routes need X-Memstream-Admin-Token", field="X-Memstream-Admin-Token"
        )


router = APIRouter(prefix="/admin", dependencies=[Depends(admin)])


@router.post(
    "/append",
    **contract(
        body=wire.AdminAppendBody, answer=wire.Appended, errors=(400, 401, 404, 409, 413, 503)
    ),
)
async def append(request: Request, svc: ServicesDep) -> JSONResponse:
    """``{"account_id", "agent_id", "thread_id", "user_id"?, "messages": [...]}``."""
    body = await read_object(request)
    ref = ThreadRef(
        check_id(body.get("account_id"), "account_id"),
        check_id(body.get("agent_id"), "agent_id"),
        check_id(body.get("thread_id"), "thread_id"),
    )
    user = body.get("user_id")
    user_id = check_id(user, "user_id") if user is not None else None
    messages = parse_append_body({"messages": body.get("messages")}, user_id)
    if not await svc.accounts.account_exists(ref.account_id):
        # an operator's typo must not create an account (nothing is written)
        raise NotFound(
            f"no account {ref.account_id!r}: create it with "
            f"`memstream keys create {ref.account_id}`",
            field="account_id",
        )
    await svc.accounts.ensure_agent(ref.account_id, ref.agent_id)
    thread, created = await svc.threads.open_as_operator(ref, user_id)
    if created:
        await journal_created(svc, thread)
    appended = await svc.need_journal().append(ref, messages)
    return JSONResponse(
        {"appended": [{"offset": m.offset, "message_id": m.message_id} for m in appended]}
    )
