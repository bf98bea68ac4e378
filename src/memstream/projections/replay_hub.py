"""The replays one process can run: its sinks, the live projectors' gates, the sources.

Built by the composition root next to the live stores (``memstream up`` hosts it; the admin
route ``POST /admin/replay/{projection}`` and ``memstream replay`` use it). At start-up,
:meth:`ReplayHub.apply_generations` points the live stores at the current generations
recorded in Postgres, so a restart (or another process) reads what the last replay built.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from memstream.errors import Conflict, InfraError, InvalidRequest
from memstream.infra.data_keys import Keyring
from memstream.projections.replay import (
    Gate,
    Progress,
    ReplaySink,
    ReplaySource,
    ReplayStateStore,
    check_projection,
    run_replay,
)
from memstream.projections.replay_sources import JournalSource, SeqReader, TopicSource
from memstream.schemas.topics import Topics

__all__ = ["ReplayHub"]


@dataclass
class ReplayHub:
    """Everything a replay needs in this process. ``gates`` are shared with the live
    projectors (see ``memstream.streams.gate``); a projection without a gate here has no live
    projector in this process."""

    state: ReplayStateStore
    sinks: dict[str, ReplaySink]
    bootstrap: str
    topics: Topics
    journal: SeqReader | None = None
    gates: dict[str, Gate] = field(default_factory=dict)
    batch_size: int | None = None
    """Records per replay batch; None: the sink's ``preferred_batch``, else 2,000."""
    keyring: Keyring | None = None  # opens sealed topic records (crypto-shredding)
    _running: set[str] = field(default_factory=set)

    def _batch_of(self, sink: ReplaySink) -> int:
        if self.batch_size is not None:
            return self.batch_size
        preferred = getattr(sink, "preferred_batch", None)
        return preferred if isinstance(preferred, int) else 2_000

    def gate(self, projection: str) -> Gate:
        return self.gates.setdefault(projection, Gate())

    def source(self, projection: str, *, from_journal: bool) -> ReplaySource:
        if from_journal:
            if projection == "memory":
                raise InvalidRequest(
                    "the memory projection is fed by the Postgres outbox, not the journal",
                    field="from_journal",
                )
            if self.journal is None:
                raise InfraError("the journal is not available in this process")
            return JournalSource(self.journal)
        if not self.bootstrap:
            raise InfraError("no Kafka address configured")
        topic = self.topics.memory if projection == "memory" else self.topics.journal
        return TopicSource(self.bootstrap, topic, keyring=self.keyring)

    async def apply_generations(self) -> dict[str, int]:
        """Point the live stores at the generations recorded in Postgres."""
        gens = await self.state.generations()
        for name, gen in gens.items():
            sink = self.sinks.get(name)
            if sink is not None and gen > 1:
                await sink.switch(gen)
        return gens

    async def run(
        self, projection: object, *, from_journal: bool = False, restart: bool = False
    ) -> AsyncIterator[Progress]:
        """Run one replay (one at a time per projection); yields progress and the report."""
        name = check_projection(projection)
        source = self.source(name, from_journal=from_journal)  # bad arguments first
        sink = self.sinks.get(name)
        if sink is None:
            raise InfraError(f"the {name} projection is not hosted in this process")
        if name in self._running:
            raise Conflict(f"a replay of {name} is already running")
        self._running.add(name)
        try:
            async for p in run_replay(
                sink,
                source,
                self.state,
                gate=self.gates.get(name),
                restart=restart,
                batch_size=self._batch_of(sink),
            ):
                yield p
        finally:
            self._running.discard(name)
