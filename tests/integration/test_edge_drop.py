"""Dropping a qdrant-edge collection: gone at once, files deleted in the background, and
what a crash left half-deleted is cleaned up by the next ``EdgeIndex`` (real qdrant-edge)."""

from __future__ import annotations

from pathlib import Path

from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.schemas.records import JSONValue


def point(i: int) -> IndexPoint:
    dense = [0.0] * 8
    dense[i % 8] = 1.0
    payload: dict[str, JSONValue] = {"account_id": "a", "agent_id": "g", "version": 1}
    return IndexPoint(f"00000000-0000-0000-0000-{i:012d}", dense, SparseVec([i], [1.0]), payload, 1)


async def test_a_dropped_collection_is_gone_at_once_and_its_files_are_deleted(
    tmp_path: Path,
) -> None:
    edge = EdgeIndex(tmp_path)
    await edge.upsert("mem-x", [point(i) for i in range(5)])
    assert await edge.count("mem-x") == 5
    await edge.drop_collection("mem-x")
    assert not (tmp_path / "mem-x").exists()
    assert await edge.count("mem-x") == 0
    # the same name is a fresh, empty collection
    await edge.upsert("mem-x", [point(7)])
    assert await edge.count("mem-x") == 1
    await edge.close()  # waits for the background deletion
    kept = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".template-"))
    assert kept == ["mem-x"]


async def test_leftovers_of_an_interrupted_drop_are_deleted_on_open(tmp_path: Path) -> None:
    left = tmp_path / ".dropped-0123"
    (left / "segments").mkdir(parents=True)
    (left / "segments" / "page_0.dat").write_bytes(b"x" * 1024)
    (tmp_path / "mem-kept").mkdir()
    (tmp_path / "mem-kept" / "file").write_bytes(b"y")
    edge = EdgeIndex(tmp_path)
    await edge.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem-kept"]
