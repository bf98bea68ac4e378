"""The memory index's HNSW builds run in a child process (``EdgeIndex.build``, through
``memstream.projections.edge_slot``), not in the serving process: qdrant-edge's
``optimize()`` holds the GIL for the whole build, so the in-process build froze the event
loop (0 ticks during it). Also: a collection folder of an earlier release (the shard
directly in it) is adopted with its points. Real qdrant-edge."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from memstream.projections.edge_slot import CURRENT
from memstream.projections.memory_index.edge import EdgeIndex, edge_config, field_indexes
from memstream.projections.memory_index.index import MemoryIndex
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.projections.memory_index.tuning import TUNING

SMALL = replace(TUNING, indexing_threshold_kb=1, full_scan_kb=1)
"""Graphs over a few thousand points."""


def points(n: int, dims: int = 64, seed: int = 0) -> list[IndexPoint]:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, dims)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return [
        IndexPoint(
            f"00000000-0000-0000-0000-{i:012d}",
            [float(x) for x in vecs[i]],
            SparseVec([i % 50], [1.0]),
            {"account_id": "a", "agent_id": f"g{i % 2}", "visibility": "shared", "version": 1},
            1,
        )
        for i in range(n)
    ]


async def test_maintain_builds_in_a_child_while_the_event_loop_runs(tmp_path: Path) -> None:
    edge = EdgeIndex(tmp_path, SMALL)
    await edge.upsert("mem-a", points(6000))
    index = MemoryIndex(edge, embedder=None, environment="t")  # type: ignore[arg-type]  # maintain embeds nothing
    index._written_since_optimize["mem-a"] = 6000  # noqa: SLF001 - as the writes counted it
    gaps: list[float] = []
    building = True

    async def ticker() -> None:
        last = time.perf_counter()
        while building:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    before = edge.info("mem-a").indexed_vectors_count
    tick = asyncio.create_task(ticker())
    started = time.perf_counter()
    assert await index.maintain(min_new_points=1) == ["mem-a"]
    took = time.perf_counter() - started
    building = False
    await tick
    info = edge.info("mem-a")
    # the graphs were built and switched in (the count covers the dense and BM25 vectors)
    assert info.indexed_vectors_count >= before + 6000
    assert (tmp_path / "mem-a" / CURRENT).read_text() == "g2"
    # the loop ran throughout the build (in process it ticked 0 times)
    assert len(gaps) >= 10 and max(gaps) < took / 2, (took, len(gaps), max(gaps, default=0))
    assert await edge.count("mem-a") == 6000
    await edge.close()


async def test_a_collection_of_an_earlier_release_is_adopted(tmp_path: Path) -> None:
    from qdrant_edge import EdgeShard, Point, SparseVector, UpdateOperation

    folder = tmp_path / "mem-old"
    folder.mkdir()
    shard = EdgeShard.create(str(folder), edge_config(64, TUNING))  # the shard directly there
    for op in field_indexes(TUNING):
        shard.update(op)
    p = points(3)
    shard.update(
        UpdateOperation.upsert_points(
            [
                Point(x.point_id, {"dense": x.dense, "bm25": SparseVector([1], [1.0])}, x.payload)
                for x in p
            ]
        )
    )
    shard.flush()
    shard.close()
    edge = EdgeIndex(tmp_path)
    assert await edge.count("mem-old") == 3
    assert (folder / CURRENT).read_text() == "g1" and (folder / "g1").is_dir()
    assert not (tmp_path / ".adopt-mem-old").exists()
    await edge.upsert("mem-old", points(5))
    assert await edge.count("mem-old") == 5
    await edge.close()
    again = EdgeIndex(tmp_path)
    assert await again.count("mem-old") == 5
    await again.close()


async def test_an_adoption_interrupted_by_a_crash_is_finished(tmp_path: Path) -> None:
    edge = EdgeIndex(tmp_path)
    await edge.upsert("mem-x", points(4))
    await edge.close()
    # as a crash would leave it: the old-layout shard parked, its folder not made yet
    (tmp_path / "mem-x" / "g1").rename(tmp_path / ".adopt-mem-x")
    for f in (tmp_path / "mem-x").iterdir():
        f.unlink()
    (tmp_path / "mem-x").rmdir()
    again = EdgeIndex(tmp_path)
    assert await again.count("mem-x") == 4
    await again.close()
