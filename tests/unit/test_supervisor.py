"""Supervised background loops (issue 12, defect 3): a loop that dies is logged, backed off
and started again, and its state is visible."""

from __future__ import annotations

import asyncio

import pytest

from memstream.infra.supervisor import LoopStates, describe_snapshot, supervise

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_loop_that_fails_is_restarted_with_backoff_and_its_state_exposed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    states = LoopStates()
    runs: list[int] = []
    healthy = asyncio.Event()

    async def outbox() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:  # Postgres is away for the first two runs
            raise ConnectionResetError("the database went away")
        healthy.set()
        await asyncio.Event().wait()  # back: runs until stopped

    stop = supervise("outbox-relay", outbox, states, min_backoff=0.01, max_backoff=0.05)
    try:
        await asyncio.wait_for(healthy.wait(), 5)
        snap = states.snapshot()["outbox-relay"]
        assert snap["state"] == "running" and snap["restarts"] == 2
        assert snap["last_error"] == "ConnectionResetError: the database went away"
        assert states.all_running()
        assert "background loop outbox-relay failed" in caplog.text  # never silent
    finally:
        await stop()
    assert states.snapshot()["outbox-relay"]["state"] == "stopped"
    assert len(runs) == 3


async def test_a_loop_that_returns_is_restarted_too() -> None:
    states = LoopStates()
    calls = 0
    seen_backoff = asyncio.Event()

    async def quits() -> None:
        nonlocal calls
        calls += 1

    stop = supervise("hygiene", quits, states, min_backoff=0.2)
    try:
        async with asyncio.timeout(5):
            while states.snapshot()["hygiene"]["state"] != "backoff":
                await asyncio.sleep(0.01)
        seen_backoff.set()
        assert states.snapshot()["hygiene"]["last_error"] == "the loop returned"
        assert not states.all_running()
    finally:
        await stop()
    assert calls >= 1 and seen_backoff.is_set()


async def test_a_loop_that_retries_by_itself_reports_backoff_then_running() -> None:
    """Processor consume loops retry in place (issue 12): their state still shows it."""
    states = LoopStates()
    st = states.get("processor:counters")
    assert states.problem() is None
    st.failed(ConnectionRefusedError("broker away"))
    snap = states.snapshot()["processor:counters"]
    assert snap["state"] == "backoff" and snap["restarts"] == 1
    assert states.problem() == ("processor:counters backoff (ConnectionRefusedError: broker away)")
    st.recovered()
    assert states.problem() is None and states.all_running()


async def test_a_loop_waiting_for_a_store_says_which_and_is_no_restart() -> None:
    states = LoopStates()
    st = states.get("processor:counters")
    st.waiting("postgres", ConnectionRefusedError("refused"))
    since = st.since
    st.waiting("postgres", ConnectionRefusedError("refused again"))
    snap = states.snapshot()["processor:counters"]
    assert snap["state"] == "waiting" and snap["waiting_for"] == "postgres"
    assert snap["restarts"] == 0 and snap["since"] == since  # one wait, from its start
    assert states.problem() == (
        "processor:counters waiting for postgres (ConnectionRefusedError: refused again)"
    )
    st.recovered()
    assert (
        states.problem() is None and states.snapshot()["processor:counters"]["waiting_for"] is None
    )


async def test_a_snapshot_read_back_describes_the_wait() -> None:
    states = LoopStates()
    states.get("processor:counters").waiting("valkey", "ConnectionError: refused")
    states.get("outbox-relay")
    snap = states.snapshot()
    assert describe_snapshot(snap["processor:counters"]) == "waiting for valkey"
    assert describe_snapshot(snap["outbox-relay"]) == "running"
    assert describe_snapshot({}) == "unknown"
