"""Runs of an idempotent job that concurrent callers share: how erasures purge an index
(``LexicalIndex.purge``, ``ShardSlot.rewrite``) without one full rewrite each.

A caller needs a run that *began after its call* (so after everything it did before the
call: its deletes) and *succeeded*. Runs go one at a time. A call made while one runs waits
for it, then runs the job only if no such run has succeeded meanwhile, so the calls that
waited together share the next run. A run that raised covers no one: its caller gets the
error, and the others run the job again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["SharedRuns"]


class SharedRuns(Generic[T]):
    """See the module docstring."""

    def __init__(self) -> None:
        self._lock: asyncio.Lock | None = None  # made on the loop that first runs the job
        self.started = 0  # runs begun
        self._succeeded_through = 0  # the ordinal of the last run that succeeded

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a run goes on (other work that must not overlap a run takes it too)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def run(self, job: Callable[[], Awaitable[T]]) -> T | None:
        """``job()``'s result, or None when a run that began after this call succeeded."""
        called = self.started
        async with self.lock:
            if self._succeeded_through > called:
                return None
            self.started += 1
            ordinal = self.started
            result = await job()
            self._succeeded_through = ordinal  # not reached by a run that raised
            return result
