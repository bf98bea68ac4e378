"""An erasure's deleted points leave qdrant-edge's files (``ShardSlot.rewrite``).

A qdrant-edge delete only marks a point: its vector stays in the segment's vector storage
and the operation that wrote it in the WAL. These tests read the shard's raw files, as
someone holding a copy of the data folder would, for the bytes of an erased vector: there
after the delete, gone after the rewrite, while every live point, the payload indexes,
searches and the writes made during the rewrite are kept. On real qdrant-edge shards, the
rewrite in its real child process.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from memstream.projections import edge_slot
from memstream.projections.edge_slot import CURRENT
from memstream.projections.messages.vector_index import VectorIndex, point_id
from memstream.projections.messages.vector_process import VectorIndexProcess
from tests.fixtures.disk import files_holding
from tests.integration.test_vector_index_build import SMALL, query, rows


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "ix"


@pytest_asyncio.fixture
async def index(root: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[VectorIndex]:
    """A vector index whose replaced shards are deleted 0.05 s after a switch."""
    monkeypatch.setattr(edge_slot, "RETIRE_S", 0.05)
    index = VectorIndex(root, SMALL)
    yield index
    await index.close()


def stored_bytes(index: VectorIndex, thread: str, offset: int) -> bytes:
    """The first 8 dimensions of a point's vector as the shard stores them (float32, after
    its cosine normalisation): what a reader of the files would look for."""
    shard = index.slot.get()
    assert shard is not None
    (record,) = shard.retrieve([point_id("acc", "ag", thread, offset)], False, True)
    dense = record.vector["dense"] if isinstance(record.vector, dict) else None
    assert isinstance(dense, list)
    return struct.pack("<8f", *dense[:8])


async def rewriting(index: VectorIndex) -> asyncio.Task[bool]:
    """A rewrite, returned once its copy is made and its child runs."""
    task = asyncio.create_task(index.rewrite())
    while not index.slot.building:
        await asyncio.sleep(0.01)
    return task


async def gone(needle: bytes, root: Path) -> bool:
    """Whether no file under ``root`` holds ``needle``, polled up to 5 s (the replaced
    shard's folder is deleted ``RETIRE_S`` after the switch)."""
    for _ in range(100):
        if not files_holding(needle, root):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_rewrite_takes_erased_vectors_off_the_files_and_keeps_everything_else(
    index: VectorIndex, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = rows(10, 40, seed=1)
    await index.upsert(first)
    assert await index.build(force=True)  # graphs, as a serving index has them
    erased, kept = stored_bytes(index, "t0", 3), stored_bytes(index, "t1", 3)
    before = await index.nearest(query(first[45].vector, exact=True))

    assert await index.delete_threads([("acc", "ag", "t0"), ("acc", "ag", "nope")]) == 40
    assert files_holding(erased, root)  # a delete only marks: the bug this fixes
    generation = (root / CURRENT).read_text()
    assert await index.rewrite()
    assert (root / CURRENT).read_text() != generation
    assert await gone(erased, root)
    assert files_holding(kept, root)  # the live points are all there
    assert await index.count() == 360
    assert index.info().indexed_vectors_count == 360  # graphs built by the rewrite
    after = await index.nearest(query(first[45].vector, exact=True))
    survivors = [k for k in before if k[0] != "t0"]
    assert list(after)[: len(survivors)] == survivors  # the same neighbours, same order
    walk = await index.nearest(query(first[45].vector, exact=False))
    assert next(iter(walk)) == ("t1", 5)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        (root / CURRENT).read_text()
    ]  # no copy or old folder left

    # reopened: the rewritten shard
    await index.close()
    again = VectorIndex(root, SMALL)
    assert await again.count() == 360
    assert not files_holding(erased, root)
    await again.close()


async def test_writes_made_during_a_rewrite_are_in_the_rewritten_shard(
    index: VectorIndex, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = rows(6, 50, seed=2)
    await index.upsert(first)
    await index.delete_threads([("acc", "ag", "t0")])
    task = await rewriting(index)  # the copy is made: the child runs
    later = rows(2, 30, seed=3, prefix="new")
    await index.upsert(later)
    erased_meanwhile = stored_bytes(index, "t1", 0)
    assert await index.delete_threads([("acc", "ag", "t1")]) == 50
    hits = await index.nearest(query(first[120].vector, exact=True))  # searches go on
    assert next(iter(hits)) == ("t2", 20)
    assert await task
    assert await index.count() == 300 - 100 + 60
    hits = await index.nearest(query(later[31].vector, exact=True))
    assert next(iter(hits)) == ("new1", 1)
    assert ("t1", 0) not in await index.nearest(query(first[50].vector, exact=True))
    # deleted after the copy was made: in the new shard's WAL, until the next rewrite
    assert await index.rewrite()
    assert await gone(erased_meanwhile, root)


async def test_rewrites_asked_together_share_the_work(index: VectorIndex, root: Path) -> None:
    await index.upsert(rows(4, 50, seed=4))
    needles = []
    for t in range(3):
        needles.append(stored_bytes(index, f"t{t}", 1))
    await index.delete_threads([("acc", "ag", "t0")])
    first = await rewriting(index)
    # two erasures finish their deletes while the first rewrite runs
    await index.delete_threads([("acc", "ag", "t1")])
    await index.delete_threads([("acc", "ag", "t2")])
    results = await asyncio.gather(first, index.rewrite(), index.rewrite())
    assert list(results) == [True, True, True]
    assert index.slot._rewrites.started == 2  # the last two shared one rewrite
    for needle in needles:
        assert await gone(needle, root)
    assert await index.count() == 50
    # a build asked while a rewrite runs is skipped, as a build beside a build is
    task = await rewriting(index)
    assert not await index.build(force=True)
    assert await task


async def test_a_failed_rewrite_covers_none_of_the_calls_waiting_for_it(
    index: VectorIndex, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls made while a rewrite runs share the next one; if that one fails, the call that
    ran it fails and the others run one of their own (their deletes are still on disk)."""
    await index.upsert(rows(3, 20, seed=8))
    needle = stored_bytes(index, "t0", 2)
    real = asyncio.create_subprocess_exec
    calls = 0

    async def second_dies(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            return await real(args[0], "-c", "import sys; sys.exit(3)", **kw)
        return await real(*args, **kw)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", second_dies)
    first = await rewriting(index)  # copied before the delete below
    await index.delete_threads([("acc", "ag", "t0")])
    b = asyncio.create_task(index.rewrite())
    c = asyncio.create_task(index.rewrite())
    done = await asyncio.gather(first, b, c, return_exceptions=True)
    assert done[0] is True
    assert isinstance(done[1], RuntimeError)  # the second rewrite, run for b and c, failed
    assert done[2] is True and calls == 3  # so c ran its own
    assert await gone(needle, root)


async def test_a_failed_rewrite_leaves_the_shard_in_use_as_it_was(
    index: VectorIndex, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await index.upsert(rows(4, 25, seed=5))
    await index.delete_threads([("acc", "ag", "t0")])
    real = asyncio.create_subprocess_exec

    async def dies(*args: Any, **kw: Any) -> Any:
        return await real(args[0], "-c", "import sys; sys.exit(3)", **kw)

    # edge_slot calls it as asyncio.create_subprocess_exec: patch the asyncio module's
    monkeypatch.setattr(asyncio, "create_subprocess_exec", dies)
    with pytest.raises(RuntimeError, match="rewrite of .* failed"):
        await index.rewrite()
    assert (root / CURRENT).read_text() == "g1"
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["g1"]  # no copy left
    assert not index.slot.building
    await index.upsert(rows(1, 5, seed=6, prefix="after"))
    assert await index.count() == 80
    monkeypatch.setattr(asyncio, "create_subprocess_exec", real)
    assert await index.rewrite()
    assert await index.count() == 80


async def test_the_served_index_rewrites_in_its_child(root: Path) -> None:
    """``memstream up`` keeps the shard in a child process: the call crosses the pipe."""
    served = VectorIndexProcess(root, SMALL)
    try:
        await served.upsert(rows(3, 20, seed=7))
        assert await served.delete_threads([("acc", "ag", "t2")]) == 20
        assert await served.rewrite()
        assert await served.count() == 40
        assert (root / CURRENT).read_text() == "g2"
    finally:
        await served.close()


async def test_a_rewrite_cut_by_a_crash_leaves_folders_swept_at_the_next_open(
    index: VectorIndex, root: Path
) -> None:
    """A process killed mid-rewrite leaves its copy (``g2.src``) and the child's half-written
    shard (``g2``): the next open serves ``g1`` and deletes both (the erasure, still
    running, is resumed and rewrites again)."""
    await index.upsert(rows(2, 10, seed=9))
    await index.close()
    for left in ("g2", "g2.src"):
        (root / left / "segments").mkdir(parents=True)
        (root / left / "segments" / "junk").write_bytes(b"erased bytes")
    again = VectorIndex(root, SMALL)
    assert await again.count() == 20
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["g1"]
    assert await again.rewrite()
    assert await again.count() == 20
    await again.close()
