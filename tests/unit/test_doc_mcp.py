"""docs/mcp.md's tool table is the MCP server's real tool list: the same tools, each with the
same arguments, the optional ones (``?``) exactly those the server does not require; and the
error text it quotes is the text a refused call really carries."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from memstream.agents_ctx.mcp_server import _tool_error, build_mcp_server
from memstream.agents_ctx.memory import policy
from memstream.errors import InvalidRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "mcp.md"
ROW = re.compile(r"^\| `(memory_\w+)` \| (.*?) \| (.*?) \|$")


def documented() -> dict[str, dict[str, bool]]:
    """{tool: {argument: optional}} from the table."""
    out: dict[str, dict[str, bool]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m is None:
            continue
        args: dict[str, bool] = {}
        for part in m.group(2).split(", "):
            name = re.match(r"`(\w+)`", part.strip())
            assert name is not None, f"cannot read argument {part!r} of {m.group(1)}"
            args[name.group(1)] = part.rstrip().endswith("?") or "`?" in part
        out[m.group(1)] = args
    return out


@pytest.mark.asyncio(loop_scope="session")
async def test_the_tool_table_is_the_real_tool_list() -> None:
    def no_backend(_ctx: Any) -> Any:
        raise AssertionError("no tool is called here")

    async with Client(build_mcp_server(no_backend), mode="legacy") as client:
        tools = (await client.list_tools()).tools
    real = {
        t.name: {
            arg: arg not in t.input_schema.get("required", [])
            for arg in t.input_schema["properties"]
        }
        for t in tools
    }
    assert documented() == real


def test_the_quoted_error_is_the_real_one() -> None:
    text = DOC.read_text(encoding="utf-8")
    quoted = re.search(r"`(invalid_request \(field: importance\): [^`]*)`", text)
    assert quoted is not None
    with pytest.raises(InvalidRequest) as refused:
        policy.validate_importance(2)
    assert str(_tool_error(refused.value)) == quoted.group(1)
