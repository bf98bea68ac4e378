"""``MemstreamClient``: the async Python API over memstream's HTTP API.

The same operations, with the same names, as the HTTP routes (ARCHITECTURE.md):
``configure_agent``, ``create_thread``, ``append``, ``context``, ``summary``,
``delete_thread``, ``memory_store``, ``memory_recall``, ``memory_forget``,
``journal_search`` and ``tool_call_view``; owning memory: ``memory_entries`` (and
``iter_memory_entries``), ``memory_entry``, ``memory_edit``, ``memory_export``,
``memory_import``, ``erase_thread``, ``erase_user``, ``erasure``. Answers are the JSON
documents the API returns.

Guarantees:

- **Errors are memstream's own classes**: an error answer is raised as the
  :mod:`memstream.errors` class its ``code`` names (``InvalidRequest`` with ``field``,
  ``NotFound``, ``PromptInjection``, ``JournalUnavailable``...); an unknown code becomes
  :class:`~memstream.errors.MemstreamError` with the answer's message.
- **Ids are path-escaped**, so no id can address another route.
- The client owns its ``httpx.AsyncClient`` unless one is passed in (tests pass an ASGI
  transport to drive an app in-process); use it as an async context manager or call
  :meth:`MemstreamClient.aclose`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, cast
from urllib.parse import quote

import httpx

from memstream import errors

_ERRORS: Final[dict[str, type[errors.MemstreamError]]] = {
    cls.code: cls
    for cls in (
        errors.InvalidRequest,
        errors.PromptInjection,
        errors.PrivateRequiresUser,
        errors.ContentTooLong,
        errors.Unauthorized,
        errors.MemoryNotBound,
        errors.Forbidden,
        errors.NotFound,
        errors.CapacityExceeded,
        errors.Conflict,
        errors.JournalUnavailable,
        errors.InfraError,
    )
}

JSON = dict[str, Any]


def _given(**fields: Any) -> JSON:
    """The fields that were given (not None): a body's optional fields, a query string."""
    return {k: v for k, v in fields.items() if v is not None}


def _p(value: str) -> str:
    """``value`` as one path segment: every reserved character escaped, and ``.`` / ``..``
    (which ``quote`` leaves, and httpx would resolve as dot segments, reaching the parent
    route) as ``%2E`` / ``%2E%2E``, which httpx sends as they are and the server decodes."""
    if value in (".", ".."):
        return "%2E" * len(value)
    return quote(value, safe="")


def _id(value: str, field: str) -> str:
    """An id as one path segment (:func:`_p`). The server refuses ``/`` and ``\\`` in ids, but
    a ``%2F`` is decoded before routing, so the request would reach no route and come back
    a bare 404: refused here instead, naming the field, as the server does for the rest."""
    if "/" in value or "\\" in value:
        raise errors.InvalidRequest(f"{field} must not contain '/' or '\\'", field=field)
    return _p(value)


