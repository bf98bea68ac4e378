"""The documented wire models (``schemas.wire``) match what the records really render: a
field added to a record's ``to_dict()`` without its model (or the reverse) fails here."""

from __future__ import annotations

from datetime import UTC, datetime

from memstream.agents_ctx.journal_tools.tool_calls import ToolCallPage
from memstream.schemas import wire
from memstream.schemas.records import MemoryEntry, Summary

T = datetime(2026, 1, 1, tzinfo=UTC)


def test_summary_model_is_the_record() -> None:
    s = Summary(1, T, 3, "m3", "text", 2, 4)
    assert set(s.to_dict()) == set(wire.Summary.model_fields)
    wire.Summary.model_validate(s.to_dict())


def test_memory_entry_model_is_the_record() -> None:
    e = MemoryEntry("a", "g", "k", "c", "user_profile", "shared", 0.5, "h", T, T)
    assert set(e.to_dict()) == set(wire.MemoryEntry.model_fields)
    wire.MemoryEntry.model_validate(e.to_dict())


def test_tool_call_page_model_is_the_record() -> None:
    fields = set(ToolCallPage.__dataclass_fields__)
    assert fields == set(wire.ToolCallPage.model_fields)
