"""The console's Memory page: browse, filter, search, edit, forget and export an agent's
entries **through the owning-memory routes** (``/v1/agents/{agent}/memory/...``), called
in-process on the same app with an account's admin API key, so exactly the same rules,
screening and capacity checks apply as for any client.

The admin key is typed once into the page and kept server-side with the console session
(never in a cookie or in the page); logging out forgets it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import httpx
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from memstream.agents_ctx.console.routes import CheckedDep, SessionDep, console_state, page
from memstream.agents_ctx.console.sessions import Session

router = APIRouter(prefix="/console/memory", include_in_schema=False)

FIELDS = ("agent", "user", "category", "visibility", "q")


def _client(request: Request, key: str, user: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"}
    if user:
        headers["X-Memstream-User"] = user
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=request.app),
        base_url="http://console.internal",
        headers=headers,
        timeout=60,
    )


def _params(source: dict[str, str]) -> dict[str, str]:
    return {k: source.get(k, "").strip() for k in FIELDS}


def _error(r: httpx.Response) -> str:
    try:
        e = r.json()["error"]
        return f"{e.get('message')}" + (f" (field: {e['field']})" if e.get("field") else "")
    except Exception:
        return f"HTTP {r.status_code}"


async def _listing(
    request: Request, session: Session, f: dict[str, str], **extra: object
) -> HTMLResponse:
    key = console_state(request).memory_keys.get(session.sid, "")
    entries: list[dict[str, object]] = []
    next_cursor = None
    error = None
    if key and f["agent"]:
        query = {"limit": "50"}
        for name, param in (("user", "user_id"), ("category", "category"), ("q", "q")):
            if f[name]:
                query[param] = f[name]
        if f["visibility"]:
            query["visibility"] = f["visibility"]
        cursor = request.query_params.get("cursor")
        if cursor:
            query["cursor"] = cursor
        async with _client(request, key, None) as c:
            r = await c.get(f"/v1/agents/{quote(f['agent'], safe='')}/memory/entries", params=query)
        if r.status_code == 200:
            body = r.json()
            entries, next_cursor = body["entries"], body.get("next_cursor")
        else:
            error = _error(r)
    ctx: dict[str, object] = {
        "f": f,
        "have_key": bool(key),
        "entries": entries,
        "next_cursor": next_cursor,
        "error": error,
        "message": None,
    }
    ctx.update(extra)
    return page(request, "memory.html", session, **ctx)


@router.get("")
async def memory(request: Request, session: SessionDep) -> HTMLResponse:
    return await _listing(request, session, _params(dict(request.query_params)))


@router.post("/key")
async def set_key(request: Request, session: CheckedDep) -> HTMLResponse:
    form = await request.form()
    key = form.get("admin_key")
    f = _params({k: str(v) for k, v in form.items()})
    if isinstance(key, str) and key.strip():
        console_state(request).memory_keys[session.sid] = key.strip()
    return await _listing(request, session, f)


@router.post("/edit")
async def edit(request: Request, session: CheckedDep) -> HTMLResponse:
    form = await request.form()
    f = _params({k: str(v) for k, v in form.items()})
    entry_key = str(form.get("key", ""))
    body: dict[str, object] = {"content": str(form.get("content", ""))}
    raw_importance = str(form.get("importance", "")).strip()
    if raw_importance:
        try:
            body["importance"] = float(raw_importance)
        except ValueError:
            return await _listing(request, session, f, error="importance must be a number")
    key = console_state(request).memory_keys.get(session.sid, "")
    params = {"user_id": f["user"]} if f["user"] else {}
    async with _client(request, key, None) as c:
        r = await c.patch(
            f"/v1/agents/{quote(f['agent'], safe='')}/memory/entries/{quote(entry_key, safe='')}",
            json=body,
            params=params,
        )
    if r.status_code != 200:
        return await _listing(request, session, f, error=f"{entry_key}: {_error(r)}")
    return await _listing(request, session, f, message=f"{entry_key}: {r.json()['status']}")


@router.post("/forget")
async def forget(request: Request, session: CheckedDep) -> HTMLResponse:
    form = await request.form()
    f = _params({k: str(v) for k, v in form.items()})
    entry_key = str(form.get("key", ""))
    key = console_state(request).memory_keys.get(session.sid, "")
    async with _client(request, key, f["user"] or None) as c:
        r = await c.post(
            f"/v1/agents/{quote(f['agent'], safe='')}/memory/forget", json={"key": entry_key}
        )
    if r.status_code != 200:
        return await _listing(request, session, f, error=f"{entry_key}: {_error(r)}")
    done = "forgotten" if r.json().get("forgotten") else "was not there"
    return await _listing(request, session, f, message=f"{entry_key}: {done}")


@router.get("/export", response_model=None)
async def export(request: Request, session: SessionDep) -> Response:
    f = _params(dict(request.query_params))
    key = console_state(request).memory_keys.get(session.sid, "")
    params = {k: v for k, v in (("user_id", f["user"]), ("category", f["category"])) if v}
    c = _client(request, key, None)
    req = c.build_request(
        "GET", f"/v1/agents/{quote(f['agent'], safe='')}/memory/export", params=params
    )
    r = await c.send(req, stream=True)
    if r.status_code != 200:
        await r.aread()
        await c.aclose()
        return HTMLResponse(f"<p>Export refused: {_error(r)}</p>", status_code=r.status_code)

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in r.aiter_bytes():
                yield chunk
        finally:
            await r.aclose()
            await c.aclose()

    name = f"memory-{f['agent']}{'-' + f['user'] if f['user'] else ''}.ndjson"
    return StreamingResponse(
        body(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="{quote(name)}"'},
    )