def error_from(status: int, body: object) -> errors.MemstreamError:
    """The memstream error for an error answer (``{"error": {"code", "message", "field"?}}``)."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return errors.MemstreamError(f"HTTP {status}: {str(body)[:200]}")
    code, message, field = err.get("code"), str(err.get("message", "")), err.get("field")
    if code == "not_ready":
        position = err.get("position")
        return errors.NotReady(message, position=position if isinstance(position, int) else None)
    cls = _ERRORS.get(str(code))
    if cls is None:
        out = errors.MemstreamError(message or f"HTTP {status}")
        out.code, out.status = str(code or "internal"), status
        return out
    return cls(message, field=field if isinstance(field, str) else None)


class MemstreamClient:
    """An async client for one account (``api_key``) and, optionally, one end user."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        user: str | None = None,
        *,
        timeout: float = 30.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        headers = [(b"Authorization", f"Bearer {api_key}".encode())]
        if user is not None:  # UTF-8 bytes: httpx would encode a str as ASCII only
            headers.append((b"X-Memstream-User", user.encode("utf-8")))
        self._headers = httpx.Headers(headers)
        self._own = http is None
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def __aenter__(self) -> MemstreamClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        body: object = None,
        params: Mapping[str, str | int] | None = None,
    ) -> JSON | None:
        r = await self._http.request(
            method,
            path,
            json=body,
            params=dict(params) if params else None,
            headers=self._headers,
        )
        if r.status_code == 204:
            return None
        try:
            doc = r.json()
        except ValueError:
            doc = r.text
        if r.status_code >= 400:
            raise error_from(r.status_code, doc)
        return cast(JSON, doc)

    async def _json(self, method: str, path: str, body: object = None, **params: Any) -> JSON:
        out = await self._call(method, path, body, _given(**params))
        assert out is not None
        return out

    @staticmethod
    def _agent(agent_id: str) -> str:
        return f"/v1/agents/{_id(agent_id, 'agent_id')}"

    def _thread(self, agent_id: str, thread_id: str) -> str:
        return f"{self._agent(agent_id)}/threads/{_id(thread_id, 'thread_id')}"

    # --- agents and threads --------------------------------------------------------------------
    async def configure_agent(self, agent_id: str, *, memory: bool) -> JSON:
        """Create or configure an agent; ``memory`` binds the Memory capability."""
        return await self._json("PUT", self._agent(agent_id), {"memory": memory})

    async def create_thread(
        self,
        agent_id: str,
        thread_id: str | None = None,
        *,
        max_working_memory_messages: int | None = None,
    ) -> JSON:
        """Create a thread (an id is generated when none is given)."""
        config = _given(max_working_memory_messages=max_working_memory_messages)
        body = {"metadata": {"config": config}} | _given(thread_id=thread_id)
        return await self._json("POST", f"{self._agent(agent_id)}/threads", body)

    async def append(
        self,
        agent_id: str,
        thread_id: str,
        messages: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    ) -> JSON:
        """Append one message (a mapping) or several (a sequence), durable when it returns."""
        body = dict(messages) if isinstance(messages, Mapping) else {"messages": list(messages)}
        return await self._json("POST", f"{self._thread(agent_id, thread_id)}/messages", body)

    async def context(
        self,
        agent_id: str,
        thread_id: str,
        *,
        parent_thread_id: str | None = None,
        parent_agent_id: str | None = None,
        format: str | None = None,  # noqa: A002 - the route's query parameter
        recap: bool = False,
    ) -> JSON:
        """The context for one turn: ``{"messages", "pinned", "summary", "window"}``, the
        messages in the OpenAI Chat Completions shape (``format="anthropic"``: Anthropic
        Messages turns plus ``"system"``). Pass ``parent_thread_id`` (and
        ``parent_agent_id``) for a delegated sub-agent. ``recap=True`` adds a digest of the
        messages in neither the summary nor the window (and ``"recap"`` in the answer)."""
        return await self._json(
            "GET",
            f"{self._thread(agent_id, thread_id)}/context",
            parent_thread_id=parent_thread_id,
            parent_agent_id=parent_agent_id,
            format=format,
            recap="true" if recap else None,
        )

    async def summary(self, agent_id: str, thread_id: str) -> JSON | None:
        """The thread's summary (the spec's seven fields), or None while it has none."""
        try:
            return await self._json("GET", f"{self._thread(agent_id, thread_id)}/summary")
        except errors.NotFound:
            return None

    async def delete_thread(self, agent_id: str, thread_id: str) -> None:
        """Delete the thread record (memory, summary and journal stay)."""
        await self._call("DELETE", self._thread(agent_id, thread_id))

    # --- memory tools --------------------------------------------------------------------------
    async def memory_store(
        self,
        agent_id: str,
        key: str,
        content: str,
        category: str,
        scope: str,
        importance: float | None = None,
    ) -> JSON:
        body = {"key": key, "content": content, "category": category, "scope": scope}
        body |= _given(importance=importance)
        return await self._json("POST", f"{self._agent(agent_id)}/memory/store", body)

    async def memory_recall(
        self,
        agent_id: str,
        query: str,
        limit: int | None = None,
        category: str | None = None,
        *,
        after: int | None = None,
    ) -> JSON:
        """``after``: a write's ``position`` (read-your-writes): the answer waits until the
        index applied it (``NotReady`` if it does not in time)."""
        body = {"query": query} | _given(limit=limit, category=category, after=after)
        return await self._json("POST", f"{self._agent(agent_id)}/memory/recall", body)

    async def memory_forget(self, agent_id: str, key: str) -> bool:
        out = await self._json("POST", f"{self._agent(agent_id)}/memory/forget", {"key": key})
        return bool(out["forgotten"])

    # --- owning memory (docs/owning-memory.md) --------------------------------------------------
    async def memory_entries(
        self,
        agent_id: str,
        *,
        category: str | None = None,
        visibility: str | None = None,
        user_id: str | None = None,
        q: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JSON:
        """One page of entries, newest first: ``{"entries", "next_cursor"}``."""
        return await self._json(
            "GET",
            f"{self._agent(agent_id)}/memory/entries",
            category=category,
            visibility=visibility,
            user_id=user_id,
            q=q,
            limit=limit,
            cursor=cursor,
        )

    async def iter_memory_entries(
        self, agent_id: str, **filters: str | int | None
    ) -> AsyncIterator[JSON]:
        """Every entry of the view, page after page (``memory_entries``' filters)."""
        cursor: str | None = None
        while True:
            page = await self._json(
                "GET", f"{self._agent(agent_id)}/memory/entries", cursor=cursor, **filters
            )
            for entry in page["entries"]:
                yield entry
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def memory_entry(self, agent_id: str, key: str, *, user_id: str | None = None) -> JSON:
        """One entry (``NotFound`` if there is none the caller can see)."""
        return await self._json(
            "GET", f"{self._agent(agent_id)}/memory/entries/{_p(key)}", user_id=user_id
        )

    async def memory_edit(
        self, agent_id: str, key: str, changes: Mapping[str, Any], *, user_id: str | None = None
    ) -> JSON:
        """PATCH ``content``, ``importance``, ``category``, ``expires_at``:
        ``{"status": "replaced" | "unchanged", "entry", "position"}``."""
        path = f"{self._agent(agent_id)}/memory/entries/{_p(key)}"
        return await self._json("PATCH", path, dict(changes), user_id=user_id)

    async def memory_export(
        self, agent_id: str, *, category: str | None = None, user_id: str | None = None
    ) -> AsyncIterator[JSON]:
        """Every entry, streamed from the NDJSON export."""
        params = {k: v for k, v in (("category", category), ("user_id", user_id)) if v}
        async with self._http.stream(
            "GET",
            f"{self._agent(agent_id)}/memory/export",
            params=params or None,
            headers=self._headers,
        ) as r:
            if r.status_code >= 400:
                body = await r.aread()
                try:
                    doc: object = json.loads(body)
                except ValueError:
                    doc = body.decode("utf-8", "replace")
                raise error_from(r.status_code, doc)
            async for line in r.aiter_lines():
                if line.strip():
                    yield cast(JSON, json.loads(line))

    async def memory_import(
        self, agent_id: str, lines: bytes | Iterable[Mapping[str, Any]]
    ) -> JSON:
        """Import NDJSON (bytes, or entries as mappings):
        ``{"created", "replaced", "unchanged", "failed": [{"line", "error"}]}``."""
        body = (
            lines
            if isinstance(lines, bytes)
            else b"".join(json.dumps(dict(e)).encode() + b"\n" for e in lines)
        )
        r = await self._http.post(
            f"{self._agent(agent_id)}/memory/import",
            content=body,
            headers=[*self._headers.raw, (b"Content-Type", b"application/x-ndjson")],
        )
        if r.status_code >= 400:
            raise error_from(r.status_code, r.json())
        return cast(JSON, r.json())

    # --- erasure -------------------------------------------------------------------------------
    async def erase_thread(self, agent_id: str, thread_id: str) -> str:
        """Start erasing a thread; returns the ``erasure_id`` (see ``erasure``)."""
        out = await self._json("POST", f"{self._thread(agent_id, thread_id)}/erase")
        return str(out["erasure_id"])

    async def erase_user(self, user_id: str) -> str:
        """Start erasing a user in every agent of the account (admin key)."""
        out = await self._json("POST", f"/v1/users/{_id(user_id, 'user_id')}/erase")
        return str(out["erasure_id"])

    async def erasure(self, erasure_id: str) -> JSON:
        """``{"erasure_id", "kind", "status": "running" | "done", "stores"}``."""
        return await self._json("GET", f"/v1/erasures/{_id(erasure_id, 'erasure_id')}")

    # --- journal tools -------------------------------------------------------------------------
    async def journal_search(
        self,
        agent_id: str,
        query: str,
        *,
        scope: str | None = None,
        thread_id: str | None = None,
        limit: int | None = None,
        summarize: bool | None = None,
        explain: bool | None = None,
        after: int | None = None,
    ) -> JSON:
        """``explain``: each hit carries its score's breakdown. ``after``: a write's
        ``position`` (read-your-writes): the answer waits until search has it (``NotReady``
        if it does not in time)."""
        body = {"query": query} | _given(
            scope=scope,
            thread_id=thread_id,
            limit=limit,
            summarize=summarize,
            explain=explain,
            after=after,
        )
        return await self._json("POST", f"{self._agent(agent_id)}/journal/search", body)

    async def tool_call_view(
        self,
        agent_id: str,
        tool_call_id: str,
        offset: int = 0,
        length: int | None = None,
        *,
        thread_id: str | None = None,
    ) -> JSON:
        return await self._json(
            "GET",
            f"{self._agent(agent_id)}/journal/tool-calls/{_id(tool_call_id, 'tool_call_id')}",
            offset=offset,
            length=length,
            thread_id=thread_id,
        )
