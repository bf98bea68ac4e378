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
:class:`Watermarks`, advanced after each batch is durably applied), and, when a
:class:`SharedPositions` store is attached (Redis in the CLI wiring), in that store too, so
every process sees them: ``memstream api`` answers ``after`` for what ``memstream worker``
applied. The shared write is off the projector's path: :meth:`Watermarks.advance` queues
the marks and one background task writes what is queued in one round trip (batches that
arrive while a write is in flight are coalesced into the next). A failing store is logged
and retried; it never fails or slows a projector batch.

:meth:`Watermarks.wait_for` answers from the in-process mark when it is far enough, else
asks the shared store, and polls both (5 ms doubling to 25 ms, woken at once by a local
advance) until the deadline. Marks only ever record applied positions, so the shared store
can be behind (a lost write, a wiped Redis) but never ahead: the worst it does is make a
read wait and answer ``409 not_ready``.

After a restart a key's in-process watermark is unknown until the projector applies that
key again (its first batch, re-delivered from the last commit, sets it); the shared store
still has it. In-process memory is bounded: at most ``max_keys`` keys are remembered (least
recently advanced are forgotten first; a forgotten key behaves like a key never seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from memstream.errors import NotReady
from memstream.schemas.records import ThreadRef
from memstream.schemas.topics import memory_key

__all__ = [
    "Positions",
    "SharedPositions",
    "Watermarks",
    "memory_position_key",
    "thread_position_key",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_KEYS: Final = 200_000
POLL_FIRST_S: Final = 0.005
"""First interval between looks at the shared store while waiting (doubles up to the max)."""
POLL_MAX_S: Final = 0.025
SHARED_WRITE_TIMEOUT_S: Final = 2.0
"""A shared-store write slower than this counts as failed (re-queued, retried)."""
SHARED_RETRY_S: Final = 1.0


def thread_position_key(account_id: str, agent_id: str, thread_id: str) -> str:
    return ThreadRef(account_id, agent_id, thread_id).key


def memory_position_key(account_id: str, agent_id: str) -> str:
    return memory_key(account_id, agent_id)


class SharedPositions(Protocol):
    """Marks shared across processes (``infra.redis_positions.RedisPositions``)."""

    async def record(self, projection: str, marks: Mapping[str, int]) -> None:
        """Raise each key's mark to its position, never lowering one."""
        ...

    async def get(self, projection: str, key: str) -> int | None:
        """The key's mark, None when unknown."""
        ...


class Watermarks:
    """Highest position applied per key, with bounded waits. Coroutine-safe (one loop).

    ``shared`` (with ``projection``, its name in the store) publishes every advance to a
    store other processes read, and lets :meth:`wait_for` see their advances."""

    def __init__(
        self,
        name: str,
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        shared: SharedPositions | None = None,
        projection: str = "",
    ) -> None:
        if shared is not None and not projection:
            raise ValueError("a shared store needs the projection name")
        self.name = name
        self._max_keys = max_keys
        self._marks: OrderedDict[str, int] = OrderedDict()
        self._changed = asyncio.Event()
        self._shared = shared
        self._projection = projection
        self._pending: dict[str, int] = {}
        self._writer: asyncio.Task[None] | None = None
        self._read_failing = False
        self._write_failing = False

    def get(self, key: str) -> int | None:
        """The highest position applied for ``key`` in this process, or None when unknown."""
        return self._marks.get(key)

    def advance(self, key: str, position: int) -> None:
        """Record that ``position`` of ``key`` is applied (never moves a mark backwards)."""
        self._advance(key, position)
        self._publish()

    def advance_many(self, marks: Mapping[str, int]) -> None:
        for key, pos in marks.items():
            self._advance(key, pos)
        self._publish()

    def _advance(self, key: str, position: int) -> None:
        cur = self._marks.get(key)
        if cur is None or position > cur:
            self._marks[key] = position
        self._marks.move_to_end(key)
        while len(self._marks) > self._max_keys:
            self._marks.popitem(last=False)
        if self._shared is not None:
            queued = self._pending.get(key)
            if queued is None or position > queued:
                self._pending[key] = position
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # --- the shared store -----------------------------------------------------------------
    def _publish(self) -> None:
        if not self._pending or (self._writer is not None and not self._writer.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): written by the next flush
            return
        self._writer = loop.create_task(self._write_pending(), name=f"positions-{self.name}")

    async def _write_pending(self) -> None:
        assert self._shared is not None
        while self._pending:
            batch, self._pending = self._pending, {}
            try:
                await asyncio.wait_for(
                    self._shared.record(self._projection, batch), SHARED_WRITE_TIMEOUT_S
                )
            except Exception as e:  # the store is derived state: never fail the projector
                if not self._write_failing:  # once per failure streak
                    log.warning("could not share %s positions (will retry): %r", self.name, e)
                self._write_failing = True
                for key, pos in batch.items():  # re-queue, keeping newer marks
                    if pos > self._pending.get(key, -1):
                        self._pending[key] = pos
                while len(self._pending) > self._max_keys:
                    self._pending.pop(next(iter(self._pending)))
                await asyncio.sleep(SHARED_RETRY_S)
            else:
                if self._write_failing:
                    log.info("sharing %s positions again", self.name)
                self._write_failing = False

    async def flush(self) -> None:
        """Wait until every advance so far is written to the shared store. While the store
        fails this keeps waiting (the writer retries): bound it with ``asyncio.wait_for``."""
        self._publish()
        while self._writer is not None and not self._writer.done():
            await asyncio.shield(self._writer)
            self._publish()

    async def close(self) -> None:
        """Stop the background writer (what is still queued is dropped: derived state)."""
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        self._writer = None

    async def _shared_mark(self, key: str, timeout: float) -> int | None:
        if self._shared is None:
            return None
        try:
            mark = await asyncio.wait_for(
                self._shared.get(self._projection, key), max(timeout, 0.001)
            )
        except Exception as e:  # unknown, as if Redis had nothing: the read waits
            if not self._read_failing:  # once per failure streak, not once per poll
                log.warning("could not read %s positions (reads wait): %r", self.name, e)
            self._read_failing = True
            return None
        self._read_failing = False
        return mark

    # --- readers ----------------------------------------------------------------------------
    async def wait_for(self, key: str, position: int, timeout: float) -> int:
        """Return the key's mark once it is ``>= position`` (in this process or in the
        shared store); after ``timeout`` seconds raise ``NotReady`` carrying the highest mark
        seen (0 when unknown)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        poll = POLL_FIRST_S
        while True:
            cur = self._marks.get(key)
            if cur is not None and cur >= position:
                return cur
            remote = await self._shared_mark(key, deadline - loop.time())
            if remote is not None:
                if remote >= position:
                    return remote
                cur = remote if cur is None else max(cur, remote)
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NotReady(
                    f"the {self.name} projection has not applied position {position} yet "
                    f"(applied: {cur if cur is not None else 'none'})",
                    position=cur if cur is not None else 0,
                )
            event = self._changed
            wait = remaining if self._shared is None else min(remaining, poll)
            poll = min(poll * 2, POLL_MAX_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait)


@dataclass
class Positions:
    """The watermarks of the two projections readers can wait on."""

    messages: Watermarks = field(default_factory=lambda: Watermarks("transcript search"))
    memory: Watermarks = field(default_factory=lambda: Watermarks("memory index"))

    @classmethod
    def shared(cls, store: SharedPositions) -> Positions:
        """Watermarks that also publish to, and read from, ``store`` (projection names
        ``messages`` and ``memory``)."""
        return cls(
            messages=Watermarks("transcript search", shared=store, projection="messages"),
            memory=Watermarks("memory index", shared=store, projection="memory"),
        )

    async def flush(self) -> None:
        await self.messages.flush()
        await self.memory.flush()

    async def close(self) -> None:
        await self.messages.close()
        await self.memory.close()
