"""The chaos suite, bounded (issue 12): load through the public HTTP API of a real
``memstream up``, one fault at a time, and after each: lag 0 and gap 0, then every
acknowledged write checked in every store (see ``harness``). ``bench/soak.py`` runs the
long form (more data, every fault, repeated)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tests.chaos import harness as h

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.chaos]


async def phase(
    up: h.Up,
    ledger: h.Ledger,
    fault: Callable[[], Awaitable[None]],
    *,
    before_s: float = 2.0,
    after_s: float = 2.0,
) -> float:
    """Load, fault mid-load, load on, stop; then converge and check. Returns the seconds to
    converge."""
    stop = asyncio.Event()
    loader = asyncio.create_task(h.load(lambda: up.url, ledger, stop, threads=6, concurrency=4))
    await asyncio.sleep(before_s)
    await fault()
    await asyncio.sleep(after_s)
    stop.set()
    await loader
    took = await h.converge(up)
    report = h.Report()
    await h.check_live(up, ledger, report, only_new=True)
    unexpected = h.unexpected_letters(report.dead_letters)
    assert report.ok(), "\n".join(report.lines())
    assert unexpected == [], unexpected
    return took


async def test_faults_one_at_a_time_lose_and_double_nothing(
    chaos_data: Path,
) -> None:
    data = chaos_data
    up = h.Up(data, env={"MEMSTREAM_KAFKA_BROKER": "kafka"})
    ledger = h.Ledger()
    up.start()
    await h.bind_memory(up.url)
    try:

        async def memstream_kill9() -> None:
            up.kill9()
            up.start()

        async def broker_kill9() -> None:
            await h.restart_child(up, "kafka")

        async def postgres_kill() -> None:
            await h.restart_child(up, "postgres")

        async def valkey_kill() -> None:
            await h.restart_child(up, "valkey")

        async def bad_records() -> None:
            await h.publish_malformed(up)
            async with httpx.AsyncClient(
                base_url=up.url, headers={"Authorization": f"Bearer {h.KEY}"}
            ) as c:
                big = {"role": "user", "content": "x" * (5 * 1024 * 1024)}
                r = await c.post(f"/v1/agents/{h.AGENT}/threads/t0/messages", json=big)
                assert r.status_code in (400, 413) and "error" in r.json(), r.text[:300]
                r = await c.post(
                    f"/v1/agents/{h.AGENT}/threads/t0/messages",
                    content=b'{"role": "user", "content": ',
                    headers={"content-type": "application/json"},
                )
                assert r.status_code == 400 and "error" in r.json(), r.text[:300]

        for fault in (broker_kill9, postgres_kill, valkey_kill, bad_records):
            await phase(up, ledger, fault)
        assert ledger.appends_ok > 100 and ledger.stores_ok > 10, ledger
        report = h.Report()
        await h.check_live(up, ledger, report)  # everything again: nothing lost since
        assert report.ok(), "\n".join(report.lines())
    finally:
        up.stop()
        await h.stop_owned()
    report = h.Report()
    await h.check_journal(data, ledger, report)
    assert report.ok(), "\n".join(report.lines())
