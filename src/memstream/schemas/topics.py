"""Topic names. The prefix is a setting (default ``memstream.``); the suffixes are fixed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEFAULT_PREFIX: Final = "memstream."

JOURNAL: Final = "journal"
MEMORY: Final = "memory"
SUMMARIES: Final = "summaries"
DLQ: Final = "dlq"

ALL: Final = (JOURNAL, MEMORY, SUMMARIES, DLQ)


@dataclass(frozen=True, slots=True)
class Topics:
    """Full topic names for one deployment prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def journal(self) -> str:
        return self.prefix + JOURNAL

    @property
    def memory(self) -> str:
        return self.prefix + MEMORY

    @property
    def summaries(self) -> str:
        return self.prefix + SUMMARIES

    @property
    def dlq(self) -> str:
        return self.prefix + DLQ

    def all(self) -> tuple[str, ...]:
        return tuple(self.prefix + t for t in ALL)


def memory_key(account_id: str, agent_id: str) -> str:
    """Partition key of the ``memory`` topic."""
    return f"{account_id}/{agent_id}"
