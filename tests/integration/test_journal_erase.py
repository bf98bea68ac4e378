"""The journal step of an erasure finds a thread's sequence blocks without reading the log.

Each message record carries its seq and each ``thread.*`` event has an index key, so
``erase_threads`` looks up the blocks that hold the threads' envelopes. These tests, on a
real SlateDB journal, check that the result is what reading the whole log gave (every
envelope of the erased threads replaced, nothing of another thread touched), that the
whole log is not read when it need not be, and the cases where it must be: a journal
written before events were indexed, a message stored without its seq, and a run cut
between rewriting the blocks and deleting the keys that locate them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
import pytest_asyncio
from slatedb.uniffi import Db, KeyRange, KeyValue, WriteBatch

from memstream.infra.journal import Journal, erase, keys, local_store
from memstream.infra.journal.reads import ALL_KEYS
from memstream.schemas.events import thread_event
from memstream.schemas.records import NewMessage, ThreadRef

REFS = [ThreadRef("acme", "bot", f"t{i}") for i in range(150)]
ERASED = REFS[3:5]


async def fill(journal: Journal, refs: list[ThreadRef], rounds: int, word: str) -> None:
    """A ``thread.created`` per thread, then ``rounds`` appends to every thread at once
    (group commits mix threads in a block, as a busy deployment does)."""
    for ref in refs:
        await journal.append_event(
            thread_event(
                "thread.created",
                ref.account_id,
                ref.agent_id,
                ref.thread_id,
                0,
                data={"metadata": {"title": f"{word} plan"}},
            )
        )
    for r in range(rounds):
        await asyncio.gather(
            *(
                journal.append(ref, [NewMessage("user", f"{word} {ref.thread_id} {r}")])
                for ref in refs
            )
        )


async def log_of(journal: Journal) -> list[dict[str, object]]:
    return [orjson.loads(env) for _, env in await journal.read_seq(0, 1_000_000)]


def of(envelopes: list[dict[str, object]], refs: list[ThreadRef]) -> list[dict[str, object]]:
    ids = {r.thread_id for r in refs}
    return [e for e in envelopes if e.get("thread_id") in ids]


def full_scans(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Records each whole-log read the erasure makes."""
    seen: list[bytes] = []
    real = erase._scan

    def spy(db: Db, prefix: bytes, subrange: KeyRange = ALL_KEYS) -> AsyncIterator[KeyValue]:
        if prefix == keys.SEQUENCE and subrange is ALL_KEYS:
            seen.append(prefix)
        return real(db, prefix, subrange)

    monkeypatch.setattr(erase, "_scan", spy)
    return seen


def check_erased(before: list[dict[str, object]], after: list[dict[str, object]]) -> None:
    """Every envelope of ERASED replaced by a content-free placeholder, every other one
    byte for byte as it was, no seq lost."""
    assert len(after) == len(before)
    for old, new in zip(before, after, strict=True):
        if old.get("thread_id") in {r.thread_id for r in ERASED}:
            assert new["type"] == "thread.deleted" and new["data"] == {"erased": True}
            assert b"kumquat" not in orjson.dumps(new)
        else:
            assert new == old


@pytest_asyncio.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    journal = await Journal.open(local_store(tmp_path), "journal")
    yield journal
    await journal.close()


