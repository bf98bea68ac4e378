"""``kill -USR2``'s dump: each task with its whole await chain, and a stuck batch named in
the processor's state."""

from __future__ import annotations

import asyncio
import io

from memstream.infra.supervisor import LoopState, describe_snapshot
from memstream.infra.task_dump import BEGIN, END, dump_tasks


async def _innermost(gate: asyncio.Event) -> None:
    await gate.wait()


async def _middle(gate: asyncio.Event) -> None:
    await _innermost(gate)


async def test_the_dump_shows_the_await_chain_down_to_the_future() -> None:
    gate = asyncio.Event()
    task = asyncio.create_task(_middle(gate), name="processor:message-projector")
    await asyncio.sleep(0)
    out = io.StringIO()
    try:
        n = dump_tasks(out)
    finally:
        gate.set()
        await task
    text = out.getvalue()
    assert n >= 2  # this test's task too
    assert text.startswith(BEGIN) and text.rstrip().endswith(END)
    block = text.split("task 'processor:message-projector':", 1)[1].split("task '", 1)[0]
    # outermost first, down to what the innermost coroutine waits on
    assert block.index("in _middle") < block.index("in _innermost") < block.index("in wait")
    assert "awaiting <Future pending" in block


def test_a_batch_held_past_the_bound_is_named_in_the_state() -> None:
    st = LoopState()
    assert st.describe() == "running"
    st.working()
    assert st.describe() == "running"  # a batch in hand for less than 30 s is normal
    snap = st.to_dict()
    assert isinstance(snap["busy_since"], float)
    assert describe_snapshot(snap, now=snap["busy_since"] + 196) == "running, one batch for 196s"
    st.idle()
    assert st.to_dict()["busy_since"] is None
    st.working("a commit")
    snap = st.to_dict()
    assert isinstance(snap["busy_since"], float)
    assert describe_snapshot(snap, now=snap["busy_since"] + 45) == "running, a commit for 45s"
    st.idle()
    st.waiting("postgres", "down")
    assert st.describe() == "waiting for postgres"
