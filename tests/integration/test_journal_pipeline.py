"""The journal's pipelined committer against real SlateDB: a batch staged while the one
before it is still being made durable continues its offsets, seqs and tool-call records, is
acknowledged only after it, and fails with it (nothing of either is stored)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from slatedb.uniffi import ObjectStore, WriteBatch

from memstream.errors import JournalFenced
from memstream.infra.journal import Journal
from memstream.schemas.events import decode, message_of
from memstream.schemas.records import NewMessage, ThreadRef, ToolCall

pytestmark = pytest.mark.asyncio(loop_scope="session")

T1 = ThreadRef("acct", "agent", "p1")
T2 = ThreadRef("acct", "agent", "p2")


class Gate:
    """Holds the writer's SlateDB writes until opened, so a test can stage a batch while the
    one before it is certainly still in flight. Everything else goes to the real ``Db``."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.opened = asyncio.Event()
        self.waiting = asyncio.Event()

    async def write(self, wb: WriteBatch) -> Any:
        self.waiting.set()
        await self.opened.wait()
        return await self._db.write(wb)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def gated(j: Journal) -> Gate:
    gate = Gate(j._wdb)
    j._wdb = gate
    return gate


async def test_batch_staged_behind_one_in_flight_continues_it(
    journal_store: tuple[ObjectStore, str],
) -> None:
    store, path = journal_store
    j = await Journal.open(store, path)
    gate = gated(j)
    try:
        call = ToolCall(id="call-1", name="lookup", arguments={"q": "x"})
        first = asyncio.create_task(
            j.append(T1, [NewMessage(role="assistant", content="", tool_calls=(call,))])
        )
        await gate.waiting.wait()  # the first batch is being written
        order: list[str] = []
        first.add_done_callback(lambda _: order.append("first"))
        second_task = asyncio.create_task(
            j.append(
                T1,
                [
                    NewMessage(role="tool", content="42", tool_call_id="call-1"),
                    NewMessage(role="user", content="thanks"),
                ],
            )
        )
        second_task.add_done_callback(lambda _: order.append("second"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert j.stats.pipelined == 1 and not first.done()  # staged behind the first
        gate.opened.set()
        second = await second_task
        made = await first
        assert order == ["first", "second"]  # acknowledged in order
        assert [m.offset for m in made + second] == [0, 1, 2]
        assert [m.seq for m in made + second] == [1, 2, 3]
        rec = await j.tool_call("acct", "agent", "call-1", "p1")
        # the result, staged on top of a call record that was not durable yet, kept its name
        assert rec is not None and (rec.name, rec.result) == ("lookup", "42")
        assert [m.content for m in await j.last(T1, 10)] == ["", "42", "thanks"]
        seqs = await j.read_seq(0, 10)
        assert [message_of(decode(raw)).offset for _, raw in seqs] == [0, 1, 2]
    finally:
        await j.close()


async def test_a_failed_batch_fails_the_one_staged_behind_it(
    journal_store: tuple[ObjectStore, str],
) -> None:
    store, path = journal_store
    old = await Journal.open(store, path)
    gate = gated(old)
    new: Journal | None = None
    try:
        first = asyncio.create_task(old.append(T1, [NewMessage(role="user", content="a")]))
        await gate.waiting.wait()
        second = asyncio.create_task(old.append(T2, [NewMessage(role="user", content="b")]))
        for _ in range(5):
            await asyncio.sleep(0)
        assert old.stats.pipelined == 1  # staged behind the first
        new = await Journal.open(store, path)  # fences the old writer before it writes
        gate.opened.set()
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert all(isinstance(r, JournalFenced) for r in results), results
        assert old.fenced
        assert old.stats.failed_batches == 1  # the batch behind it was never written
        # neither was stored: the new writer starts both threads at offset 0, seq 1
        assert await new.last(T1, 5) == [] and await new.last(T2, 5) == []
        again = await new.append(T2, [NewMessage(role="user", content="b again")])
        assert (again[0].offset, again[0].seq) == (0, 1)
    finally:
        await old.close()
        if new is not None:
            await new.close()


async def test_concurrent_appends_stay_dense_across_pipelined_batches(
    journal_store: tuple[ObjectStore, str],
) -> None:
    store, path = journal_store
    j = await Journal.open(store, path, flush_interval_ms=5, max_batch=8)
    try:
        refs = [ThreadRef("acct", "agent", f"d{i}") for i in range(5)]

        async def burst(i: int) -> None:
            for k in range(10):
                await j.append(refs[i % 5], [NewMessage(role="user", content=f"{i}-{k}")])
                if k % 3 == 0:
                    await asyncio.sleep(0)

        await asyncio.gather(*(burst(i) for i in range(20)))
        for ref in refs:
            assert [m.offset for m in await j.last(ref, 100)] == list(range(40))
        assert [s for s, _ in await j.read_seq(0, 1000)] == list(range(1, 201))
    finally:
        await j.close()
