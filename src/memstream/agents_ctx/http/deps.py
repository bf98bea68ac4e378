"""Request dependencies shared by every router: the service container and the caller.

Isolation is enforced here, in one place: the account comes only from the API key, the
agent only from the path, the end user only from ``X-Memstream-User``. Every route takes a
``Caller`` and every store filters by it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Path, Request

from memstream.agents_ctx import user_tokens
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import check_id
from memstream.errors import Forbidden, InvalidRequest, Unauthorized
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


def bearer_of(authorization: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer ...`` header (maybe empty), None for
    any other header or none."""
    if authorization is None or authorization[:7].lower() != "bearer ":
        return None
    return authorization[7:].strip()


def _token_refused(doing: str) -> Forbidden:
    return Forbidden(
        f"{doing} needs an API key: a user token acts for its own user only",
        field="Authorization",
    )


def refuse_user_token(authorization: str | None, doing: str) -> None:
    """``Forbidden`` naming ``Authorization`` when a user token is the bearer of a request
    that acts beyond its user (an agent's configuration, a user's erasure)."""
    if (bearer_of(authorization) or "").startswith(user_tokens.PREFIX):
        raise _token_refused(doing)


async def bearer_token(svc: Services, authorization: str | None) -> user_tokens.UserToken | None:
    """The verified user token when one is the bearer (401 if it does not verify), else
    None (an API key, or nothing: :func:`key_of` answers those)."""
    bearer = bearer_of(authorization)
    if bearer is None or not bearer.startswith(user_tokens.PREFIX):
        return None
    return await _user_token(svc, bearer)


async def key_of(svc: Services, authorization: str | None) -> KeyInfo:
    key = bearer_of(authorization)
    if key is None:
        raise Unauthorized("send 'Authorization: Bearer <api key>'", field="Authorization")
    if key.startswith(user_tokens.PREFIX):  # a valid token: the route is not for it (403)
        await _user_token(svc, key)
        raise _token_refused("this route")
    info = await svc.accounts.key_info(key) if key else None
    if info is None:
        raise Unauthorized("unknown or revoked API key", field="Authorization")
    return info


async def caller(
    request: Request,
    agent_id: Annotated[str, Path()],
    authorization: Annotated[str | None, Header()] = None,
    x_memstream_user: Annotated[str | None, Header()] = None,
    x_memstream_user_token: Annotated[str | None, Header()] = None,
) -> Caller:
    return await authenticate(
        services(request), agent_id, authorization, x_memstream_user, x_memstream_user_token
    )


async def _user_token(svc: Services, token: str) -> user_tokens.UserToken:
    account = user_tokens.account_of(token)
    secret = await svc.accounts.user_token_secret(account)
    if secret is None:
        raise Unauthorized("unknown user token", field="X-Memstream-User-Token")
    return user_tokens.verify(secret, token)


def utf8_header(value: str | None, field: str) -> str | None:
    """A header value as the UTF-8 text its client sent (pure).

    ASGI servers hand header bytes over as Latin-1 (each byte one character), so a user id
    sent as UTF-8 (``X-Memstream-User: ålice``) arrived as ``Ã¥lice``: another user than
    the one a user token, a path (``/v1/users/ålice/erase``) or the CLI names, and erasing
    ``ålice`` left that user's data in place. Bytes that are not UTF-8 are refused, naming
    the header, rather than guessed at."""
    if value is None or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise InvalidRequest(f"{field} must be UTF-8 text", field=field) from None


async def authenticate(
    svc: Services,
    agent_id: str,
    authorization: str | None,
    x_memstream_user: str | None,
    x_memstream_user_token: str | None = None,
) -> Caller:
    """The caller of a request on any agent surface (the routes and the MCP endpoint).

    The account comes from the API key, or from a signed user token sent alone as the
    bearer; the user from a signed user token (``X-Memstream-User-Token``, or the bearer
    token) or, unless the account requires tokens, from ``X-Memstream-User``."""
    user_header = utf8_header(x_memstream_user, "X-Memstream-User")
    asserted = user_header.strip() if user_header and user_header.strip() else None
    bearer = bearer_of(authorization) or ""
    admin = False
    user_id: str | None
    if bearer.startswith(user_tokens.PREFIX):
        token = await _user_token(svc, bearer)
        account_id, user_id = token.account_id, token.user_id
    else:
        info = await key_of(svc, authorization)
        account_id, admin = info.account_id, info.admin
        if x_memstream_user_token:
            token = await _user_token(svc, x_memstream_user_token.strip())
            if token.account_id != account_id:
                raise Unauthorized(
                    "the user token belongs to another account", field="X-Memstream-User-Token"
                )
            user_id = token.user_id
        elif not admin and await svc.accounts.requires_user_tokens(account_id):
            raise Unauthorized(
                "this account requires a signed user token (X-Memstream-User-Token)",
                field="X-Memstream-User-Token",
            )
        else:
            user_id = None if asserted is None else check_id(asserted, "X-Memstream-User")
            asserted = None
    if asserted is not None and asserted != user_id:
        raise Unauthorized(
            "X-Memstream-User differs from the user of the token", field="X-Memstream-User"
        )
    check_id(agent_id, "agent_id")
    await svc.accounts.touch_agent(account_id, agent_id)
    return Caller(account_id=account_id, agent_id=agent_id, user_id=user_id, admin=admin)


async def services_dep(request: Request) -> Services:
    """:func:`services` as a dependency. ``async`` on purpose: FastAPI runs a plain ``def``
    dependency in its threadpool, a thread hop on every request (0.5-2 ms under load)."""
    return services(request)


ServicesDep = Annotated[Services, Depends(services_dep)]
CallerDep = Annotated[Caller, Depends(caller)]
KeyDep = Annotated[KeyInfo, Depends(key_info)]
