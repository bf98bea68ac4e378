"""Issue 12: the supervised loops' and the embedded servers' states are Prometheus series on
``/metrics`` (``memstream_loop_state``, ``memstream_loop_restarts_total``,
``memstream_server_up``, ``memstream_server_state``, ``memstream_server_restarts_total``),
and they follow a real Valkey child killed with SIGKILL and restarted by its keeper, and a
loop that fails and is started again."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from memstream.infra.embedded.keeper import Keepers, RestartPolicy
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.metrics import Metrics, make_metrics
from memstream.infra.supervisor import LoopStates, supervise

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.chaos]


def scrape(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The text exposition of ``m`` parsed back: ``{(sample name, labels): value}``."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return scrape(m).get((name, tuple(sorted(labels.items()))))


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)


async def test_loop_and_server_states_follow_a_killed_and_restarted_part(tmp_path: Path) -> None:
    m = make_metrics()
    loops = LoopStates()
    keepers = Keepers(RestartPolicy(max_tries=3, min_backoff_s=2.0))
    valkey = EmbeddedRedis(tmp_path / "valkey")
    await valkey.start()
    keeper = keepers.watch(valkey)
    m.track_states(loops=loops.snapshot, servers=keepers.snapshot)

    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionRefusedError("the store is away")
        await asyncio.Event().wait()  # then runs for good

    stop_loop = supervise("flaky", flaky, loops, min_backoff=2.0)
    try:
        # the loop: backoff after its failure, then running again with one restart
        await until(
            lambda: value(m, "memstream_loop_state", loop="flaky", state="backoff") == 1,
            10,
            "loop backoff",
        )
        assert value(m, "memstream_loop_state", loop="flaky", state="running") == 0
        await until(
            lambda: value(m, "memstream_loop_state", loop="flaky", state="running") == 1,
            30,
            "loop running again",
        )
        assert value(m, "memstream_loop_restarts_total", loop="flaky") == 1

        # a processor paused on a store: waiting, and for what
        loops.get("processor:counters").waiting("postgres", ConnectionRefusedError("down"))
        assert value(m, "memstream_loop_waiting", loop="processor:counters", dependency="postgres")
        assert value(m, "memstream_loop_state", loop="processor:counters", state="waiting") == 1
        loops.get("processor:counters").recovered()
        assert (
            value(m, "memstream_loop_waiting", loop="processor:counters", dependency="postgres")
            is None
        )

        # the server: up, then killed (down, restarting), then up again with one restart
        assert value(m, "memstream_server_up", server="valkey") == 1
        assert value(m, "memstream_server_restarts_total", server="valkey") == 0
        assert valkey.pid is not None
        os.kill(valkey.pid, signal.SIGKILL)
        await until(
            lambda: value(m, "memstream_server_up", server="valkey") == 0,
            10,
            "server down",
        )
        assert value(m, "memstream_server_state", server="valkey", state="restarting") == 1
        assert await keeper.wait_restarted(1, timeout=60), keeper.state
        assert value(m, "memstream_server_up", server="valkey") == 1
        assert value(m, "memstream_server_state", server="valkey", state="running") == 1
        assert value(m, "memstream_server_restarts_total", server="valkey") == 1
    finally:
        await stop_loop()
        await keepers.stop()
        await valkey.stop()
    assert value(m, "memstream_loop_state", loop="flaky", state="stopped") == 1


async def test_a_broken_state_source_never_breaks_the_scrape() -> None:
    m = make_metrics()

    def broken() -> dict[str, dict[str, object]]:
        raise RuntimeError("no snapshot")

    m.track_states(loops=broken, parts=lambda: {"postgres": False, "redis": True})
    got = scrape(m)
    assert got[("memstream_ready", (("part", "postgres"),))] == 0
    assert got[("memstream_ready", (("part", "redis"),))] == 1
    assert not any(name.startswith("memstream_loop") for name, _ in got)
