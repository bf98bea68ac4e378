"""The service container the surfaces (HTTP, MCP, Python API) are given.

Built by the composition root (``memstream.infra.cli.wiring``) from settings; the surfaces
never construct adapters themselves. Fields default to ``None`` so a partial container can
serve a subset of routes (a route whose service is missing answers 503).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memstream.agents_ctx.access import ThreadAccess
from memstream.clock import Clock, SystemClock
from memstream.errors import InfraError
from memstream.infra.readiness import Readiness
from memstream.infra.supervisor import LoopStates

if TYPE_CHECKING:
    from memstream.agents_ctx.console.ports import Operations
    from memstream.agents_ctx.erasure import Erasures
    from memstream.agents_ctx.memory.store import MemoryService
    from memstream.infra.accounts import Accounts
    from memstream.infra.data_keys import Keyring
    from memstream.infra.journal import Journal
    from memstream.infra.llm.ports import SummaryModel
    from memstream.infra.metrics import Metrics
    from memstream.infra.settings import Settings
    from memstream.infra.summary_store import SummaryStore
    from memstream.projections.memory_index import MemoryIndex
    from memstream.projections.messages import MessageStore
    from memstream.projections.positions import Positions
    from memstream.projections.replay_hub import ReplayHub


@dataclass
class Services:
    settings: Settings
    accounts: Accounts
    journal: Journal | None = None
    clock: Clock = field(default_factory=SystemClock)
    metrics: Metrics | None = None
    #: what ``/healthz`` (readiness) checks: the composition root registers each part's
    #: probes and flags (``infra.cli.health_wiring``); empty: ready
    readiness: Readiness = field(default_factory=Readiness)
    #: supervised background loops of this process (``infra.supervisor``; console, ops)
    loops: LoopStates = field(default_factory=LoopStates)
    message_store: MessageStore | None = None  # transcript search (ClickHouse projection)
    summary_model: SummaryModel | None = None  # utility model for search summaries
    summary_store: SummaryStore | None = None  # thread summaries (object store + Redis cache)
    memory: MemoryService | None = None  # agent memory tools (Postgres + index)
    positions: Positions | None = None  # read-your-writes watermarks of the live projectors
    replays: ReplayHub | None = None  # projection rebuilds (POST /admin/replay/...)
    memory_index: MemoryIndex | None = None  # the recall index, for erasure's direct deletes
    erasures: Erasures | None = None  # erasure of threads and users (POST .../erase)
    keyring: Keyring | None = None  # data keys sealing the Kafka copies (crypto-shredding)
    operations: Operations | None = None  # the console's view of the pipeline (lag, DLQ)
    _threads: ThreadAccess | None = field(default=None, repr=False)

    @property
    def threads(self) -> ThreadAccess:
        """Thread access control (ownership, deletion), over ``accounts``."""
        if self._threads is None:
            self._threads = ThreadAccess(self.accounts)
        return self._threads

    def need_journal(self) -> Journal:
        if self.journal is None:
            raise InfraError("the journal is not available in this process")
        return self.journal
