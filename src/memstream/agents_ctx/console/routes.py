"""The console's pages under ``/console``.

Every page but the login form needs a session (no session: a GET is redirected to the login
form, anything else is refused with 401); every POST needs the session's CSRF token (403
without it). Pages are rendered on the server; htmx swaps the parts that refresh (the
overview's figures every two seconds, the dead-letter list after a retry, replay progress),
and ``console.js`` draws the lag chart with uPlot from ``/console/overview/lag.json``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from memstream.agents_ctx.console.ports import Letter, Operations
from memstream.agents_ctx.console.sessions import (
    COOKIE,
    CSRF_FIELD,
    CSRF_HEADER,
    Session,
    credential_ok,
    csrf_ok,
)
from memstream.agents_ctx.console.state import ConsoleState, ReplayRun
from memstream.agents_ctx.context import window_size
from memstream.agents_ctx.http.deps import services
from memstream.agents_ctx.http.responses import JSONResponse
from memstream.agents_ctx.journal_tools import journal_message_search, journal_tool_call_view
from memstream.agents_ctx.services import Services
from memstream.agents_ctx.validation import check_id, query_int
from memstream.errors import InfraError, MemstreamError, NotFound, Unauthorized
from memstream.infra.llm.summary import ExtractiveSummaryModel
from memstream.projections.replay import PROJECTIONS, check_projection
from memstream.schemas.records import Caller, Summary, ThreadRef

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.globals["PROJECTIONS"] = PROJECTIONS


def static_files() -> StaticFiles:
    return StaticFiles(directory=str(HERE / "static"))


class NotLoggedIn(Exception):
    """A page asked for without a session: redirect (GET) or refuse."""


def console_state(request: Request) -> ConsoleState:
    st = getattr(request.app.state, "console", None)
    if st is None:
        st = ConsoleState()
        request.app.state.console = st
    assert isinstance(st, ConsoleState)
    return st


def _session(request: Request) -> Session:
    s = console_state(request).sessions.get(request.cookies.get(COOKIE))
    if s is None:
        if request.method == "GET" and "hx-request" not in request.headers:
            raise NotLoggedIn
        raise Unauthorized("log in to the console first", field="session")
    return s


async def _checked(request: Request) -> Session:
    """Session and CSRF token of a state-changing request."""
    s = _session(request)
    given = request.headers.get(CSRF_HEADER)
    if given is None:
        form = await request.form()
        raw = form.get(CSRF_FIELD)
        given = raw if isinstance(raw, str) else None
    if not csrf_ok(s, given):
        raise Forbidden
    return s


class Forbidden(Exception):
    pass


SessionDep = Annotated[Session, Depends(_session)]
CheckedDep = Annotated[Session, Depends(_checked)]

router = APIRouter(prefix="/console", include_in_schema=False)


def _ops(svc: Services) -> Operations:
    if svc.operations is None:
        raise InfraError("the console's pipeline view is not available in this process")
    return svc.operations


def page(request: Request, name: str, session: Session | None, **ctx: object) -> HTMLResponse:
    ctx.update(
        request=request, csrf=session.csrf if session else "", nav=name.split(".", maxsplit=1)[0]
    )
    return templates.TemplateResponse(request, name, ctx)


# --- login -----------------------------------------------------------------------------------
@router.get("/login")
async def login_form(request: Request) -> HTMLResponse:
    return page(request, "login.html", None, error=None)


@router.post("/login", response_model=None)
async def login(request: Request) -> Response:
    form = await request.form()
    given = form.get("key")
    expected = services(request).settings.admin_token.get_secret_value()
    if not isinstance(given, str) or not credential_ok(expected, given.strip()):
        resp = page(request, "login.html", None, error="That admin key is not valid.")
        resp.status_code = 401
        return resp
    s = console_state(request).sessions.open()
    ok = RedirectResponse("/console", status_code=303)
    ok.set_cookie(
        COOKIE,
        s.sid,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/console",
        max_age=int(console_state(request).sessions.ttl_s),
    )
    return ok


@router.post("/logout")
async def logout(request: Request, session: CheckedDep) -> RedirectResponse:
    console_state(request).sessions.close(session.sid)
    console_state(request).memory_keys.pop(session.sid, None)
    resp = RedirectResponse("/console/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/console")
    return resp


# --- overview --------------------------------------------------------------------------------
@router.get("")
async def overview(request: Request, session: SessionDep) -> HTMLResponse:
    ctx = await _overview_ctx(request)
    return page(request, "overview.html", session, **ctx)


@router.get("/overview/live")
async def overview_live(request: Request, session: SessionDep) -> HTMLResponse:
    return page(request, "_overview_live.html", session, **await _overview_ctx(request))


@router.get("/overview/lag.json")
async def lag_json(request: Request, session: SessionDep) -> JSONResponse:
    st = console_state(request)
    st.watch(_ops(services(request)))
    return JSONResponse(st.history.series())


async def _overview_ctx(request: Request) -> dict[str, object]:
    svc = services(request)
    ops = _ops(svc)
    st = console_state(request)
    st.watch(ops)
    if st.history.latest() is None:
        await st.sample_now(ops)
    latest = st.history.latest()
    commits = ops.last_commits()
    now = time.time()
    procs = []
    rows = list(latest.rows) if latest else []
    for name in ops.processors():
        mine = [r for r in rows if r.processor == name]
        lc = commits.get(name)
        procs.append(
            {
                "name": name,
                "rows": mine,
                "lag": sum(r.lag for r in mine),
                "since_commit": None if lc is None else max(0.0, now - lc),
            }
        )
    try:
        backlog: dict[str, int] | None = await ops.relay_backlog()
    except Exception:
        backlog = None
    ready = await svc.readiness.report()
    return {
        "health": ready["parts"],
        "health_errors": ready["errors"],
        "loops": ready.get("loops") or {},
        "servers": ready.get("servers") or {},
        "procs": procs,
        "rates": st.history.events_per_s(),
        "backlog": backlog,
        "sampled": latest.ts if latest else None,
        "error": st.last_error,
    }


# --- dead letters ----------------------------------------------------------------------------
def _letter_filter(request: Request) -> dict[str, str]:
    q = request.query_params
    return {
        "processor": q.get("processor", ""),
        "origin": q.get("origin", ""),
        "state": q.get("state", "failing") or "failing",
    }


def _keep(d: Letter, f: dict[str, str]) -> bool:
    if f["processor"] and d.processor != f["processor"]:
        return False
    if f["origin"] and d.origin_topic != f["origin"]:
        return False
    if f["state"] == "failing":
        return d.retried_at is None
    if f["state"] == "retried":
        return d.retried_at is not None
    return True


async def _letters_ctx(request: Request) -> dict[str, object]:
    ops = _ops(services(request))
    f = _letter_filter(request)
    letters = await ops.dead_letters(500)
    return {
        "filter": f,
        "letters": [d for d in reversed(letters) if _keep(d, f)],
        "processors": sorted({d.processor for d in letters} | set(ops.processors())),
        "origins": sorted({d.origin_topic for d in letters}),
        "outcome": None,
    }


@router.get("/dlq")
async def dlq(request: Request, session: SessionDep) -> HTMLResponse:
    return page(request, "dlq.html", session, **await _letters_ctx(request))


@router.get("/dlq/list")
async def dlq_list(request: Request, session: SessionDep) -> HTMLResponse:
    return page(request, "_dlq_list.html", session, **await _letters_ctx(request))


@router.get("/dlq/letter/{letter_id:path}")
async def dlq_letter(letter_id: str, request: Request, session: SessionDep) -> HTMLResponse:
    letters = await _ops(services(request)).dead_letters(500)
    found = next((d for d in letters if d.id == letter_id), None)
    if found is None:
        raise NotFound(f"no dead letter {letter_id!r} among the latest 500", field="id")
    return page(request, "letter.html", session, letter=found)


@router.post("/dlq/retry")
async def dlq_retry(request: Request, session: CheckedDep) -> HTMLResponse:
    form = await request.form()
    ids = [v for v in form.getlist("id") if isinstance(v, str) and v]
    ops = _ops(services(request))
    outcome = await ops.retry(ids) if ids else None
    ctx = await _letters_ctx(request)
    ctx["outcome"] = outcome
    ctx["nothing"] = not ids
    return page(request, "_dlq_list.html", session, **ctx)


# --- threads ---------------------------------------------------------------------------------
def _caller(request: Request) -> Caller | None:
    q = request.query_params
    account, agent = q.get("account", "").strip(), q.get("agent", "").strip()
    if not account or not agent:
        return None
    return Caller(check_id(account, "account"), check_id(agent, "agent"))


@router.get("/threads")
async def threads(request: Request, session: SessionDep) -> HTMLResponse:
    svc = services(request)
    caller = _caller(request)
    query = request.query_params.get("q", "").strip()
    result = None
    if caller is not None and query:
        if svc.message_store is None:
            raise InfraError("transcript search is not available in this process")
        result = await journal_message_search(
            caller,
            query,
            limit=50,
            summarize=False,
            store=svc.message_store,
            summarizer=ExtractiveSummaryModel(),
            threads=svc.threads,
            every_user=True,  # the operator sees every user's threads (docs/console.md)
        )
    return page(
        request,
        "threads.html",
        session,
        caller=caller,
        query=query,
        hits=result.results if result else None,
        q=request.query_params,
    )


@router.get("/threads/{account}/{agent}/{thread}")
async def thread(
    account: str, agent: str, thread: str, request: Request, session: SessionDep
) -> HTMLResponse:
    svc = services(request)
    ref = ThreadRef(
        check_id(account, "account"), check_id(agent, "agent"), check_id(thread, "thread")
    )
    picked = query_int(request.query_params.get("version"), "version", 0)
    info = await svc.accounts.get_thread(ref)
    if info is None:
        raise NotFound(f"no thread {ref.key!r}", field="thread")
    journal = svc.need_journal()
    window = await journal.last(ref, window_size(info.config))
    summary: Summary | None = None
    versions: list[int] = []
    if svc.summary_store is not None:
        current = await svc.summary_store.get(ref)
        if current is not None:
            versions = list(range(current.version, 0, -1))
            summary = current
            if 0 < picked < current.version:
                summary = await svc.summary_store.get_version(ref, picked)
    return page(
        request,
        "thread.html",
        session,
        ref=ref,
        window=window,
        summary=summary,
        versions=versions,
        metadata=info.metadata,
    )


class _Operator:
    """Thread visibility for an admin: every thread of every user (the console is not an
    end user's surface)."""

    async def visible(self, caller: Caller, ref: ThreadRef) -> bool:
        return True


@router.get("/toolcalls/{account}/{agent}/{tool_call_id}")
async def tool_call(
    account: str, agent: str, tool_call_id: str, request: Request, session: SessionDep
) -> HTMLResponse:
    svc = services(request)
    offset = query_int(request.query_params.get("offset"), "offset", 0)
    p = await journal_tool_call_view(
        Caller(check_id(account, "account"), check_id(agent, "agent")),
        tool_call_id,
        offset=offset,
        length=4096,
        journal=svc.need_journal(),
        threads=_Operator(),
        thread_id=request.query_params.get("thread") or None,
    )
    thread = request.query_params.get("thread", "")
    return page(
        request, "_toolcall.html", session, p=p, account=account, agent=agent, thread=thread
    )


# --- replay ----------------------------------------------------------------------------------
@router.get("/replay")
async def replay(request: Request, session: SessionDep) -> HTMLResponse:
    return page(request, "replay.html", session, **await _replay_ctx(request))


@router.get("/replay/status")
async def replay_status(request: Request, session: SessionDep) -> HTMLResponse:
    return page(request, "_replay_status.html", session, **await _replay_ctx(request))


async def _replay_ctx(request: Request) -> dict[str, object]:
    svc = services(request)
    gens: dict[str, int] = {}
    if svc.replays is not None:
        got = await svc.replays.state.generations()
        gens = {p: got.get(p, 1) for p in svc.replays.sinks}
    runs = console_state(request).replays
    return {
        "generations": gens,
        "runs": sorted(runs.values(), key=lambda r: -r.started),
        "active": any(r.running for r in runs.values()),
    }


@router.post("/replay")
async def start_replay(request: Request, session: CheckedDep) -> HTMLResponse:
    svc = services(request)
    form = await request.form()
    name = check_projection(form.get("projection"))
    from_journal = form.get("from_journal") == "on"
    if svc.replays is None:
        raise InfraError("replays are not available in this process")
    runs = svc.replays.run(name, from_journal=from_journal)
    first = await anext(runs)  # a bad request fails here, as a plain error
    run = ReplayRun(name, time.time(), first.to_dict())

    async def follow() -> None:
        try:
            async for p in runs:
                run.last = p.to_dict()
        except MemstreamError as e:
            run.error = e.message
        except Exception as e:
            run.error = str(e)

    run.task = asyncio.create_task(follow(), name=f"console-replay-{name}")
    console_state(request).replays[name] = run
    return page(request, "_replay_status.html", session, **await _replay_ctx(request))


def _ms_time(ms: object) -> str:
    import datetime as dt

    if not isinstance(ms, int) or ms < 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["ms_time"] = _ms_time
