"""How late the event loop wakes a task that sleeps 1 ms at a time: the benches' measure of
what their calls stop the loop for (a call that holds the GIL on a worker thread, as
qdrant-edge's queries do, stops it for its length, whatever thread it runs on)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator


@contextlib.asynccontextmanager
async def loop_lateness() -> AsyncIterator[list[float]]:
    """Yields the list the ticker fills, in ms late per wake-up, while the block runs."""
    late: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append((time.perf_counter() - t - 0.001) * 1000)

    task = asyncio.ensure_future(ticker())
    try:
        yield late
    finally:
        done = True
        await task
