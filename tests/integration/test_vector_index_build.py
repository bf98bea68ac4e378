"""The vector index's HNSW graphs are built in a child process, beside the shard in use
(``VectorIndex.build``): searches and writes go on meanwhile, writes made during the build
(an erasure, new vectors) are in the built shard, a failed build leaves the shard in use as
it was, and a reopened index finds the built one. On real qdrant-edge shards."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstream.projections import edge_slot
from memstream.projections.edge_slot import CURRENT
from memstream.projections.messages.vector_index import (
    TUNING,
    DenseQuery,
    VectorIndex,
    VectorRow,
)

DIMS = 32
SMALL = replace(TUNING, indexing_threshold_kb=1, full_scan_kb=1, exact_scan_kb=0)
"""Graphs over a few hundred points, and every query walks them."""


def rows(thread_count: int, per_thread: int, seed: int, prefix: str = "t") -> list[VectorRow]:
    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((thread_count * per_thread, DIMS)).astype(np.float32)
    return [
        VectorRow("acc", "ag", f"{prefix}{t}", o, vecs[t * per_thread + o])
        for t in range(thread_count)
        for o in range(per_thread)
    ]


def query(vector: Any, **kw: Any) -> DenseQuery:
    return DenseQuery("acc", "ag", [float(x) for x in vector], 10, **kw)


async def test_a_build_switches_to_graphs_with_the_writes_made_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(edge_slot, "RETIRE_S", 0.05)
    index = VectorIndex(tmp_path / "ix", SMALL)
    index.build_after = 100
    first = rows(10, 40, seed=1)
    await index.upsert(first)
    assert (tmp_path / "ix" / CURRENT).read_text() == "g1"
    assert await index.build()  # 400 points in no graph, more than build_after
    info = index.info()
    assert info.indexed_vectors_count == 400
    assert (tmp_path / "ix" / CURRENT).read_text() == "g2"
    await asyncio.sleep(0.5)
    assert not (tmp_path / "ix" / "g1").exists()  # the old shard retired

    # a second build, with an erasure and new vectors written while the child runs
    later = rows(3, 50, seed=2, prefix="new")
    task = asyncio.create_task(index.build(force=True))
    while not index.slot.building:  # the copy is made: the child runs
        await asyncio.sleep(0.01)
    hits = await index.nearest(query(first[0].vector))  # searches go on meanwhile
    assert next(iter(hits)) == ("t0", 0)
    await index.delete_threads([("acc", "ag", "t0")])
    await index.upsert(later)
    assert await task
    assert (tmp_path / "ix" / CURRENT).read_text() == "g3"
    assert await index.count() == 400 - 40 + 150
    hits = await index.nearest(query(first[0].vector, exact=True))
    assert ("t0", 0) not in hits
    walk = await index.nearest(query(later[7].vector, exact=False))
    assert next(iter(walk)) == ("new0", 7)

    # reopened: the built shard, its graphs and every write
    await index.close()
    again = VectorIndex(tmp_path / "ix", SMALL)
    assert await again.count() == 510
    assert again.info().indexed_vectors_count > 0
    assert sorted(p.name for p in (tmp_path / "ix").iterdir() if p.is_dir()) == ["g3"]
    await again.close()


async def test_a_failed_build_leaves_the_shard_in_use_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = VectorIndex(tmp_path / "ix", SMALL)
    index.build_after = 10
    await index.upsert(rows(4, 25, seed=3))
    real = asyncio.create_subprocess_exec

    async def dies(*args: Any, **kw: Any) -> Any:
        return await real(args[0], "-c", "import sys; sys.exit(3)", **kw)

    # edge_slot calls it as asyncio.create_subprocess_exec: patch the asyncio module's
    monkeypatch.setattr(asyncio, "create_subprocess_exec", dies)
    with pytest.raises(RuntimeError, match="failed"):
        await index.build()
    assert (tmp_path / "ix" / CURRENT).read_text() == "g1"
    assert not (tmp_path / "ix" / "g2").exists()
    assert not index.slot.building  # writes are no longer kept aside
    await index.upsert(rows(1, 5, seed=4, prefix="after"))
    assert await index.count() == 105
    monkeypatch.setattr(asyncio, "create_subprocess_exec", real)
    assert await index.build()
    assert await index.count() == 105 and index.info().indexed_vectors_count == 105
    await index.close()


async def test_an_interrupted_build_s_folder_is_swept_at_open(tmp_path: Path) -> None:
    index = VectorIndex(tmp_path / "ix", SMALL)
    await index.upsert(rows(2, 10, seed=5))
    await index.close()
    (tmp_path / "ix" / "g2").mkdir()  # a build's copy that a crash left behind
    (tmp_path / "ix" / "g2" / "junk").write_text("x")
    again = VectorIndex(tmp_path / "ix", SMALL)
    assert await again.count() == 20
    assert not (tmp_path / "ix" / "g2").exists()
    await again.close()
