"""SIGKILL of ``memstream up`` right after acknowledged appends (issue 12's search-loss
finding): after a restart, every acknowledged message is searchable once, and lag and gap
read 0 (see ``harness``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.chaos import harness as h

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.chaos]


async def acks_reach(ledger: h.Ledger, n: int, timeout: float = 90) -> None:
    """Until the load has ``n`` acknowledged appends (fails the test after ``timeout``)."""
    async with asyncio.timeout(timeout):
        while ledger.appends_ok < n:
            await asyncio.sleep(0.1)


async def test_kill9_of_up_right_after_acks_loses_no_search_row(
    chaos_data: Path,
) -> None:
    data = chaos_data
    up = h.Up(data, env={"MEMSTREAM_KAFKA_BROKER": "kafka", "MEMSTREAM_TRANSCRIPT_DENSE": "1"})
    ledger = h.Ledger()
    up.start()
    await h.bind_memory(up.url)
    try:
        stop = asyncio.Event()
        loader = asyncio.create_task(h.load(lambda: up.url, ledger, stop, threads=6, concurrency=4))
        # kill once appends are acknowledged at pace (a fixed sleep got 7 acks at load 14)
        await acks_reach(ledger, 8)
        up.kill9()  # mid-load: the projector has not necessarily written the last acks
        up.start()
        await acks_reach(ledger, ledger.appends_ok + 4)  # the restarted up takes appends
        stop.set()
        await loader
        assert ledger.appends_ok > 10, ledger
        await h.converge(up)
        report = h.Report()
        await h.check_live(up, ledger, report)
        assert report.ok(), "\n".join(report.lines())
    finally:
        up.stop()
        await h.stop_owned()
