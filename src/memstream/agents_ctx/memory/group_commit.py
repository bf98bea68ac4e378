"""Group commit: concurrent calls that share a key are run together, a group at a time.

A call is keyed (``memory_store`` uses the account). A call of an idle key yields once (so
that calls woken in the same loop iteration can join it) and, if none did, runs at once,
alone, in its caller's task. Otherwise calls queue; a runner task takes every queued call
(at most ``max_group``, never two with the same ``conflict_key``) as one group as soon as
fewer than ``max_inflight`` groups of the key run. So under concurrency the per-group costs (round trips, the
commit and its fsync, a lock) are paid once per group instead of once per call.

Guarantees:

- Each call gets its own outcome: the result or the exception ``run`` gave for it, or the
  exception ``run`` raised for the whole group.
- Calls of one key start in arrival order (a call held back by its ``conflict_key`` keeps
  its place at the head of the queue).
- A caller that gives up (its task is cancelled) only stops waiting: its call may still
  run with its group, as a call cancelled after sending its ``COMMIT`` would.
- No module state: one instance per service, its runners on the running event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_GROUP = 64
"""Calls per group at most (bounds one transaction's statements and the wait behind it)."""

MAX_INFLIGHT = 4
"""Groups of one key running at once. More than one, so that a few concurrent stores of
different agents of one account still run side by side as before (with one, two stores of
two agents ran one after the other: 0.26x raw at concurrency 2 against 0.50x before); calls
arriving while all of them run wait and go together (bench/memory_store.py: one agent at
concurrency 16 made 0.90-1.02x raw with 1, 2 or 4; 50 agents 0.64x with 1, 1.16x with 4)."""


@dataclass
class _Lane(Generic[T, R]):
    loop: asyncio.AbstractEventLoop
    queue: deque[tuple[T, asyncio.Future[R]]] = field(default_factory=deque)
    running: int = 0


class GroupCommit(Generic[T, R]):
    """Runs queued calls of one key in groups through ``run``, which returns one outcome (a
    result or an exception) per call, in order."""

    def __init__(
        self,
        run: Callable[[Sequence[T]], Awaitable[Sequence[R | Exception]]],
        conflict_key: Callable[[T], Hashable],
        *,
        max_group: int = MAX_GROUP,
        max_inflight: int = MAX_INFLIGHT,
    ) -> None:
        if max_group < 1 or max_inflight < 1:
            raise ValueError("max_group and max_inflight must be at least 1")
        self._run = run
        self._conflict_key = conflict_key
        self._max_group = max_group
        self._max_inflight = max_inflight
        self._lanes: dict[Hashable, _Lane[T, R]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, key: Hashable, call: T) -> R:
        """Queue ``call`` under ``key`` and wait for its outcome."""
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(key)
        if lane is None or lane.loop is not loop:  # a lane left by a closed loop is dropped
            lane = self._lanes[key] = _Lane(loop)
        fut: asyncio.Future[R] = loop.create_future()
        if lane.running == 0 and not lane.queue:
            # An idle key. Callers woken together (by the same group's answers) arrive in
            # the same loop iteration: yield once so that they queue behind this one. If
            # none did, run it alone at once in the caller's own task (no hand-off to a
            # runner; cancelling the caller cancels only this call).
            lane.running += 1
            try:
                await asyncio.sleep(0)
                alone = not lane.queue
                if alone:
                    [outcome] = await self._run([call])
                else:
                    lane.queue.appendleft((call, fut))  # first come: head of the group
            finally:
                lane.running -= 1
                self._wake(key, lane)
            if alone:
                if isinstance(outcome, Exception):
                    raise outcome
                return outcome
            return await fut
        lane.queue.append((call, fut))
        self._wake(key, lane)
        return await fut

    def _wake(self, key: Hashable, lane: _Lane[T, R]) -> None:
        """Start a runner if calls wait and fewer than ``max_inflight`` groups run."""
        if lane.queue and lane.running < self._max_inflight:
            lane.running += 1
            task = lane.loop.create_task(self._drain(key, lane))
            self._tasks.add(task)  # a strong reference until it ends
            task.add_done_callback(self._tasks.discard)
        elif not lane.queue and lane.running == 0 and self._lanes.get(key) is lane:
            del self._lanes[key]

    async def _drain(self, key: Hashable, lane: _Lane[T, R]) -> None:
        try:
            while lane.queue:
                await self._run_group(self._take(lane))
        finally:
            lane.running -= 1
            if lane.running == 0:
                while lane.queue:  # only when cancelled: nobody is left to run these
                    lane.queue.popleft()[1].cancel()
                if self._lanes.get(key) is lane:
                    del self._lanes[key]

    def _take(self, lane: _Lane[T, R]) -> list[tuple[T, asyncio.Future[R]]]:
        group: list[tuple[T, asyncio.Future[R]]] = []
        held: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[Hashable] = set()
        while lane.queue and len(group) < self._max_group:
            call, fut = lane.queue.popleft()
            if fut.done():  # its caller gave up before it started
                continue
            k = self._conflict_key(call)
            if k in keys:
                held.append((call, fut))
            else:
                keys.add(k)
                group.append((call, fut))
        lane.queue.extendleft(reversed(held))
        return group

    async def _run_group(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        if not group:
            return
        try:
            outcomes = await self._run([call for call, _ in group])
        except asyncio.CancelledError:
            for _, fut in group:
                fut.cancel()
            raise
        except Exception as e:
            outcomes = [e] * len(group)
        for (_, fut), outcome in zip(group, outcomes, strict=True):
            if fut.done():
                continue
            if isinstance(outcome, Exception):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
