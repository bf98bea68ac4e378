"""Which entries are pinned into every turn's context.

An entry is pinned when it is not expired, visible to the caller (the agent's shared
entries plus the caller's own private ones), of category ``user_profile`` and of importance
≥ 0.7; ordered by importance (highest first), then recency (``updated_at``, newest first);
at most 10. Both numbers are fixed platform values (``schemas/limits.py``).

Pure; ``MemoryService.pinned`` runs the same rule as one SQL query, and a test holds the two
to the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from memstream.agents_ctx.memory.policy import is_expired, is_visible
from memstream.schemas.limits import PIN_MAX_ENTRIES, PIN_MIN_IMPORTANCE
from memstream.schemas.records import Caller, MemoryEntry


def is_pinnable(entry: MemoryEntry, caller: Caller, now: datetime) -> bool:
    return (
        entry.category == "user_profile"
        and entry.importance >= PIN_MIN_IMPORTANCE
        and not is_expired(entry, now)
        and is_visible(entry, caller.account_id, caller.agent_id, caller.user_id)
    )


def pinned(entries: Iterable[MemoryEntry], caller: Caller, now: datetime) -> list[MemoryEntry]:
    """The pinned set for ``caller`` at ``now``: at most 10, best first."""
    chosen = [e for e in entries if is_pinnable(e, caller, now)]
    chosen.sort(key=lambda e: (-e.importance, -e.updated_at.timestamp(), e.key))
    return chosen[:PIN_MAX_ENTRIES]
