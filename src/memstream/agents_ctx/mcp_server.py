"""The MCP server: the gateway surface, exposing exactly the three memory tools.

``memory_store``, ``memory_recall`` and ``memory_forget`` (typed input schemas, structured
results shaped like the HTTP answers) for one configured account and agent, over stdio or
streamable HTTP (``memstream mcp --account A --agent B [--transport stdio|http]``).

Guarantees:

- **Three tools, never more**: the journal tools (message search, tool-call view) and
  context assembly are not registered here; a test lists the tools through a real MCP
  client session.
- **Gateway behaviour**: without an authenticated user (``user_id=None``) a ``private``
  store is stored as ``shared`` (``MemoryService`` applies the spec's rule), and recall and
  forget see only shared entries.
- **Errors**: a refused call is an MCP tool error (``isError``) whose text carries the
  memstream error code and names the field, e.g.
  ``invalid_request (field: importance): importance must be between 0 and 1``. Nothing is
  written on a refused call.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from memstream import __version__
from memstream.agents_ctx.memory.store import MemoryService
from memstream.agents_ctx.validation import check_id
from memstream.errors import MemstreamError, NotFound
from memstream.infra.settings import Settings
from memstream.schemas.limits import RECALL_MAX_LIMIT
from memstream.schemas.records import Caller

log = logging.getLogger(__name__)

TOOL_NAMES: tuple[str, ...] = ("memory_store", "memory_recall", "memory_forget")

Transport = Literal["stdio", "http"]
CategoryArg = Literal["user_profile", "project_fact", "observation"]


def _tool_error(e: MemstreamError) -> ToolError:
    where = f" (field: {e.field})" if e.field else ""
    return ToolError(f"{e.code}{where}: {e.message}")


def build_mcp_server(
    memory: MemoryService, account_id: str, agent_id: str, user_id: str | None = None
) -> MCPServer:
    """An MCP server bound to one (account, agent[, user]) with the three memory tools."""
    caller = Caller(
        check_id(account_id, "account_id"),
        check_id(agent_id, "agent_id"),
        None if user_id is None else check_id(user_id, "user_id"),
    )
    server: MCPServer = MCPServer(
        name="memstream",
        version=__version__,
        instructions=(
            "Curated long-term memory for this agent. memory_store saves a durable fact "
            "under a key, memory_recall finds facts relevant to a query, memory_forget "
            "deletes a fact by key."
        ),
    )

    @server.tool(
        name="memory_store",
        description=(
            "Store a durable fact under a key. Storing the same content again is a no-op; "
            "new content under an existing key replaces it. 'private' facts belong to the "
            "current user (stored as 'shared' when there is no authenticated user)."
        ),
    )
    async def memory_store(
        key: Annotated[str, Field(description="A short stable name for the fact.")],
        content: Annotated[str, Field(description="The fact, in one or two sentences.")],
        category: Annotated[CategoryArg, Field(description="What kind of fact this is.")],
        scope: Annotated[
            Literal["private", "shared"],
            Field(description="'private' (this user only) or 'shared' (every user of the agent)."),
        ],
        importance: Annotated[
            float | None, Field(ge=0.0, le=1.0, description="0.0-1.0, default 0.5.")
        ] = None,
    ) -> dict[str, Any]:
        try:
            r = await memory.store(caller, key, content, category, scope, importance)
        except MemstreamError as e:
            raise _tool_error(e) from None
        return {"status": r.status, "entry": r.entry.to_dict()}

    @server.tool(
        name="memory_recall",
        description="Find the stored facts most relevant to a query, best first.",
    )
    async def memory_recall(
        query: Annotated[str, Field(description="What to look for, in natural language.")],
        limit: Annotated[
            int | None,
            Field(ge=1, le=RECALL_MAX_LIMIT, description="How many results, default 5."),
        ] = None,
        category: Annotated[
            CategoryArg | None, Field(description="Only facts of this category.")
        ] = None,
    ) -> dict[str, Any]:
        try:
            r = await memory.recall(caller, query, limit=limit, category=category)
        except MemstreamError as e:
            raise _tool_error(e) from None
        results = []
        for entry, score in r.results:
            item: dict[str, Any] = dict(entry.to_dict())
            item["score"] = score
            results.append(item)
        return {"results": results, "source": r.source}

    @server.tool(name="memory_forget", description="Delete the fact stored under a key.")
    async def memory_forget(
        key: Annotated[str, Field(description="The key of the fact to delete.")],
    ) -> dict[str, Any]:
        try:
            forgotten = await memory.forget(caller, key)
        except MemstreamError as e:
            raise _tool_error(e) from None
        return {"forgotten": forgotten}

    return server


async def run_mcp(
    settings: Settings,
    account_id: str,
    agent_id: str,
    *,
    user_id: str | None = None,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
) -> None:
    """Serve the MCP gateway until cancelled (stdio: until stdin closes).

    The account must exist (:class:`NotFound` otherwise); the agent is created if needed.
    Connects to the configured Postgres (``MEMSTREAM_POSTGRES_DSN``); recall uses the Qdrant
    server when ``MEMSTREAM_QDRANT_URL`` is set and otherwise answers from Postgres keyword
    search (the in-process qdrant-edge index belongs to the ``memstream up`` process).
    Streamable HTTP serves ``http://HOST:PORT/mcp``. Logs go to stderr, never stdout.
    """
    from memstream.agents_ctx.memory.ports import MemoryIndexPort
    from memstream.clock import SystemClock
    from memstream.infra.accounts import Accounts
    from memstream.infra.postgres import create_pool

    pool = await create_pool(settings.postgres_dsn.get_secret_value())
    try:
        known = await pool.fetchval("SELECT 1 FROM accounts WHERE account_id = $1", account_id)
        if known is None:
            raise NotFound(
                f"no account {account_id!r}: create it with `memstream keys create {account_id}`",
                field="account",
            )
        await Accounts(pool).ensure_agent(account_id, agent_id)
        index: MemoryIndexPort | None = None
        if settings.qdrant_url:
            from memstream.projections.memory_index.factory import build_memory_index

            index = build_memory_index(settings)
        server = build_mcp_server(
            MemoryService(pool, SystemClock(), index), account_id, agent_id, user_id
        )
        if transport == "stdio":
            await server.run_stdio_async()
        else:
            await server.run_streamable_http_async(host=host, port=port)
    finally:
        await pool.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m memstream.agents_ctx.mcp_server --account A --agent B [--user U]
    [--transport stdio|http] [--host H] [--port N]`` (settings from ``MEMSTREAM_*``)."""
    import argparse
    import asyncio
    import sys

    ap = argparse.ArgumentParser(prog="memstream mcp", description="The memstream MCP gateway.")
    ap.add_argument("--account", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--user", default=None)
    ap.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    a = ap.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    asyncio.run(
        run_mcp(
            Settings(),
            a.account,
            a.agent,
            user_id=a.user,
            transport=a.transport,
            host=a.host,
            port=a.port,
        )
    )


if __name__ == "__main__":
    main()
