"""Starting the write pipeline inside a Stack: topics, the journal relay, the outbox relay
and the stream processors. Each start returns its stopper; ``Stack.stop`` runs them in
reverse."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memstream.infra.cli.wiring import Stack, Stopper


async def start_pipeline(stack: Stack) -> list[Stopper]:
    stoppers: list[Stopper] = []
    return stoppers
