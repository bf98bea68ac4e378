"""The operator console: ``/console``, server-rendered pages (Jinja2 + htmx) served by the
API process, behind the deployment's admin credential (a login form, a session cookie,
CSRF on every action). Every asset is served from ``static/`` (htmx and uPlot vendored from
npm); nothing is loaded from a CDN. ``mount(app)`` is the one entry point.
"""

from __future__ import annotations

from fastapi import FastAPI


def mount(app: FastAPI) -> None:
    """Add the console's routes and static files to ``app`` (kept out of the OpenAPI schema)."""
    from fastapi import Request
    from fastapi.responses import HTMLResponse, RedirectResponse

    from memstream.agents_ctx.console.memory_pages import router as memory_router
    from memstream.agents_ctx.console.routes import (
        Forbidden,
        NotLoggedIn,
        router,
        static_files,
    )

    async def to_login(request: Request, exc: Exception) -> RedirectResponse:
        return RedirectResponse("/console/login", status_code=303)

    async def forbidden(request: Request, exc: Exception) -> HTMLResponse:
        return HTMLResponse("<p>Refused: missing or wrong CSRF token.</p>", status_code=403)

    app.add_exception_handler(NotLoggedIn, to_login)
    app.add_exception_handler(Forbidden, forbidden)
    app.mount("/console/static", static_files(), name="console-static")
    app.include_router(router)
    app.include_router(memory_router)


async def stop(app: FastAPI) -> None:
    """Cancel the console's background work (the lag sampler, replays it started)."""
    from memstream.agents_ctx.console.state import ConsoleState

    st = getattr(app.state, "console", None)
    if isinstance(st, ConsoleState):
        await st.stop()
