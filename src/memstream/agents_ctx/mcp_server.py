"""The MCP surface: exactly the three memory tools, over any backend.

``memory_store``, ``memory_recall`` and ``memory_forget`` (typed input schemas, structured
results shaped like the HTTP answers). Where they run:

- **In the API process** at ``/v1/agents/{agent_id}/mcp`` (streamable HTTP,
  :mod:`memstream.agents_ctx.mcp_http`): authenticated by the same bearer API key and the
  same ``X-Memstream-User`` header as every route, through the same ``MemoryService`` (so
  recall uses the live index). The backend is chosen per request from the caller.
- **Over stdio** (``memstream mcp``): a bridge to a running system over its HTTP API
  (:class:`ClientTools`), for MCP hosts that launch a command.

Guarantees:

- **Three tools, never more**: the journal tools (message search, tool-call view) and
  context assembly are not registered here; a test lists the tools through a real MCP
  client session.
- **Gateway behaviour**: without a user a ``private`` store is stored as ``shared`` (the
  spec's rule, applied by ``MemoryService``); recall and forget see only shared entries.
- **Errors**: a refused call is an MCP tool error (``isError``) whose text carries the
  memstream error code and names the field, e.g.
  ``invalid_request (field: importance): importance must be between 0 and 1`` — the same
  code and field as over HTTP, because the arguments are validated by the memory rules,
  not by the tool schema, after the checks an HTTP body gets (``validation.check_json``:
  no NUL character, bounded nesting; ``invalid_request (field: content)`` for a NUL in
  ``content``). A required argument left out reaches the memory rules as None, as a
  field missing from an HTTP body does (``invalid_request (field: key): key must be a
  string``). Nothing is written on a refused call. ``limit`` above 20 is
  lowered to 20, as on HTTP.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Protocol

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from pydantic import WithJsonSchema

from memstream import __version__
from memstream.agents_ctx.memory.store import MemoryService
from memstream.agents_ctx.validation import check_json
from memstream.errors import MemstreamError
from memstream.schemas.limits import RECALL_MAX_LIMIT
from memstream.schemas.records import CATEGORIES, VISIBILITIES, Caller

log = logging.getLogger(__name__)

TOOL_NAMES: tuple[str, ...] = ("memory_store", "memory_recall", "memory_forget")

_CATEGORIES = list(CATEGORIES)


class MemoryTools(Protocol):
    """What the three tools call: answers shaped like the HTTP routes' (``MemstreamError``
    on refusal)."""

    async def store(
        self, key: object, content: object, category: object, scope: object, importance: object
    ) -> dict[str, Any]: ...

    async def recall(self, query: object, limit: object, category: object) -> dict[str, Any]: ...

    async def forget(self, key: object) -> dict[str, Any]: ...


ToolsFor = Callable[[Context], MemoryTools]
"""The backend for one tool call (the HTTP endpoint picks it from the request's caller)."""


class ServiceTools:
    """The tools over ``MemoryService`` for one caller (in the API process)."""

    def __init__(self, memory: MemoryService, caller: Caller) -> None:
        self._memory = memory
        self._caller = caller

    async def store(
        self, key: object, content: object, category: object, scope: object, importance: object
    ) -> dict[str, Any]:
        r = await self._memory.store(self._caller, key, content, category, scope, importance)
        return {"status": r.status, "entry": r.entry.to_dict()}

    async def recall(self, query: object, limit: object, category: object) -> dict[str, Any]:
        r = await self._memory.recall(self._caller, query, limit=limit, category=category)
        results = []
        for entry, score in r.results:
            item: dict[str, Any] = dict(entry.to_dict())
            item["score"] = score
            results.append(item)
        return {"results": results, "source": r.source}

    async def forget(self, key: object) -> dict[str, Any]:
        return {"forgotten": await self._memory.forget(self._caller, key)}


def _checked(**arguments: object) -> None:
    """A tool's arguments through the checks the HTTP routes give their body
    (``bodies.read_object``: ``check_json``), naming the same field: a NUL character would
    otherwise reach Postgres, which refuses it in text."""
    check_json(arguments, "")


def _tool_error(e: MemstreamError) -> ToolError:
    where = f" (field: {e.field})" if e.field else ""
    return ToolError(f"{e.code}{where}: {e.message}")


# Arguments are advertised with a typed schema but validated by the memory rules, so a bad
# value is refused with memstream's code and field, never a raw pydantic message.
def _schema(schema: dict[str, Any], description: str) -> WithJsonSchema:
    return WithJsonSchema(schema | {"description": description})


_STR = {"type": "string"}
KeyArg = Annotated[Any, _schema(_STR, "A short stable name for the fact.")]
ContentArg = Annotated[Any, _schema(_STR, "The fact, in one or two sentences.")]
CategoryArg = Annotated[
    Any, _schema({"type": "string", "enum": _CATEGORIES}, "What kind of fact this is.")
]
ScopeArg = Annotated[
    Any,
    _schema(
        {"type": "string", "enum": list(VISIBILITIES)},
        "'private' (this user only) or 'shared' (every user of the agent).",
    ),
]
ImportanceArg = Annotated[
    Any,
    _schema({"type": ["number", "null"], "minimum": 0, "maximum": 1}, "0.0-1.0, default 0.5."),
]
QueryArg = Annotated[Any, _schema(_STR, "What to look for, in natural language.")]
LimitArg = Annotated[
    Any,
    _schema(
        {"type": ["integer", "null"], "minimum": 1},
        f"How many results, default 5; more than {RECALL_MAX_LIMIT} is lowered to "
        f"{RECALL_MAX_LIMIT}.",
    ),
]
CategoryFilterArg = Annotated[
    Any,
    _schema(
        {"type": ["string", "null"], "enum": [*_CATEGORIES, None]}, "Only facts of this category."
    ),
]
ForgetKeyArg = Annotated[Any, _schema(_STR, "The key of the fact to delete.")]


@contextlib.contextmanager
def _root_logging_kept() -> Iterator[None]:
    """Undo what a library does to the root logger meanwhile. ``MCPServer()`` calls
    ``logging.basicConfig(level="INFO", handlers=[RichHandler(...)])``: in a process that
    had not configured logging (a test, a bench, an application embedding ``create_app``)
    every INFO line -- the access log's one per request included -- then went through rich
    (~3 ms a line, 17% of the event loop in ``bench/http_append.py``)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _tool(fn: Callable[..., Any], name: str, description: str, *required: str) -> Tool:
    """``fn`` as a tool whose schema advertises ``required``. Those arguments default to
    None in ``fn``, so a call without one reaches the memory rules like an HTTP body without
    the field (``invalid_request (field: key): key must be a string``), not the schema
    validation's raw pydantic message."""
    tool = Tool.from_function(fn, name=name, description=description)
    properties: dict[str, Any] = tool.parameters["properties"]
    for arg in required:
        properties[arg].pop("default", None)
    tool.parameters["required"] = list(required)
    return tool


def build_mcp_server(tools_for: ToolsFor) -> MCPServer:
    """An MCP server with the three memory tools; ``tools_for`` gives each call's backend."""

    async def memory_store(
        ctx: Context,
        key: KeyArg = None,
        content: ContentArg = None,
        category: CategoryArg = None,
        scope: ScopeArg = None,
        importance: ImportanceArg = None,
    ) -> dict[str, Any]:
        try:
            _checked(
                key=key, content=content, category=category, scope=scope, importance=importance
            )
            return await tools_for(ctx).store(key, content, category, scope, importance)
        except MemstreamError as e:
            raise _tool_error(e) from None

    async def memory_recall(
        ctx: Context,
        query: QueryArg = None,
        limit: LimitArg = None,
        category: CategoryFilterArg = None,
    ) -> dict[str, Any]:
        try:
            _checked(query=query, limit=limit, category=category)
            return await tools_for(ctx).recall(query, limit, category)
        except MemstreamError as e:
            raise _tool_error(e) from None

    async def memory_forget(
        ctx: Context,
        key: ForgetKeyArg = None,
    ) -> dict[str, Any]:
        try:
            _checked(key=key)
            return await tools_for(ctx).forget(key)
        except MemstreamError as e:
            raise _tool_error(e) from None

    tools = [
        _tool(
            memory_store,
            "memory_store",
            "Store a durable fact under a key. Storing the same content again is a no-op; "
            "new content under an existing key replaces it. 'private' facts belong to the "
            "current user (stored as 'shared' when there is no authenticated user).",
            "key",
            "content",
            "category",
            "scope",
        ),
        _tool(
            memory_recall,
            "memory_recall",
            "Find the stored facts most relevant to a query, best first.",
            "query",
        ),
        _tool(memory_forget, "memory_forget", "Delete the fact stored under a key.", "key"),
    ]
    with _root_logging_kept():
        return MCPServer(
            name="memstream",
            version=__version__,
            instructions=(
                "Curated long-term memory for this agent. memory_store saves a durable fact "
                "under a key, memory_recall finds facts relevant to a query, memory_forget "
                "deletes a fact by key."
            ),
            tools=tools,
        )


def fixed_tools(tools: MemoryTools) -> ToolsFor:
    """Every call goes to ``tools`` (stdio: one process, one caller)."""
    return lambda _ctx: tools


def local_mcp_server(memory: MemoryService, caller: Caller) -> MCPServer:
    """The tools over ``memory`` for one fixed caller (tests, embedding in a process)."""
    return build_mcp_server(fixed_tools(ServiceTools(memory, caller)))
