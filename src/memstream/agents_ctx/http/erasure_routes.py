"""Erasure over HTTP (see ``agents_ctx/erasure.py`` and docs/owning-memory.md).

- ``POST /v1/agents/{agent_id}/threads/{thread_id}/erase`` → 202 ``{"erasure_id"}``
- ``POST /v1/users/{user_id}/erase`` (admin key: every agent of the account) → 202
  ``{"erasure_id"}``
- ``GET  /v1/erasures/{erasure_id}`` → ``{"erasure_id", "kind", "status": "running" |
  "done", "step", "stores": {name: count}}`` (``step``: what it is doing, or where a failed
  run stopped; null once done). An API key of the account reads any of its erasures; a user
  token alone (the browser of a user who erased their own thread) reads the erasures of
  that user's threads, and gets 404, as for no erasure, for any other.

A second POST while an erasure of the same target runs answers the same ``erasure_id``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from memstream.agents_ctx.access import (
    may_remove_thread,
    may_use_thread,
    not_found,
    shared_thread_refused,
)
from memstream.agents_ctx.erasure import Erasures
from memstream.agents_ctx.http.contract import contract
from memstream.agents_ctx.http.deps import (
    CallerDep,
    KeyDep,
    ServicesDep,
    bearer_token,
    key_of,
)
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import check_id
from memstream.errors import Forbidden, InfraError, NotFound
from memstream.schemas import wire
from memstream.schemas.records import ThreadRef

router = APIRouter()


def _erasures(svc: Services) -> Erasures:
    if svc.erasures is None:
        raise InfraError("erasure is not available in this process")
    return svc.erasures


@router.post(
    "/v1/agents/{agent_id}/threads/{thread_id}/erase",
    status_code=202,
    **contract(answer=wire.ErasureStarted, errors=(400, 401, 403, 404, 503)),
)
async def erase_thread(thread_id: str, caller: CallerDep, svc: ServicesDep) -> JSONResponse:
    ref = ThreadRef(caller.account_id, caller.agent_id, check_id(thread_id, "thread_id"))
    thread = await svc.accounts.get_thread(ref)
    # the owner (or an admin key) may erase a thread, deleted or not; others see no thread;
    # a user may not erase a shared thread (every other user's too)
    if thread is None or not (caller.admin or may_use_thread(thread.owner, caller.user_id)):
        raise not_found(ref.thread_id)
    if not may_remove_thread(thread.owner, caller):
        raise shared_thread_refused(ref.thread_id)
    erasure_id = await _erasures(svc).erase_thread(ref)
    return JSONResponse({"erasure_id": erasure_id}, status_code=202)


@router.post(
    "/v1/users/{user_id}/erase",
    status_code=202,
    **contract(answer=wire.ErasureStarted, errors=(400, 401, 403, 503)),
)
async def erase_user(user_id: str, key: KeyDep, svc: ServicesDep) -> JSONResponse:
    if not key.admin:
        raise Forbidden("erasing a user needs an admin key", field="Authorization")
    erasure_id = await _erasures(svc).erase_user(key.account_id, check_id(user_id, "user_id"))
    return JSONResponse({"erasure_id": erasure_id}, status_code=202)


@router.get(
    "/v1/erasures/{erasure_id}", **contract(answer=wire.Erasure, errors=(400, 401, 404, 503))
)
async def erasure_status(
    erasure_id: str,
    svc: ServicesDep,
    authorization: Annotated[str | None, Header()] = None,
) -> JSONResponse:
    eid = check_id(erasure_id, "erasure_id")
    token = await bearer_token(svc, authorization)
    if token is None:
        key = await key_of(svc, authorization)
        return JSONResponse((await _erasures(svc).get(key.account_id, eid)).to_dict())
    # a user token: the erasure of one of that user's own threads, or nothing at all
    erasure = await _erasures(svc).get(token.account_id, eid)
    thread = (
        None
        if erasure.kind != "thread" or erasure.agent_id is None or erasure.thread_id is None
        else await svc.accounts.get_thread(
            ThreadRef(token.account_id, erasure.agent_id, erasure.thread_id)
        )
    )
    if thread is None or thread.owner != token.user_id:
        raise NotFound(f"no erasure {eid!r}", field="erasure_id")
    return JSONResponse(erasure.to_dict())
