"""Wiring of replays and read-your-writes into a :class:`~memstream.infra.cli.wiring.Stack`.

- :func:`attach_replay` (after the shared adapters exist): the read-your-writes
  :class:`Positions` (shared through Redis, so every process sees what any projector
  applied; it returns their stopper), the :class:`ReplayHub` over the live message store, memory index and
  Redis counters, and the live stores pointed at the current generations from Postgres.
- :func:`gated` wraps the processor factories: the two projectors and the counters run
  behind their projection's gate (a replay's hand-over) and the projectors advance the
  watermarks readers wait on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from memstream.infra.redis_positions import RedisPositions
from memstream.projections.positions import Positions
from memstream.projections.replay import ReplaySink, ReplayStateStore
from memstream.projections.replay_hub import ReplayHub
from memstream.projections.replay_sinks import CountersSink, MemorySink, MessagesSink
from memstream.schemas.topics import Topics

if TYPE_CHECKING:
    from memstream.infra.cli.wiring import Stack, Stopper
    from memstream.streams.processor import Processor

__all__ = ["attach_replay", "gated"]

#: processor name -> the projection its replay rebuilds
PROCESSOR_PROJECTION = {
    "message-projector": "messages",
    "memory-projector": "memory",
    "counters": "counters",
}


async def attach_replay(stack: Stack) -> Stopper:
    svc = stack.services
    assert svc is not None and stack.pool is not None and stack.redis is not None
    s = stack.settings
    sinks: dict[str, ReplaySink] = {}
    if svc.message_store is not None:
        sinks["messages"] = MessagesSink(svc.message_store, s.clickhouse_database)
    if stack.memory_index is not None:
        sinks["memory"] = MemorySink(stack.memory_index, s.environment)
    if svc.summary_store is not None:
        sinks["counters"] = CountersSink(stack.redis, svc.summary_store)
    hub = ReplayHub(
        state=ReplayStateStore(stack.pool),
        sinks=sinks,
        bootstrap=s.kafka_bootstrap,
        topics=Topics(s.topic_prefix),
        journal=stack.journal or stack.journal_reader,
        keyring=svc.keyring,
    )
    await hub.apply_generations()
    svc.replays = hub
    positions = svc.positions or Positions.shared(
        RedisPositions(stack.redis, ttl_s=s.read_your_writes_mark_ttl_s)
    )
    svc.positions = positions
    return positions.close


def gated(
    stack: Stack, factories: dict[str, Callable[[], Processor]]
) -> dict[str, Callable[[], Processor]]:
    """The factories, with the projectors behind their gates and recording positions."""
    from memstream.streams.gate import GatedProcessor, record_memory, record_messages

    svc = stack.services
    if svc is None or svc.replays is None:
        return factories
    hub, positions = svc.replays, svc.positions or Positions()
    svc.positions = positions
    out = dict(factories)
    for proc, projection in PROCESSOR_PROJECTION.items():
        make = factories.get(proc)
        if make is None:
            continue
        recorder = (
            record_messages(positions.messages)
            if projection == "messages"
            else record_memory(positions.memory)
            if projection == "memory"
            else None
        )

        def build(
            make: Callable[[], Processor] = make,
            projection: str = projection,
            rec: object = recorder,
        ) -> Processor:
            return GatedProcessor(make(), hub.gate(projection), rec)  # type: ignore[arg-type]

        out[proc] = build
    return out
