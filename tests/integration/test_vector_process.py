"""The transcript vector index in a child process (``memstream up``'s default): the same
answers as in this process, and what a dead child, a closed index and a vanished parent do.

Real qdrant-edge shards in real child processes; vectors are random (the answers compared
are the two indexes' own, on the same points)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from memstream.errors import RetryableInfraError
from memstream.projections.messages.vector_index import TUNING, DenseQuery, VectorIndex, VectorRow
from memstream.projections.messages.vector_process import VectorIndexProcess


def rows(n: int, seed: int = 7, agents: int = 2, threads: int = 10) -> list[VectorRow]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, 32)).astype(np.float32)
    return [
        VectorRow("acc", f"ag{i % agents}", f"t{i % threads}", i, vectors[i].tolist())
        for i in range(n)
    ]


def query(seed: int, **kw: object) -> DenseQuery:
    vector = np.random.default_rng(seed).standard_normal(32).astype(np.float32).tolist()
    return DenseQuery("acc", "ag0", vector, 10, **kw)  # type: ignore[arg-type]


async def wait_gone(index: VectorIndexProcess, timeout: float = 20.0) -> bool:
    """Whether the index's current child has exited (and been reaped) within ``timeout``."""
    proc = index._served._proc  # noqa: SLF001
    assert proc is not None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_the_child_answers_as_the_index_in_this_process(tmp_path: Path) -> None:
    """Writes, counts, nearest (with hidden threads, a thread scope, keys by id) and erasure
    give the same answers through the child as in process; nothing of a hidden thread or
    another agent comes back."""
    here, child = VectorIndex(tmp_path / "here"), VectorIndexProcess(tmp_path / "child")
    try:
        data = rows(400)
        for index in (here, child):
            await index.upsert(data)
        assert await child.count() == await here.count() == 400
        assert await child.count("acc", "ag0") == await here.count("acc", "ag0")
        for seed in range(5):
            for q in (
                query(seed),
                query(seed, hidden_threads=["t0", "t2"]),
                query(seed, thread_id="t4"),
                query(seed, keys=[("t0", 0), ("t2", 2), ("t1", 1)], hidden_threads=["t2"]),
            ):
                got = await child.nearest(q)
                assert got == await here.nearest(q)
                assert all(t not in q.hidden_threads for t, _ in got)
                assert all(o % 2 == 0 for _, o in got)  # ag0's points only
        await child.delete_threads([("acc", "ag0", "t0")])
        await here.delete_threads([("acc", "ag0", "t0")])
        assert await child.count() == await here.count() == 360  # t0: 40 points, all ag0's
        assert await child.nearest(query(1)) == await here.nearest(query(1))
        info = child.info()
        assert info is not None and info.points_count == 360
    finally:
        await here.close()
        await child.close()


async def test_a_killed_child_fails_its_calls_and_the_next_call_starts_another(
    tmp_path: Path,
) -> None:
    """SIGKILL while a write is in flight: the caller gets a retryable error, never a hang;
    the next call starts a new child on the same directory, which holds every write that
    was acknowledged, and the retried write lands once."""
    index = VectorIndexProcess(tmp_path / "v")
    try:
        await index.upsert(rows(200))
        pid = index.pid
        assert pid is not None
        big = rows(30_000, seed=3)
        big = [
            VectorRow(r.account_id, r.agent_id, r.thread_id, r.offset + 1000, r.vector) for r in big
        ]
        write = asyncio.ensure_future(index.upsert(big))
        await asyncio.sleep(0.2)
        assert not write.done(), "the write finished before the kill: make it bigger"
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RetryableInfraError, match="exited"):
            await asyncio.wait_for(write, 30)
        assert await wait_gone(index)
        assert await index.count() >= 200  # a new child, the acknowledged points there
        assert index.pid not in (None, pid)
        await index.upsert(big)  # the retry: idempotent by point id
        assert await index.count() == 200 + 30_000
    finally:
        await index.close()


async def test_close_stops_the_child_and_later_calls_are_refused(tmp_path: Path) -> None:
    index = VectorIndexProcess(tmp_path / "v")
    await index.upsert(rows(50))
    proc = index._served._proc  # noqa: SLF001
    assert proc is not None and index.pid is not None
    await index.close()
    assert proc.poll() is not None  # close waited for it
    assert index.pid is None and not index.ready
    with pytest.raises(RetryableInfraError, match="closed"):
        await index.count()
    await index.close()  # twice: nothing happens
    # the shard is closed cleanly: an index in this process opens it with every point
    again = VectorIndex(tmp_path / "v")
    try:
        assert await again.count() == 50
    finally:
        await again.close()


PARENT = """
import asyncio, sys
from pathlib import Path
from memstream.projections.messages.vector_index import VectorRow
from memstream.projections.messages.vector_process import VectorIndexProcess

async def main():
    index = VectorIndexProcess(Path(sys.argv[1]))
    await index.upsert([VectorRow("acc", "ag", "t", i, [float(i), 1.0, 0.5]) for i in range(50)])
    print(index.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited and not yet reaped by init, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


async def test_the_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """A ``memstream up`` killed by SIGKILL leaves no child holding the shard: the pipe's
    end closes with the parent, the child closes its shard and exits, and the next process
    opens the shard with every acknowledged point."""
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT, str(tmp_path / "v"), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        line = await asyncio.wait_for(parent.stdout.readline(), 60)
        child = int(line)
        assert running(child)
    finally:
        parent.kill()
        await parent.wait()
    end = time.monotonic() + 20
    while running(child) and time.monotonic() < end:
        await asyncio.sleep(0.05)
    assert not running(child)
    again = VectorIndex(tmp_path / "v")
    try:
        assert await again.count() == 50
    finally:
        await again.close()


async def test_the_child_builds_the_graphs_and_keeps_answering(tmp_path: Path) -> None:
    """A build from the child (its own builder process, as in process) switches the child's
    shard to the built one; the answers are the exact scan's before and after."""
    tuning = replace(TUNING, indexing_threshold_kb=1, full_scan_kb=1)
    index = VectorIndexProcess(tmp_path / "v", tuning)
    try:
        await index.upsert(rows(600))
        exact = await index.nearest(query(4, exact=True))
        assert await index.build(force=True)
        info = index.info()
        assert info is not None and info.indexed_vectors_count > 0
        assert await index.nearest(query(4, exact=True)) == exact
        walked = await index.nearest(query(4, exact=False))
        assert len(walked) == 10 and next(iter(walked)) == next(iter(exact))
    finally:
        await index.close()
