"""Per-process console state: sessions, the lag sampler and the replays started here.

The sampler polls :meth:`Operations.lag` every ``interval_s`` while someone watches the
overview and stops by itself after ``idle_s`` without a request (the API runs without a
lifespan, so nothing would cancel a forever task).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from memstream.agents_ctx.console.history import LagHistory
from memstream.agents_ctx.console.ports import Operations
from memstream.agents_ctx.console.sessions import Sessions

log = logging.getLogger(__name__)


@dataclass
class ReplayRun:
    projection: str
    started: float
    last: dict[str, object] = field(default_factory=dict)
    error: str | None = None
    task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


@dataclass
class ConsoleState:
    sessions: Sessions = field(default_factory=Sessions)
    history: LagHistory = field(default_factory=LagHistory)
    replays: dict[str, ReplayRun] = field(default_factory=dict)
    memory_keys: dict[str, str] = field(default_factory=dict)  # session id -> admin API key
    interval_s: float = 2.0
    idle_s: float = 60.0
    last_error: str | None = None
    _task: asyncio.Task[None] | None = None
    _seen: float = 0.0

    def watch(self, ops: Operations) -> None:
        """Note a viewer; start the sampler if it is not running."""
        self._seen = time.monotonic()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._sample(ops), name="console-lag-sampler")

    async def sample_now(self, ops: Operations) -> None:
        try:
            rows = await ops.lag()
        except Exception as e:  # a broker outage is shown, not raised
            self.last_error = f"lag unavailable: {e}"
            log.warning("console lag sample failed: %s", e)
        else:
            self.last_error = None
            self.history.add(time.time(), rows)

    async def _sample(self, ops: Operations) -> None:
        while time.monotonic() - self._seen < self.idle_s:
            await self.sample_now(ops)
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        tasks = [self._task] + [r.task for r in self.replays.values()]
        for t in tasks:
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
