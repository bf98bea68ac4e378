"""Wrap a live projector so a replay can hand over to it, and so readers can wait for it.

:class:`GatedProcessor` runs the wrapped processor's handler inside the projection's
:class:`~memstream.projections.replay.Gate` (a replay closes it during its hand-over), and
after each successful batch reports what was applied to a recorder, which advances the
read-your-writes :class:`~memstream.projections.positions.Watermarks`:

- :func:`record_messages`: the journal seq of each ``message.appended``, per thread;
- :func:`record_memory`: the entry version of each ``memory.*`` event but
  ``memory.recalled``, per agent.

A batch that fails is not recorded; its records are retried or dead-lettered by the
runtime (a dead-lettered record never advances a watermark; later ones do).

A ``raw`` processor (``raw = True``, ``handle_raw``) stays raw behind the gate. If it reports
what it applied (:class:`ReportsPositions`, e.g. the message projector, whose positions come
back from ClickHouse's bulk parse) and the recorder takes positions
(:class:`PositionRecorder`), those are recorded without decoding anything; otherwise the
records are decoded for the recorder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from memstream.projections.positions import (
    Watermarks,
    memory_position_key,
    thread_position_key,
)
from memstream.projections.replay import Gate
from memstream.schemas.events import DecodeError, Envelope, decode
from memstream.streams.processor import (
    EventMeta,
    Processor,
    ProcessorContext,
    RawRecord,
    Received,
)

__all__ = [
    "GatedProcessor",
    "PositionRecorder",
    "Recorder",
    "ReportsPositions",
    "record_memory",
    "record_messages",
]

Recorder = Callable[[Sequence[Received]], None]


@runtime_checkable
class ReportsPositions(Protocol):
    def applied_positions(self) -> Mapping[str, int]:
        """Positions (key -> highest) applied by the last successful handler call."""
        ...


@runtime_checkable
class PositionRecorder(Protocol):
    def __call__(self, items: Sequence[Received]) -> None: ...

    def advance(self, positions: Mapping[str, int]) -> None:
        """Record positions a processor reported itself."""
        ...


class _MessageRecorder:
    def __init__(self, marks: Watermarks) -> None:
        self.marks = marks

    def __call__(self, items: Sequence[Received]) -> None:
        best: dict[str, int] = {}
        for it in items:
            env = it.envelope
            if env.type != "message.appended" or not env.thread_id:
                continue
            seq = env.data.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                key = thread_position_key(env.account_id, env.agent_id, env.thread_id)
                best[key] = max(best.get(key, 0), seq)
        self.marks.advance_many(best)

    def advance(self, positions: Mapping[str, int]) -> None:
        self.marks.advance_many(dict(positions))


def record_messages(marks: Watermarks) -> Recorder:
    """Thread positions (journal seq per ``account/agent/thread``); also a
    :class:`PositionRecorder`, for processors that report them."""
    return _MessageRecorder(marks)


def record_memory(marks: Watermarks) -> Recorder:
    def record(items: Sequence[Received]) -> None:
        best: dict[str, int] = {}
        for it in items:
            env = it.envelope
            # a recall's counter bump changes nothing in the index and nobody waits on its
            # version; it is not serialised with stores, so counting it could lift the mark
            # past a store committing just after it
            if not env.type.startswith("memory.") or env.type == "memory.recalled":
                continue
            entry = env.data.get("entry")
            version = entry.get("version") if isinstance(entry, dict) else None
            if isinstance(version, int) and not isinstance(version, bool):
                key = memory_position_key(env.account_id, env.agent_id)
                best[key] = max(best.get(key, 0), version)
        marks.advance_many(best)

    return record


class GatedProcessor(Processor):
    """``inner`` behind a gate, with an optional recorder (see module doc)."""

    def __init__(self, inner: Processor, gate: Gate, recorder: Recorder | None = None) -> None:
        self.inner = inner
        self.gate = gate
        self.recorder = recorder
        self.name = inner.name
        self.topic = inner.topic
        self.batch_max = inner.batch_max
        self.batch_within_s = inner.batch_within_s
        self.raw = inner.raw

    async def start(self, ctx: ProcessorContext) -> None:
        await self.inner.start(ctx)

    async def stop(self) -> None:
        await self.inner.stop()

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        async with self.gate:
            await self.inner.handle(envelope, meta)
        if self.recorder is not None:
            self.recorder([Received(envelope, meta)])

    async def handle_batch(self, items: Sequence[Received]) -> None:
        async with self.gate:
            if self.inner.batch_max > 1:
                await self.inner.handle_batch(items)
            else:
                for it in items:
                    await self.inner.handle(it.envelope, it.meta)
        if self.recorder is not None:
            self.recorder(items)

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        async with self.gate:
            await self.inner.handle_raw(records)
        if self.recorder is None:
            return
        if isinstance(self.inner, ReportsPositions) and isinstance(self.recorder, PositionRecorder):
            self.recorder.advance(self.inner.applied_positions())
            return
        items = []
        for rec in records:
            try:
                items.append(Received(decode(rec.value), rec.meta))
            except DecodeError:
                continue  # the handler accepted it; nothing to record from it
        self.recorder(items)
