"""``journal_tool_call_view``: the full name, arguments and result of an earlier tool call,
read from the journal (the authority), paged over bytes.

The document is ``{"name", "arguments", "result"}`` serialized with orjson (compact, keys in
that order; the same record always gives the same bytes, so offsets stay valid between
pages). Paging rules are in :mod:`.paging`.

Guarantees: an unknown id is ``NotFound``; so is a call made in a private thread the caller
may not see (the same rule as search, checked against the projection's thread users), so
the tool never confirms that someone else's call exists. A failed journal read propagates
as ``JournalUnavailable`` (HTTP 503); nothing is served from a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import orjson

from memstream.agents_ctx.journal_tools.paging import page_utf8
from memstream.agents_ctx.validation import check_id
from memstream.errors import InvalidRequest, NotFound
from memstream.infra.journal.codec import ToolCallRecord
from memstream.projections.messages import MessageStore
from memstream.schemas.limits import TOOL_VIEW_MAX_BYTES
from memstream.schemas.records import Caller, JSONObject


class ToolCallSource(Protocol):
    """What the view needs from the journal (``Journal`` and ``JournalReader`` both fit)."""

    async def tool_call(
        self, account_id: str, agent_id: str, tool_call_id: str
    ) -> ToolCallRecord | None: ...


def tool_call_document(rec: ToolCallRecord) -> bytes:
    """The UTF-8 JSON document the view pages over."""
    return orjson.dumps({"name": rec.name, "arguments": rec.arguments, "result": rec.result})


@dataclass(frozen=True, slots=True)
class ToolCallPage:
    tool_call_id: str
    name: str | None
    total_bytes: int
    offset: int
    data: str
    next_offset: int | None

    def to_dict(self) -> JSONObject:
        return {
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "offset": self.offset,
            "data": self.data,
            "next_offset": self.next_offset,
        }


def _int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{field} must be an integer", field=field)
    return value


async def journal_tool_call_view(
    caller: Caller,
    tool_call_id: object,
    offset: object = 0,
    length: object = TOOL_VIEW_MAX_BYTES,
    *,
    journal: ToolCallSource,
    store: MessageStore | None,
) -> ToolCallPage:
    """One page of a tool call's document. ``store`` enforces private threads (None skips
    the check: only for processes that serve no end users)."""
    tcid = check_id(tool_call_id, "tool_call_id")
    off = _int(offset, "offset")
    ln = _int(length, "length")
    if ln < 1:
        raise InvalidRequest("length must be at least 1", field="length")
    rec = await journal.tool_call(caller.account_id, caller.agent_id, tcid)
    if rec is None:
        raise NotFound(f"no tool call {tcid!r}", field="tool_call_id")
    if (
        store is not None
        and rec.thread_id is not None
        and not await store.thread_visible(
            caller.account_id, caller.agent_id, rec.thread_id, caller.user_id
        )
    ):
        raise NotFound(f"no tool call {tcid!r}", field="tool_call_id")
    page = page_utf8(tool_call_document(rec), off, ln)
    return ToolCallPage(
        tool_call_id=tcid,
        name=rec.name,
        total_bytes=page.total_bytes,
        offset=page.offset,
        data=page.data,
        next_offset=page.next_offset,
    )
