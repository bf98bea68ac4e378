"""The port recall uses to ask the semantic index for candidates.

The Qdrant adapters in ``memstream.projections.memory_index`` implement it (structurally:
they need not import this module). The index is a projection that can lag: it only proposes
candidates; ``MemoryService.recall`` fetches the authoritative rows from Postgres and
re-applies visibility, expiry and filters.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, TypeAlias

from memstream.schemas.records import Category

EntryRef: TypeAlias = tuple[str, str]
"""A point's entry identity inside one (account, agent): ``(owner, key)``, owner ``""`` for
shared entries and the user id for private ones."""

IndexHit: TypeAlias = tuple[EntryRef, float]
"""A candidate and its fused relevance score (higher is better)."""


class MemoryIndexPort(Protocol):
    async def query(
        self,
        account_id: str,
        agent_id: str,
        user_id: str | None,
        query_text: str,
        limit: int,
        category: Category | None,
        now: datetime,
    ) -> list[IndexHit]:
        """Up to ``limit`` candidates, best first, among the agent's shared entries and
        ``user_id``'s private ones, not expired at ``now``, of ``category`` if given.
        Raises on any failure; the caller falls back to keyword search."""
        ...
