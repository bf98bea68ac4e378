"""What moves an agent's memory watermark (read-your-writes ``after`` on recall)."""

from __future__ import annotations

from memstream.projections.positions import Watermarks
from memstream.schemas.events import Envelope, EventType
from memstream.streams.gate import record_memory
from memstream.streams.processor import EventMeta, Received


def _event(typ: EventType, version: int) -> Received:
    env = Envelope(typ, f"{typ}@{version}", 1, "a", "g", None, {"entry": {"version": version}})
    return Received(env, EventMeta("memory", 0, version, None))


def test_changes_move_the_mark_recall_bumps_do_not() -> None:
    marks = Watermarks("memory index")
    record = record_memory(marks)
    record([_event("memory.stored", 5), _event("memory.recalled", 9)])
    assert marks.get("a/g") == 5  # a recall's version is no position anyone waits on
    record([_event("memory.recalled", 12)])
    assert marks.get("a/g") == 5
    record([_event("memory.replaced", 10), _event("memory.forgotten", 11)])
    assert marks.get("a/g") == 11
