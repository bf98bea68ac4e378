"""What the console needs from the running pipeline, as a port: the composition root
(``memstream.infra.cli.console_ops``) implements :class:`Operations` over the runner, the
relays and Kafka, so this package never imports the stream runtime.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LagPoint:
    """One processor group's position on one partition."""

    processor: str
    topic: str
    partition: int
    committed: int | None
    end_offset: int
    lag: int


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter; ``retried_at`` is when an operator re-published it (unix s) or None."""

    id: str
    ts: int
    processor: str
    error: str
    origin_topic: str
    origin_partition: int
    origin_offset: int
    key: str | None
    payload: str
    lossless: bool
    retried_at: float | None = None
    failed_again: str | None = None  # id of a newer dead letter of the same payload


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    republished: list[str]
    skipped_lossy: list[str]
    missing: list[str]


class Operations(Protocol):
    def processors(self) -> Sequence[str]: ...

    def last_commits(self) -> dict[str, float | None]: ...

    async def lag(self) -> list[LagPoint]: ...

    async def relay_backlog(self) -> dict[str, int]: ...

    async def dead_letters(self, limit: int) -> list[Letter]: ...

    async def retry(self, ids: Collection[str]) -> RetryOutcome: ...
