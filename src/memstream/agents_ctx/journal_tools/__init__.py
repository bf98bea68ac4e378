"""The journal system tools: ``journal_message_search`` and ``journal_tool_call_view``.

Offered on agent surfaces (HTTP API, Python) unconditionally, never on the MCP gateway, and
independent of the Memory capability (the spec: transcript search is a journal tool).

- :mod:`.search` -- validation and the search tool (ClickHouse projection + summarizer)
- :mod:`.tool_calls` -- the tool-call view, read from the journal
- :mod:`.paging` -- pure UTF-8-safe byte paging
"""

from __future__ import annotations

from memstream.agents_ctx.journal_tools.paging import BytePage, page_utf8
from memstream.agents_ctx.journal_tools.search import (
    DeletedThreads,
    NoDeletedThreads,
    SearchResult,
    ThreadSummary,
    build_search_spec,
    journal_message_search,
)
from memstream.agents_ctx.journal_tools.tool_calls import (
    ToolCallPage,
    ToolCallSource,
    journal_tool_call_view,
    tool_call_document,
)

__all__ = [
    "BytePage",
    "DeletedThreads",
    "NoDeletedThreads",
    "SearchResult",
    "ThreadSummary",
    "ToolCallPage",
    "ToolCallSource",
    "build_search_spec",
    "journal_message_search",
    "journal_tool_call_view",
    "page_utf8",
    "tool_call_document",
]
