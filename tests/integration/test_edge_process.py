"""The memory index's qdrant-edge collections in a child process (``memstream up``'s
default; the answers themselves are checked on every adapter by test_memory_index.py):
graph builds from the child, and what a killed child does. Real qdrant-edge, real children."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from memstream.errors import RetryableInfraError
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.edge_process import EdgeIndexProcess
from memstream.projections.memory_index.index import MemoryIndex
from tests.integration.test_edge_build import SMALL, points


async def test_maintain_builds_the_graph_in_the_child(tmp_path: Path) -> None:
    edge = EdgeIndexProcess(tmp_path, SMALL)
    try:
        await edge.upsert("mem-a", points(3000))
        index = MemoryIndex(edge, embedder=None, environment="t")  # type: ignore[arg-type]  # maintain embeds nothing
        index._written_since_optimize["mem-a"] = 3000  # noqa: SLF001 - as the writes counted it
        before = edge.info("mem-a")
        assert before is not None and before.points_count == 3000
        assert await index.maintain(min_new_points=1) == ["mem-a"]
        after = edge.info("mem-a")
        assert after is not None and after.indexed_vectors_count > before.indexed_vectors_count
        assert await edge.count("mem-a") == 3000
        assert edge.info("mem-nothing") is None
    finally:
        await edge.close()


async def test_a_killed_child_fails_its_calls_and_the_next_starts_another(
    tmp_path: Path,
) -> None:
    edge = EdgeIndexProcess(tmp_path)
    try:
        await edge.upsert("mem-a", points(100))
        pid = edge.pid
        assert pid is not None
        write = asyncio.ensure_future(edge.upsert("mem-a", points(40_000, seed=1)))
        await asyncio.sleep(0.2)
        assert not write.done(), "the write finished before the kill: make it bigger"
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RetryableInfraError, match="exited"):
            await asyncio.wait_for(write, 30)
        assert await edge.count("mem-a") >= 100  # a new child: what was acknowledged is there
        assert edge.pid not in (None, pid)
    finally:
        await edge.close()
    # closed cleanly: the directory opens in this process with its points
    here = EdgeIndex(tmp_path)
    try:
        assert await here.count("mem-a") >= 100
    finally:
        await here.close()
