"""The journal against real SlateDB on a local folder: offsets, reads, tool calls, the global
sequence, restart recovery, group commit, fencing, the follower reader, failures."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from slatedb.uniffi import ObjectStore

from memstream.clock import FixedClock
from memstream.errors import InvalidRequest, JournalFenced, JournalUnavailable
from memstream.infra.journal import (
    Journal,
    JournalReader,
    journal_location,
    local_store,
    open_journal,
    open_journal_reader,
)
from memstream.infra.journal.reads import JournalReads
from memstream.infra.metrics import Metrics
from memstream.infra.settings import Settings
from memstream.infra.tokenizer import count_message_tokens
from memstream.schemas.events import decode, message_of, thread_event
from memstream.schemas.records import NewMessage, ThreadRef, ToolCall

pytestmark = pytest.mark.asyncio(loop_scope="session")

T1 = ThreadRef("acct", "agent", "t1")
T2 = ThreadRef("acct", "agent", "t2")


def user(text: str) -> NewMessage:
    return NewMessage(role="user", content=text)


async def test_append_assigns_dense_offsets_ids_tokens_and_seq(journal: Journal) -> None:
    first = await journal.append(T1, [user("hello there")])
    rest = await journal.append(T1, [user("one"), NewMessage(role="assistant", content="two")])
    other = await journal.append(T2, [user("other thread")])

    msgs = first + rest
    assert [m.offset for m in msgs] == [0, 1, 2]
    assert other[0].offset == 0
    assert [m.seq for m in msgs + other] == [1, 2, 3, 4]
    ids = [m.message_id for m in msgs + other]
    assert len(set(ids)) == 4
    assert ids == sorted(ids)  # time-ordered, strictly increasing in one writer
    assert msgs[0].token_count == count_message_tokens(user("hello there")) > 0
    assert msgs[0].created_at == FixedClock().now()
    assert await journal.next_offset(T1) == 3
    assert await journal.next_offset(ThreadRef("acct", "agent", "empty")) == 0


async def test_last_and_read_range(journal: Journal) -> None:
    await journal.append(T1, [user(f"m{i}") for i in range(5)])
    last2 = await journal.last(T1, 2)
    assert [m.content for m in last2] == ["m3", "m4"]
    everything = await journal.last(T1, 100)  # N > count gives all, ascending
    assert [m.offset for m in everything] == [0, 1, 2, 3, 4]
    assert await journal.last(T1, 0) == []
    assert [m.content for m in await journal.read_range(T1, 1, 3)] == ["m1", "m2", "m3"]
    assert [m.offset for m in await journal.read_range(T1, 3, 99)] == [3, 4]
    assert await journal.read_range(T1, 4, 2) == []
    assert await journal.last(T2, 5) == []
    with pytest.raises(InvalidRequest) as e:
        await journal.read_range(T1, -1, 2)
    assert e.value.field == "start"


async def test_threads_with_prefix_ids_do_not_mix(journal: Journal) -> None:
    a = ThreadRef("acct", "agent", "a")
    ab = ThreadRef("acct", "agent", "a/b")
    a_b = ThreadRef("acct", "agent/a", "b")
    await journal.append(a, [user("a")])
    await journal.append(ab, [user("ab")])
    await journal.append(a_b, [user("a_b")])
    assert [m.content for m in await journal.last(a, 10)] == ["a"]
    assert [m.content for m in await journal.last(ab, 10)] == ["ab"]
    assert [m.content for m in await journal.last(a_b, 10)] == ["a_b"]


async def test_bad_input_names_the_field(journal: Journal) -> None:
    with pytest.raises(InvalidRequest) as e:
        await journal.append(T1, [])
    assert e.value.field == "messages"
    with pytest.raises(InvalidRequest) as e:
        await journal.append(T1, [user("ok"), NewMessage(role="robot", content="x")])  # type: ignore[arg-type]  # deliberately not a Role
    assert e.value.field == "messages[1].role"
    assert await journal.next_offset(T1) == 0  # nothing half-written


async def test_tool_call_payload_and_result(journal: Journal) -> None:
    call = ToolCall(id="call_1", name="search", arguments={"q": "weather", "n": 3})
    await journal.append(
        T1,
        [user("what's the weather"), NewMessage(role="assistant", content="", tool_calls=(call,))],
    )
    rec = await journal.tool_call("acct", "agent", "call_1", "t1")
    assert rec is not None
    assert (rec.name, rec.arguments, rec.result) == ("search", {"q": "weather", "n": 3}, None)
    assert (rec.thread_id, rec.offset) == ("t1", 1)

    await journal.append(T1, [NewMessage(role="tool", content="sunny, 21C", tool_call_id="call_1")])
    rec = await journal.tool_call("acct", "agent", "call_1", "t1")
    assert rec is not None
    assert rec.document() == {
        "name": "search",
        "arguments": {"q": "weather", "n": 3},
        "result": "sunny, 21C",
    }
    # per account/agent: another agent does not see it
    assert await journal.tool_call("acct", "other-agent", "call_1", "t1") is None
    assert await journal.tool_call("acct", "agent", "nope", "t1") is None
    assert await journal.tool_call("acct", "agent", "call_1", "t2") is None  # per thread


async def test_two_threads_reusing_a_tool_call_id_keep_two_records(journal: Journal) -> None:
    """Models number calls ``call_0``, ``call_1``... in every thread: a later thread reusing
    an id neither overwrites the first thread's record nor inherits its result."""
    a, b = ThreadRef("acct", "agent", "reuse-a"), ThreadRef("acct", "agent", "reuse-b")
    call_a = ToolCall(id="call_0", name="read_mail", arguments={"box": "a"})
    await journal.append(
        a,
        [
            NewMessage(role="assistant", content="", tool_calls=(call_a,)),
            NewMessage(role="tool", content="alice's secret mail", tool_call_id="call_0"),
        ],
    )
    call_b = ToolCall(id="call_0", name="weather", arguments={"city": "Oslo"})
    await journal.append(b, [NewMessage(role="assistant", content="", tool_calls=(call_b,))])
    rec_a = await journal.tool_call("acct", "agent", "call_0", "reuse-a")
    rec_b = await journal.tool_call("acct", "agent", "call_0", "reuse-b")
    assert rec_a is not None and rec_b is not None
    assert (rec_a.name, rec_a.result) == ("read_mail", "alice's secret mail")
    assert (rec_b.name, rec_b.result) == ("weather", None)  # not a copy of a's result
    both = await journal.tool_calls("acct", "agent", "call_0")
    assert sorted(r.thread_id or "" for r in both) == ["reuse-a", "reuse-b"]
    # reused within one thread: the new call is a new record, not the old call's result
    call_a2 = ToolCall(id="call_0", name="calendar", arguments={})
    await journal.append(a, [NewMessage(role="assistant", content="", tool_calls=(call_a2,))])
    again = await journal.tool_call("acct", "agent", "call_0", "reuse-a")
    assert again is not None and (again.name, again.result) == ("calendar", None)


