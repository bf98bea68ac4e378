"""Read-your-writes positions: how far each projection has applied its input, per key.

A write answers with a *position*; a read given ``after=<position>`` waits until the
projection it reads has applied that position (:meth:`Watermarks.wait_for`).

- Transcript search (ClickHouse): the position of an append is the journal ``seq`` of its
  last message. Key: the thread (``account/agent/thread``). Within a thread the journal
  relay publishes in seq order to one partition and the projector applies in order, so
  "highest seq applied for the thread >= P" means every message of the thread up to P is
  applied.
- Recall (Qdrant): the position of a memory write is the entry ``version`` (a Postgres
  sequence). Key: the agent (``account/agent``), the ``memory`` topic's partition key. The
  writers of one agent are serialised in Postgres, so the outbox (and the topic) carry an
  agent's versions in increasing order.

Where positions are recorded: in the process that runs the projector (an in-memory
:class:`Watermarks`, advanced after each batch is durably applied). ``memstream up`` hosts
the API and the projectors in one process, so reads see them directly. A process that does
not run the projector has no watermarks: ``after`` then answers ``409 not_ready`` (see
docs/operations.md). After a restart a key's watermark is unknown until the projector
applies that key again; its first batch (re-delivered from the last commit) sets it.

Memory is bounded: at most ``max_keys`` keys are remembered (least recently advanced are
forgotten first; a forgotten key behaves like a key never seen).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from memstream.errors import NotReady
from memstream.schemas.records import ThreadRef
from memstream.schemas.topics import memory_key

__all__ = ["Positions", "Watermarks", "memory_position_key", "thread_position_key"]

DEFAULT_MAX_KEYS: Final = 200_000


def thread_position_key(account_id: str, agent_id: str, thread_id: str) -> str:
    return ThreadRef(account_id, agent_id, thread_id).key


def memory_position_key(account_id: str, agent_id: str) -> str:
    return memory_key(account_id, agent_id)


class Watermarks:
    """Highest position applied per key, with bounded waits. Coroutine-safe (one loop)."""

    def __init__(self, name: str, *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.name = name
        self._max_keys = max_keys
        self._marks: OrderedDict[str, int] = OrderedDict()
        self._changed = asyncio.Event()

    def get(self, key: str) -> int | None:
        """The highest position applied for ``key``, or None when unknown."""
        return self._marks.get(key)

    def advance(self, key: str, position: int) -> None:
        """Record that ``position`` of ``key`` is applied (never moves a mark backwards)."""
        cur = self._marks.get(key)
        if cur is None or position > cur:
            self._marks[key] = position
        self._marks.move_to_end(key)
        while len(self._marks) > self._max_keys:
            self._marks.popitem(last=False)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def advance_many(self, marks: dict[str, int]) -> None:
        for key, pos in marks.items():
            self.advance(key, pos)

    async def wait_for(self, key: str, position: int, timeout: float) -> int:
        """Return the key's mark once it is ``>= position``; after ``timeout`` seconds raise
        ``NotReady`` carrying the current mark (0 when unknown)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            cur = self._marks.get(key)
            if cur is not None and cur >= position:
                return cur
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NotReady(
                    f"the {self.name} projection has not applied position {position} yet "
                    f"(applied: {cur if cur is not None else 'none'})",
                    position=cur if cur is not None else 0,
                )
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                continue


@dataclass
class Positions:
    """The watermarks of the two projections readers can wait on."""

    messages: Watermarks = field(default_factory=lambda: Watermarks("transcript search"))
    memory: Watermarks = field(default_factory=lambda: Watermarks("memory index"))
