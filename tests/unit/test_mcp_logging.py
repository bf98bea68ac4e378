"""Building the MCP server leaves the host process's logging as it was.

``MCPServer()`` calls ``logging.basicConfig(level="INFO", handlers=[RichHandler])``. In a
process that had not configured logging, that turned on every INFO line (the access log's
one per request included) through rich, which cost the HTTP path ~3 ms a request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from memstream.agents_ctx.mcp_server import build_mcp_server


@contextlib.contextmanager
def unconfigured_root() -> Iterator[logging.Logger]:
    """The root logger as in a process that never configured logging (pytest's own
    capture handlers put back afterwards)."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    root.handlers[:] = []
    root.setLevel(logging.WARNING)
    try:
        yield root
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_building_the_mcp_server_adds_no_handler_and_keeps_the_level() -> None:
    with unconfigured_root() as root:
        build_mcp_server(lambda caller: None)  # type: ignore[arg-type,return-value]  # never called
        assert root.handlers == []
        assert root.level == logging.WARNING
        assert not logging.getLogger("memstream.access").isEnabledFor(logging.INFO)
