"""Pure parts of replay and read-your-writes: checkpoint round trip and progress arithmetic,
projection names, watermarks (wait, time out with the applied position, bounded memory), the
recorders, and the CLI's drawing of progress lines (exit status)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from rich.console import Console

from memstream.errors import InvalidRequest, NotReady
from memstream.infra.cli.replay_cmd import draw
from memstream.projections.positions import Watermarks
from memstream.projections.replay import ReplayState, check_projection
from memstream.projections.replay_sinks import database_of, environment_of
from memstream.schemas.events import Envelope
from memstream.streams.gate import record_memory, record_messages
from memstream.streams.processor import EventMeta, Received


def test_checkpoint_round_trips_and_counts_progress() -> None:
    st = ReplayState(
        "messages", 3, 2, "topic", starts={0: 5, 1: 0}, ends={0: 15, 1: 10}, next={0: 10, 1: 0}
    )
    st.extra = {"accounts": ["a", "b"]}
    back = ReplayState.from_json(st.to_json())
    assert back == st
    assert (st.total, st.done) == (20, 5)


def test_projection_names_and_generation_names() -> None:
    assert check_projection("memory") == "memory"
    with pytest.raises(InvalidRequest) as ex:
        check_projection("messagez")
    assert ex.value.field == "projection"
    assert [database_of("memstream", g) for g in (1, 2, 3)] == [
        "memstream",
        "memstream_v2",
        "memstream_v3",
    ]
    assert environment_of("prod", 1) == "prod" and environment_of("prod", 2) == "prod.v2"


@pytest.mark.asyncio(loop_scope="session")
async def test_wait_returns_once_applied_and_times_out_with_the_applied_position() -> None:
    marks = Watermarks("test")
    marks.advance("k", 4)
    with pytest.raises(NotReady) as ex:
        await marks.wait_for("k", 5, 0.05)
    assert ex.value.position == 4
    with pytest.raises(NotReady) as ex:
        await marks.wait_for("unknown", 1, 0.0)
    assert ex.value.position == 0

    waiter = asyncio.create_task(marks.wait_for("k", 7, 5))
    await asyncio.sleep(0.01)
    marks.advance("k", 6)
    await asyncio.sleep(0.01)
    assert not waiter.done()
    marks.advance("k", 9)
    assert await waiter == 9
    marks.advance("k", 2)  # never backwards
    assert marks.get("k") == 9


def test_watermarks_forget_the_least_recent_keys_beyond_the_bound() -> None:
    marks = Watermarks("test", max_keys=2)
    for k in ("a", "b", "c"):
        marks.advance(k, 1)
    assert marks.get("a") is None and marks.get("c") == 1


def _received(env: Envelope) -> Received:
    return Received(env, EventMeta("t", 0, 0, None))


def test_recorders_take_the_highest_position_per_key() -> None:
    marks = Watermarks("m")
    record_messages(marks)(
        [
            _received(Envelope("message.appended", "1", 1, "a", "g", "t", {"seq": 8})),
            _received(Envelope("message.appended", "2", 1, "a", "g", "t", {"seq": 5})),
            _received(Envelope("thread.created", "3", 1, "a", "g", "u", {"seq": 99})),
        ]
    )
    assert marks.get("a/g/t") == 8 and marks.get("a/g/u") is None
    mem = Watermarks("mem")
    record_memory(mem)(
        [_received(Envelope("memory.stored", "4", 1, "a", "g", None, {"entry": {"version": 3}}))]
    )
    assert mem.get("a/g") == 3


async def _lines(*items: dict[str, object]) -> AsyncIterator[dict[str, object]]:
    for it in items:
        yield it


@pytest.mark.asyncio(loop_scope="session")
async def test_cli_draws_the_report_and_fails_on_an_error_line() -> None:
    console = Console(record=True, width=100)
    line: dict[str, object] = {
        "projection": "messages", "phase": "replay", "generation": 2, "previous": 1,
        "source": "topic", "done": 5, "total": 10, "events_read": 5, "rows_written": 4,
        "duplicates_skipped": 1, "undecodable": 0, "elapsed_s": 0.5, "rate": 10.0,
        "resumed": False,
    }  # fmt: skip
    ok = await draw(
        _lines(line | {"type": "start"}, line | {"type": "report", "done": 10}), console
    )
    assert ok
    text = console.export_text()
    assert "duplicates skipped" in text and "rows written" in text
    assert not await draw(
        _lines(line | {"type": "start"}, {"type": "error", "message": "x"}), console
    )
    assert not await draw(_lines(line | {"type": "progress"}), console)  # cut off: no report
