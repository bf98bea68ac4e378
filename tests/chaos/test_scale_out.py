"""Scale-out and a processor crash under load (issue 12): two ``memstream worker counters
summarizer`` processes join ``up``'s own consumers while load runs (the groups rebalance onto
three members), one is SIGKILLed at a random point of its work (between applying a batch
and committing its offsets, most of the time: commits are 1 s apart and the load never
stops) and started again while the other leaves cleanly (SIGTERM). Then: lag 0 and gap 0, every
acknowledged write once in every store, counters exact, every summary version written
once and folding each message once (see ``harness``)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from tests.chaos import harness as h

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.chaos]

GROUPS = ("memstream-counters", "memstream-summarizer")


async def test_workers_join_crash_and_leave_under_load_lose_and_double_nothing(
    chaos_data: Path,
) -> None:
    data = chaos_data
    up = h.Up(data, env={"MEMSTREAM_KAFKA_BROKER": "kafka"})
    ledger = h.Ledger()
    up.start()
    await h.bind_memory(up.url)
    a = h.Worker(up, ["counters", "summarizer"], "a")
    b = h.Worker(up, ["counters", "summarizer"], "b")
    rnd = random.Random()
    t0 = time.monotonic()
    marks: list[str] = []

    def mark(what: str) -> None:
        marks.append(f"{what} {time.monotonic() - t0:.1f}s")

    try:
        stop = asyncio.Event()
        loader = asyncio.create_task(h.load(lambda: up.url, ledger, stop, threads=8, concurrency=4))
        await asyncio.sleep(1.0)
        await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.start))
        mark("started")
        await h.wait_members(up, GROUPS, 3)  # up's own member + the two workers
        mark("joined")
        crash_after = rnd.uniform(0.3, 2.5)
        await asyncio.sleep(crash_after)
        a.kill9()  # a processor crash at a random point of its work
        # a starts again while b scales back in (SIGTERM: it commits and leaves); a's start
        # takes longer than the session timeout, so the dead member is gone by then and the
        # groups settle on up's member and the new a
        await asyncio.gather(asyncio.to_thread(a.start), asyncio.to_thread(b.stop))
        mark("restarted, left")
        await h.wait_members(up, GROUPS, 2)
        mark("settled")
        await asyncio.sleep(1.0)
        stop.set()
        await loader
        assert ledger.appends_ok > 100, ledger
        await h.converge(up, timeout=120)
        mark("converged")
        report = h.Report()
        await h.check_live(up, ledger, report)
        h.check_summaries(data, ledger, report)
        took = "; ".join(marks)
        assert report.ok(), f"crash after {crash_after:.2f}s; {took}\n" + "\n".join(report.lines())
        assert report.stores["summaries"].found > 0, "no summary written: the test proves little"
        assert h.unexpected_letters(report.dead_letters) == [], report.dead_letters
    finally:
        a.kill9()
        b.kill9()
        up.stop()
        await h.stop_owned()