async def test_tool_call_and_result_in_one_append(journal: Journal) -> None:
    call = ToolCall(id="c2", name="calc", arguments="1+1")
    await journal.append(
        T1,
        [
            NewMessage(role="assistant", content="", tool_calls=(call,)),
            NewMessage(role="tool", content="2", tool_call_id="c2"),
        ],
    )
    rec = await journal.tool_call("acct", "agent", "c2", "t1")
    assert rec is not None
    assert (rec.name, rec.arguments, rec.result) == ("calc", "1+1", "2")


async def test_read_seq_carries_messages_and_thread_events_in_order(journal: Journal) -> None:
    env = thread_event("thread.created", "acct", "agent", "t1", ts=1, data={"config": {}})
    assert await journal.append_event(env) == 1
    await journal.append(T1, [user("a"), user("b")])
    rows = await journal.read_seq(0, 10)
    assert [s for s, _ in rows] == [1, 2, 3]
    first = decode(rows[0][1])
    assert first.type == "thread.created"
    assert first.id == env.id
    msgs = [message_of(decode(raw)) for _, raw in rows[1:]]
    assert [(m.offset, m.content, m.seq) for m in msgs] == [(0, "a", 2), (1, "b", 3)]
    assert decode(rows[1][1]).id == f"msg:{msgs[0].message_id}"
    assert [s for s, _ in await journal.read_seq(2, 10)] == [3]
    assert await journal.read_seq(3, 10) == []
    assert [s for s, _ in await journal.read_seq(0, 2)] == [1, 2]
    with pytest.raises(InvalidRequest):
        await journal.append_event(
            decode(rows[1][1])  # message.appended does not go through append_event
        )


