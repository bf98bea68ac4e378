"""Request dependencies shared by every router: the service container and the caller.

Isolation is enforced here, in one place: the account comes only from the API key, the
agent only from the path, the end user only from ``X-Memstream-User``. Every route takes a
``Caller`` and every store filters by it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Path, Request

from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import check_id
from memstream.errors import Unauthorized
from memstream.infra.accounts import KeyInfo
from memstream.schemas.records import Caller


def services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


async def key_info(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> KeyInfo:
    """The API key's account and admin flag (routes without an agent in the path)."""
    return await key_of(services(request), authorization)


async def key_of(svc: Services, authorization: str | None) -> KeyInfo:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("send 'Authorization: Bearer <api key>'", field="Authorization")
    key = authorization[7:].strip()
    info = await svc.accounts.key_info(key) if key else None
    if info is None:
        raise Unauthorized("unknown or revoked API key", field="Authorization")
    return info


async def caller(
    request: Request,
    agent_id: Annotated[str, Path()],
    authorization: Annotated[str | None, Header()] = None,
    x_memstream_user: Annotated[str | None, Header()] = None,
) -> Caller:
    return await authenticate(services(request), agent_id, authorization, x_memstream_user)


async def authenticate(
    svc: Services, agent_id: str, authorization: str | None, x_memstream_user: str | None
) -> Caller:
    """The caller of a request on any agent surface (the routes and the MCP endpoint)."""
    info = await key_of(svc, authorization)
    account_id = info.account_id
    check_id(agent_id, "agent_id")
    user_id = None
    if x_memstream_user is not None and x_memstream_user.strip():
        user_id = check_id(x_memstream_user.strip(), "X-Memstream-User")
    await svc.accounts.touch_agent(account_id, agent_id)
    return Caller(account_id=account_id, agent_id=agent_id, user_id=user_id, admin=info.admin)


ServicesDep = Annotated[Services, Depends(services)]
CallerDep = Annotated[Caller, Depends(caller)]
KeyDep = Annotated[KeyInfo, Depends(key_info)]
