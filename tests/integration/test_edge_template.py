"""New qdrant-edge collections are copies of an empty one kept beside them (real qdrant-edge):
the same configuration and payload indexes as a created one, the same answers, and only a
template made with the same dimensions and tuning is used; a missing or half-written one is
made again."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import RecallScope
from memstream.projections.memory_index.port import IndexPoint, SparseVec
from memstream.projections.memory_index.tuning import TUNING
from memstream.schemas.records import JSONValue


def point(i: int, dims: int = 8) -> IndexPoint:
    dense = [0.0] * dims
    dense[i % dims] = 1.0
    payload: dict[str, JSONValue] = {
        "account_id": "a",
        "agent_id": "g",
        "visibility": "shared",
        "key": f"k{i}",
        "version": 1,
    }
    return IndexPoint(f"00000000-0000-0000-0000-{i:012d}", dense, SparseVec([i], [1.0]), payload, 1)


def templates(base: Path) -> list[Path]:
    return sorted(p for p in base.iterdir() if p.name.startswith(".template-"))


def _fields(params: object) -> tuple[tuple[str, str], ...]:
    names = [n for n in dir(params) if not n.startswith("_")]
    return tuple((n, repr(getattr(params, n))) for n in names if not callable(getattr(params, n)))


def described(edge: EdgeIndex, name: str) -> tuple[object, ...]:
    info = edge.info(name)
    schema = {k: (str(v.data_type), _fields(v.params)) for k, v in info.payload_schema.items()}
    return (info.points_count, sorted(schema.items()))


async def answers(edge: EdgeIndex, name: str) -> list[str]:
    hits = await edge.hybrid_query(
        name,
        point(3).dense,
        SparseVec([3], [1.0]),
        RecallScope("a", "g", None, 0.0),
        50,
        50,
    )
    assert hits  # the point that matches both sides at least
    # every point, in score order (ties in key order: their order is not the engine's rule)
    return [f"{k}:{s:.6f}" for s, k in sorted((-s, i.key) for i, s in hits)]


async def test_a_new_collection_is_a_copy_of_the_kept_empty_one(tmp_path: Path) -> None:
    edge = EdgeIndex(tmp_path)
    await edge.ensure_collection("mem-first", 8)  # created, then kept as the template
    (template,) = templates(tmp_path)
    await edge.ensure_collection("mem-second", 8)  # copied from it
    assert templates(tmp_path) == [template]
    assert described(edge, "mem-second") == described(edge, "mem-first")
    for name in ("mem-first", "mem-second"):
        await edge.upsert(name, [point(i) for i in range(20)])
    assert described(edge, "mem-second") == described(edge, "mem-first")
    assert await answers(edge, "mem-second") == await answers(edge, "mem-first")
    await edge.close()
    # reopened from disk, the copy is a collection like any other
    edge = EdgeIndex(tmp_path)
    assert await edge.count("mem-second") == 20
    assert await answers(edge, "mem-second") == await answers(edge, "mem-first")
    await edge.close()


async def test_only_a_template_of_the_same_dimensions_and_tuning_is_used(
    tmp_path: Path,
) -> None:
    edge = EdgeIndex(tmp_path)
    await edge.ensure_collection("mem-a", 8)
    await edge.ensure_collection("mem-b", 16)
    assert len(templates(tmp_path)) == 2
    await edge.upsert("mem-b", [point(i, 16) for i in range(4)])
    assert await edge.count("mem-b") == 4
    await edge.close()
    other = EdgeIndex(tmp_path, dataclasses.replace(TUNING, ef_construct=TUNING.ef_construct + 1))
    await other.ensure_collection("mem-c", 8)
    assert len(templates(tmp_path)) == 3
    await other.close()


async def test_a_half_written_template_is_not_used_and_is_made_again(tmp_path: Path) -> None:
    edge = EdgeIndex(tmp_path)
    await edge.ensure_collection("mem-a", 8)
    (template,) = templates(tmp_path)
    await edge.close()
    # a crash while keeping it: the folder there but not its shard, and a temporary copy
    for f in template.iterdir():
        shutil.rmtree(f)
    stale = tmp_path / f"{template.name}.tmp-1-1"
    (stale / "shard").mkdir(parents=True)
    edge = EdgeIndex(tmp_path)
    await edge.ensure_collection("mem-b", 8)  # created: nothing to copy
    await edge.upsert("mem-b", [point(i) for i in range(3)])
    assert await edge.count("mem-b") == 3
    await edge.close()
    assert not stale.exists()


async def test_a_template_the_engine_refuses_is_replaced_and_the_collection_created(
    tmp_path: Path,
) -> None:
    """A template whose copy does not load (damaged on disk) does not stop new collections:
    the collection is created as without one, and a good template is kept again."""
    edge = EdgeIndex(tmp_path)
    await edge.ensure_collection("mem-a", 8)
    (template,) = templates(tmp_path)
    await edge.close()
    (template / "shard" / "edge_config.json").write_text("{ not a configuration")
    edge = EdgeIndex(tmp_path)
    await edge.ensure_collection("mem-b", 8)
    await edge.upsert("mem-b", [point(i) for i in range(3)])
    assert await edge.count("mem-b") == 3
    assert described(edge, "mem-b")[1] == described(edge, "mem-a")[1]  # the same indexes
    await edge.close()
    assert templates(tmp_path) == [template]
    assert "not a configuration" not in (template / "shard" / "edge_config.json").read_text()