async def test_relay_watermark_never_moves_back(journal: Journal) -> None:
    assert await journal.relay_watermark() == 0
    await journal.set_relay_watermark(5)
    await journal.set_relay_watermark(3)
    assert await journal.relay_watermark() == 5


async def test_restart_keeps_offsets_seq_and_watermark(
    journal_store: tuple[ObjectStore, str],
) -> None:
    store, path = journal_store
    j = await Journal.open(store, path)
    await j.append(T1, [user("a"), user("b")])
    await j.append(T2, [user("c")])
    await j.set_relay_watermark(2)
    await j.close()

    j = await Journal.open(store, path)
    try:
        again = await j.append(T1, [user("d")])
        assert (again[0].offset, again[0].seq) == (2, 4)
        assert [m.content for m in await j.last(T1, 10)] == ["a", "b", "d"]
        assert await j.relay_watermark() == 2
        assert (await j.append(T2, [user("e")]))[0].offset == 1
    finally:
        await j.close()


async def test_group_commit_under_concurrency(journal: Journal) -> None:
    threads = [ThreadRef("acct", "agent", f"g{i}") for i in range(10)]

    async def one(i: int) -> list[int]:
        ref = threads[i % 10]
        return [m.offset for m in await journal.append(ref, [user(f"msg {i}")])]

    before = journal.stats.batches
    results = await asyncio.gather(*(one(i) for i in range(200)))
    batches = journal.stats.batches - before

    assert sum(len(r) for r in results) == 200
    for ref in threads:
        stored = await journal.last(ref, 100)
        assert [m.offset for m in stored] == list(range(20))  # dense, no dup, no gap
    seqs = [s for s, _ in await journal.read_seq(0, 1000)]
    assert seqs == list(range(1, 201))
    # the relay resumes mid-batch: seq blocks are split exactly at after_seq and limit
    middle = await journal.read_seq(37, 50)
    assert [s for s, _ in middle] == list(range(38, 88))
    assert [message_of(decode(raw)).seq for _, raw in middle] == list(range(38, 88))
    assert await journal.last_seq() == 200
    # the writer's own count (no read) is what the log holds
    assert await JournalReads.last_seq(journal) == 200
    assert batches <= 20, f"{batches} durable waits for 200 appends: no group commit"


async def test_metrics_record_latency_and_batch_sizes(
    journal_store: tuple[ObjectStore, str],
) -> None:
    store, path = journal_store
    metrics = Metrics()
    j = await Journal.open(store, path, metrics=metrics)
    try:
        await asyncio.gather(*(j.append(T1, [user("x"), user("y")]) for _ in range(4)))
    finally:
        await j.close()
    assert metrics.sample("memstream_journal_append_seconds_count") == 4
    assert metrics.sample("memstream_journal_group_commit_batch_size_sum") == 8
    assert metrics.sample("memstream_journal_group_commit_batch_size_count") == j.stats.batches


