"""``journal_tool_call_view``: the full name, arguments and result of an earlier tool call,
read from the journal (the authority), paged over bytes.

The document is ``{"name", "arguments", "result"}`` serialized with orjson (compact, keys in
that order; the same record always gives the same bytes, so offsets stay valid between
pages). Paging rules are in :mod:`.paging`.

Records are keyed by thread: tool-call ids are only unique within a thread (many models
number them ``call_0``, ``call_1``...), so two threads reusing an id keep two records.

Guarantees: an unknown id is ``NotFound``; so is a call made in a thread the caller may not
read (someone else's, or deleted: ``agents_ctx.access``, which reads the thread's owner
from Postgres, the authority, never from the lagging search projection), so the tool never
confirms that someone else's call exists. With ``thread_id`` the record of that thread is
read; without it the id is resolved among the threads the caller may read, and an id found
in several of them is ``InvalidRequest`` naming ``thread_id``. A failed journal read
propagates as ``JournalUnavailable`` (HTTP 503); nothing is served from a cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import orjson

from memstream.agents_ctx.journal_tools.paging import page_utf8
from memstream.agents_ctx.validation import check_id
from memstream.errors import InvalidRequest, NotFound
from memstream.infra.journal.codec import ToolCallRecord
from memstream.schemas.limits import TOOL_VIEW_MAX_BYTES
from memstream.schemas.records import Caller, JSONObject, ThreadRef


class ToolCallSource(Protocol):
    """What the view needs from the journal (``Journal`` and ``JournalReader`` both fit)."""

    async def tool_call(
        self, account_id: str, agent_id: str, tool_call_id: str, thread_id: str
    ) -> ToolCallRecord | None: ...

    async def tool_calls(
        self, account_id: str, agent_id: str, tool_call_id: str
    ) -> list[ToolCallRecord]: ...


class ThreadVisibility(Protocol):
    """The access check (``agents_ctx.access.ThreadAccess``)."""

    async def visible(self, caller: Caller, ref: ThreadRef) -> bool: ...


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
    threads: ThreadVisibility,
    thread_id: object = None,
) -> ToolCallPage:
    """One page of a tool call's document, from a thread the caller may read."""
    tcid = check_id(tool_call_id, "tool_call_id")
    tid = None if thread_id is None or thread_id == "" else check_id(thread_id, "thread_id")
    off = _int(offset, "offset")
    ln = _int(length, "length")
    if ln < 1:
        raise InvalidRequest("length must be at least 1", field="length")
    rec = await _resolve(caller, tcid, tid, journal, threads)
    page = page_utf8(tool_call_document(rec), off, ln)
    return ToolCallPage(
        tool_call_id=tcid,
        name=rec.name,
        total_bytes=page.total_bytes,
        offset=page.offset,
        data=page.data,
        next_offset=page.next_offset,
    )


async def _resolve(
    caller: Caller,
    tcid: str,
    thread_id: str | None,
    journal: ToolCallSource,
    threads: ThreadVisibility,
) -> ToolCallRecord:
    if thread_id is not None:
        rec = await journal.tool_call(caller.account_id, caller.agent_id, tcid, thread_id)
        candidates = [] if rec is None else [rec]
    else:
        candidates = await journal.tool_calls(caller.account_id, caller.agent_id, tcid)
    readable = [
        rec
        for rec in candidates
        if rec.thread_id is not None
        and await threads.visible(
            caller, ThreadRef(caller.account_id, caller.agent_id, rec.thread_id)
        )
    ]
    if not readable:
        raise NotFound(f"no tool call {tcid!r}", field="tool_call_id")
    if len(readable) > 1:
        raise InvalidRequest(
            f"tool call {tcid!r} was made in {len(readable)} of your threads: "
            "pass thread_id to choose one",
            field="thread_id",
        )
    return readable[0]
