"""Wrap a live projector so a replay can hand over to it, and so readers can wait for it.

:class:`GatedProcessor` runs the wrapped processor's handler inside the projection's
:class:`~memstream.projections.replay.Gate` (a replay closes it during its hand-over), and
after each successful batch reports what was applied to a recorder, which advances the
read-your-writes :class:`~memstream.projections.positions.Watermarks`:

- :func:`record_messages`: the journal seq of each ``message.appended``, per thread;
- :func:`record_memory`: the entry version of each ``memory.*`` event, per agent.

A batch that fails is not recorded; its records are retried or dead-lettered by the
runtime (a dead-lettered record never advances a watermark; later ones do).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memstream.projections.positions import (
    Watermarks,
    memory_position_key,
    thread_position_key,
)
from memstream.projections.replay import Gate
from memstream.schemas.events import Envelope
from memstream.streams.processor import EventMeta, Processor, ProcessorContext, Received

__all__ = ["GatedProcessor", "Recorder", "record_memory", "record_messages"]

Recorder = Callable[[Sequence[Received]], None]


def record_messages(marks: Watermarks) -> Recorder:
    def record(items: Sequence[Received]) -> None:
        best: dict[str, int] = {}
        for it in items:
            env = it.envelope
            if env.type != "message.appended" or not env.thread_id:
                continue
            seq = env.data.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                key = thread_position_key(env.account_id, env.agent_id, env.thread_id)
                best[key] = max(best.get(key, 0), seq)
        marks.advance_many(best)

    return record


def record_memory(marks: Watermarks) -> Recorder:
    def record(items: Sequence[Received]) -> None:
        best: dict[str, int] = {}
        for it in items:
            env = it.envelope
            if not env.type.startswith("memory."):
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