async def test_fencing_second_writer_takes_over(
    journal_store: tuple[ObjectStore, str],
) -> None:
    store, path = journal_store
    old = await Journal.open(store, path)
    await old.append(T1, [user("before")])
    new = await Journal.open(store, path)
    try:
        with pytest.raises(JournalFenced):
            await old.append(T1, [user("lost")])
        assert old.fenced
        with pytest.raises(JournalFenced):  # and it keeps refusing
            await old.append(T2, [user("also refused")])
        # the write the old writer never acknowledged is not in the journal
        assert [m.content for m in await new.last(T1, 10)] == ["before"]
        after = await new.append(T1, [user("after")])
        assert (after[0].offset, after[0].seq) == (1, 2)
        # the fenced writer does not answer from its own stale count (1): it reads the log,
        # which refuses it, as every read of a fenced writer does
        with pytest.raises(JournalFenced):
            await old.last_seq()
        assert await new.last_seq() == await JournalReads.last_seq(new) == 2
    finally:
        await old.close()
        await new.close()


async def test_reader_follows_durable_writes(
    journal: Journal, journal_store: tuple[ObjectStore, str]
) -> None:
    store, path = journal_store
    await journal.append(T1, [user("first")])
    reader = await JournalReader.open(store, path, poll_interval_ms=10)
    try:
        assert [m.content for m in await reader.last(T1, 5)] == ["first"]
        call = ToolCall(id="rc", name="f", arguments=None)
        await journal.append(T1, [NewMessage(role="assistant", content="x", tool_calls=(call,))])
        assert await reader.wait_for(T1, 1, timeout=5.0)
        assert [m.content for m in await reader.read_range(T1, 0, 1)] == ["first", "x"]
        assert await reader.next_offset(T1) == 2
        assert (await reader.tool_call("acct", "agent", "rc", "t1")) is not None
        assert [s for s, _ in await reader.read_seq(0, 10)] == [1, 2]
        assert not await reader.wait_for(T1, 5, timeout=0.05)
    finally:
        await reader.close()


async def test_broken_store_is_journal_unavailable(journal_dir: Path) -> None:
    j = await Journal.open(local_store(journal_dir), "journal")
    # enough bytes that the thread's messages and the sequence land in different SST blocks
    for i in range(20):
        await j.append(T1, [user(f"{i} " + "x" * 2000)])
    await j.close()  # shutdown flushes the memtable into an SST
    j = await Journal.open(local_store(journal_dir), "journal")
    try:
        shutil.rmtree(journal_dir)
        with pytest.raises(JournalUnavailable):
            await j.last(T1, 5)
    finally:
        await j.close()


async def test_reader_of_a_missing_journal_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(JournalUnavailable):
        await JournalReader.open(local_store(tmp_path), "never-created")


async def test_settings_open_a_local_journal_and_a_follower(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    j = await open_journal(settings, FixedClock())
    reader = None
    try:
        await j.append(T1, [user("from settings")])
        assert (tmp_path / "journal").is_dir()
        reader = await open_journal_reader(settings)
        assert await reader.wait_for(T1, 0, timeout=5.0)
    finally:
        if reader is not None:
            await reader.close()
        await j.close()


async def test_journal_url_must_be_a_known_scheme(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest) as e:
        journal_location(Settings(data_dir=tmp_path, journal_url="file:///tmp/x"))
    assert e.value.field == "journal_url"
    _, path = journal_location(Settings(journal_url="s3://bucket/some/prefix"))
    assert path == "some/prefix/journal"


async def test_on_durable_callbacks_run_after_each_commit(tmp_path: Path) -> None:
    journal = await Journal.open(local_store(tmp_path / "cb"), "journal")
    calls: list[int] = []
    journal.on_durable(lambda: calls.append(journal.stats.batches))
    try:
        await journal.append(ThreadRef("a", "b", "t"), [NewMessage(role="user", content="hi")])
        assert calls == [1]  # called once, after the batch was durable (stats already moved)
        assert [m.content for m in await journal.last(ThreadRef("a", "b", "t"), 5)] == ["hi"]
    finally:
        await journal.close()
