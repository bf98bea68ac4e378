"""``memstream mcp`` over stdio: a bridge from an MCP host to a running memstream.

The host launches ``memstream mcp --agent A [--user U] (--data-dir D | --url URL) --key K``;
every tool call becomes the same HTTP call an agent would make (``/v1/agents/{A}/memory/...``
with the bearer key and ``X-Memstream-User``), so the bridge has exactly the rules, the
index and the errors of the API: it opens no database of its own. Logs go to stderr.
"""

from __future__ import annotations

from typing import Any, cast

from memstream.agents_ctx.mcp_server import build_mcp_server, fixed_tools
from memstream.client import MemstreamClient


class ClientTools:
    """The three tools as calls to a running API (``MemstreamClient``)."""

    def __init__(self, client: MemstreamClient, agent_id: str) -> None:
        self._client = client
        self._agent = agent_id

    async def store(
        self, key: object, content: object, category: object, scope: object, importance: object
    ) -> dict[str, Any]:
        r = await self._client.memory_store(
            self._agent,
            cast(str, key),
            cast(str, content),
            cast(str, category),
            cast(str, scope),
            cast(float | None, importance),
        )
        return {"status": r["status"], "entry": r["entry"]}

    async def recall(self, query: object, limit: object, category: object) -> dict[str, Any]:
        return await self._client.memory_recall(
            self._agent, cast(str, query), cast(int | None, limit), cast(str | None, category)
        )

    async def forget(self, key: object) -> dict[str, Any]:
        return {"forgotten": await self._client.memory_forget(self._agent, cast(str, key))}


async def run_stdio_bridge(url: str, api_key: str, agent_id: str, user_id: str | None) -> None:
    """Serve the three tools on stdin/stdout until stdin closes."""
    async with MemstreamClient(url, api_key, user_id) as client:
        server = build_mcp_server(fixed_tools(ClientTools(client, agent_id)))
        await server.run_stdio_async()