async def test_an_erasure_finds_the_blocks_of_its_threads_without_reading_the_log(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fill(journal, REFS, rounds=6, word="kumquat")
    before = await log_of(journal)
    scans = full_scans(monkeypatch)
    out = await journal.erase_threads(ERASED)
    assert scans == []  # the log was not read whole
    assert (out.messages, out.sequence) == (12, 14)  # 6 messages + 1 event, per thread
    check_erased(before, await log_of(journal))
    for ref in ERASED:
        assert await journal.last(ref, 10) == []
    assert len(await journal.last(REFS[0], 10)) == 6
    # idempotent: a second run finds nothing, and still reads only what it must
    again = await journal.erase_threads(ERASED)
    assert (again.messages, again.sequence, again.tool_calls) == (0, 0, 0)
    assert scans == []


async def test_erasing_a_large_share_of_the_log_reads_it_once(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``LOCATE_MAX_SHARE`` of the log, one read of it beats a lookup per block."""
    await fill(journal, REFS, rounds=3, word="kumquat")
    before = await log_of(journal)
    scans = full_scans(monkeypatch)
    monkeypatch.setattr(erase, "LOCATE_MAX_SHARE", 0.001)  # 2 threads' 8 seqs of 600
    out = await journal.erase_threads(ERASED)
    assert scans == [keys.SEQUENCE]
    assert (out.messages, out.sequence) == (6, 8)
    check_erased(before, await log_of(journal))


async def test_a_journal_written_before_the_event_index_reads_its_older_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reopened after an upgrade: events before the first open of this release have no index
    key, so the blocks below that seq are all read; the newer part is looked up."""
    store = local_store(tmp_path)
    old = await Journal.open(store, "journal")
    await fill(old, REFS, rounds=3, word="kumquat")
    # as a release without the index left it: no marker, no event keys
    wb = WriteBatch()
    wb.delete(keys.EVENTS_INDEXED_FROM)
    for ref in REFS:
        for seq in range(1, old._seq + 1):
            wb.delete(keys.thread_event_key(ref, seq))
    await old._make_durable(wb)
    await old.close()
    journal = await Journal.open(store, "journal")
    try:
        assert journal._events_indexed_from == 150 + 3 * 150 + 1
        for ref in ERASED:  # written after the upgrade: indexed
            await journal.append_event(
                thread_event(
                    "thread.configured",
                    ref.account_id,
                    ref.agent_id,
                    ref.thread_id,
                    0,
                    {"k": "kumquat"},
                )
            )
        await fill(journal, REFS[:10], rounds=2, word="kumquat")
        before = await log_of(journal)
        scans = full_scans(monkeypatch)
        out = await journal.erase_threads(ERASED)
        assert scans == []  # the older blocks were read, not the whole log
        # each: 5 messages; events: created before the upgrade, configured and created after
        assert (out.messages, out.sequence) == (2 * 5, 2 * 8)
        check_erased(before, await log_of(journal))
    finally:
        await journal.close()


async def test_a_message_stored_without_its_seq_makes_the_erasure_read_the_log(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fill(journal, REFS, rounds=2, word="kumquat")
    key = keys.message_key(ERASED[0], 1)
    raw = orjson.loads(await journal._wdb.get(key))  # an early release's record: no seq
    del raw["seq"]
    wb = WriteBatch()
    wb.put(key, orjson.dumps(raw))
    await journal._make_durable(wb)
    before = await log_of(journal)
    scans = full_scans(monkeypatch)
    out = await journal.erase_threads(ERASED)
    assert scans == [keys.SEQUENCE]
    assert out.sequence == 2 * 3
    check_erased(before, await log_of(journal))


async def test_a_run_cut_after_the_blocks_is_finished_by_the_next(journal: Journal) -> None:
    """The blocks are rewritten (durably) before the keys that locate them are deleted; a
    run that stops in between leaves the keys, and the next run finishes."""
    await fill(journal, REFS, rounds=4, word="kumquat")
    before = await log_of(journal)
    calls = 0

    def cut_after_blocks(
        durable: Callable[[WriteBatch], Awaitable[None]],
    ) -> Callable[[WriteBatch], Awaitable[None]]:
        async def call(wb: WriteBatch) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:  # the first batch of deletes
                raise OSError("process killed")
            await durable(wb)

        return call

    with pytest.raises(OSError, match="killed"):
        await erase.erase_threads(
            journal._db,
            ERASED,
            cut_after_blocks(journal._make_durable),
            events_indexed_from=journal._events_indexed_from,
            last_seq=journal._seq,
        )
    check_erased(before, await log_of(journal))  # the blocks were done
    assert len(await journal.last(ERASED[0], 10)) == 4  # the keys were not
    out = await journal.erase_threads(ERASED)
    assert (out.messages, out.sequence) == (8, 0)
    for ref in ERASED:
        assert await journal.last(ref, 10) == []
    check_erased(before, await log_of(journal))
