"""What taking erased vectors off a qdrant-edge shard's files costs (``ShardSlot.rewrite``).

Run: ``python bench/edge_rewrite.py [--points 100000] [--dims 384] [--threads 1000]
[--memory]``.

A qdrant-edge delete only marks a point: its vector stays in the segment's storage and the
WAL keeps the operation that wrote it. An erasure therefore rewrites the shard: a child
process writes a fresh shard from the live points of a copy and builds its graphs, and the
serving process switches to it (writes made meanwhile applied). This bench fills a
transcript vector index (``VectorIndex``: ``--points`` vectors over ``--threads`` threads
of one agent, graphs built), or with ``--memory`` an account's memory collection
(``EdgeIndex``: dense and BM25 sides, payload indexes, per-agent graphs), erases one thread
or one user's entries, and in one process measures:

1. **the finding**: the files that still hold the erased vector's bytes after the delete;
2. **the rewrite**, timed, with a ticker on the event loop (how late a 1 ms sleep wakes:
   what the rewrite stops the serving loop for; the child holds its own GIL) and the files
   holding the vector after;
3. **the graph build** the index already runs (``build``: the same copy, ``optimize()`` of
   the copy in a child): the same machinery without the rewrite's fresh shard;
4. **the raw engine**: a fresh shard in this process, the same live points upserted with
   their vectors already in hand (1,000 a call), graphs built, flushed (rewrite / raw);
5. **the copy** every build and rewrite makes of the shard: ``infra/sparse_copy`` against
   ``shutil.copytree`` (time, and bytes the copy allocates on the disk).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from qdrant_edge import EdgeShard, Point, UpdateOperation

sys.path.insert(0, str(Path(__file__).parent))
from loop_lateness import loop_lateness  # noqa: E402

from memstream.infra.sparse_copy import copy_tree  # noqa: E402
from memstream.projections import edge_slot  # noqa: E402
from memstream.projections.edge_slot import CURRENT, ShardSlot  # noqa: E402
from memstream.projections.memory_index.edge import EdgeIndex  # noqa: E402
from memstream.projections.memory_index.layout import PointIdentity  # noqa: E402
from memstream.projections.memory_index.layout import point_id as layout_point_id  # noqa: E402
from memstream.projections.memory_index.port import IndexPoint, SparseVec  # noqa: E402
from memstream.projections.messages.vector_index import (  # noqa: E402
    TUNING,
    VectorIndex,
    VectorRow,
    point_id,
)
from memstream.schemas.records import JSONObject  # noqa: E402


def holding(needle: bytes, root: Path) -> int:
    return sum(1 for f in root.rglob("*") if f.is_file() and needle in f.read_bytes())


def allocated(root: Path) -> int:
    return sum(f.stat().st_blocks * 512 for f in root.rglob("*") if f.is_file())


def late_summary(late: list[float]) -> str:
    if not late:
        return "no ticks"
    q = statistics.quantiles(late, n=100) if len(late) > 1 else late * 99
    return f"ticks {len(late)}, late p50 {q[49]:.2f} ms, p99 {q[98]:.2f} ms, max {max(late):.1f} ms"


@dataclass
class Target:
    """The shard under test, behind the index that serves it."""

    root: Path
    slot: ShardSlot
    needle: bytes  # the first 8 dimensions of the vector the erasure deletes, as stored
    erase: Callable[[], Awaitable[int]]
    rewrite: Callable[[], Awaitable[bool]]
    build: Callable[[], Awaitable[bool]]
    count: Callable[[], Awaitable[int]]
    close: Callable[[], Awaitable[None]]


def stored(slot: ShardSlot, pid: str) -> bytes:
    shard = slot.get()
    assert shard is not None
    (rec,) = shard.retrieve([pid], False, True)
    dense = rec.vector["dense"] if isinstance(rec.vector, dict) else None
    assert isinstance(dense, list)
    return struct.pack("<8f", *dense[:8])


async def transcript(args: argparse.Namespace, work: Path) -> Target:
    """A transcript vector index: ``--points`` vectors over ``--threads`` threads of one
    agent; the erasure deletes thread ``t0``."""
    tuning = replace(TUNING, indexing_threshold_kb=args.threshold_kb)
    rng = np.random.default_rng(1)
    per = args.points // args.threads
    index = VectorIndex(work / "ix", tuning)
    for th in range(args.threads):
        vecs = rng.standard_normal((per, args.dims)).astype(np.float32)
        await index.upsert([VectorRow("acc", "ag", f"t{th}", o, vecs[o]) for o in range(per)])
    await index.maintain(force=True)  # graphs, in this process (setup, not measured)
    return Target(
        index.path,
        index.slot,
        stored(index.slot, point_id("acc", "ag", "t0", 0)),
        lambda: index.delete_threads([("acc", "ag", "t0")]),
        index.rewrite,
        lambda: index.build(force=True),
        index.count,
        index.close,
    )


async def memory(args: argparse.Namespace, work: Path) -> Target:
    """An account's memory collection (``EdgeIndex``: dense and BM25 sides, payload
    indexes, per-agent graphs): ``--points`` entries of 5 agents and 100 users; the erasure
    deletes user ``u0``'s entries."""
    rng = np.random.default_rng(1)
    index = EdgeIndex(work / "mem")
    name = "mem-bench"
    owners: dict[str, list[tuple[str, int]]] = {}
    for start in range(0, args.points, 1000):
        vecs = rng.standard_normal((min(1000, args.points - start), args.dims))
        batch = []
        for j, v in enumerate(vecs):
            i = start + j
            ident = PointIdentity("acc", f"ag{i % 5}", f"u{i % 100}", f"k{i}")
            pid = layout_point_id(ident)
            terms = sorted({int(x) for x in rng.integers(1, 2**31, 8)})
            payload: JSONObject = {
                "account_id": "acc",
                "agent_id": ident.agent_id,
                "owner": ident.owner,
                "key": ident.key,
                "visibility": "private",
                "category": "user_profile",
                "importance": 0.5,
                "version": 1,
            }
            batch.append(
                IndexPoint(pid, v.tolist(), SparseVec(terms, [1.0] * len(terms)), payload, 1)
            )
            owners.setdefault(ident.owner, []).append((pid, 1))
        await index.upsert(name, batch)
    index.optimize(name)  # graphs, in this process (setup, not measured)
    slot = index._slots[name]

    async def erase() -> int:
        await index.delete(name, owners["u0"])
        return len(owners["u0"])

    return Target(
        work / "mem" / name,
        slot,
        stored(slot, owners["u0"][0][0]),
        erase,
        lambda: index.rewrite(name),
        lambda: index.build(name),
        lambda: index.count(name),
        index.close,
    )


async def timed(switch: Callable[[], Awaitable[bool]]) -> tuple[float, str]:
    """(seconds, the event loop's lateness meanwhile) of a rewrite or build that switches,
    returned once the replaced folder is gone."""
    async with loop_lateness() as late:
        t = time.perf_counter()
        assert await switch()
        took = time.perf_counter() - t
    await asyncio.sleep(edge_slot.RETIRE_S + 0.5)
    return took, late_summary(late)


async def main(args: argparse.Namespace) -> None:
    edge_slot.RETIRE_S = 0.5  # type: ignore[misc]  # 30 s when serving
    work = Path(tempfile.mkdtemp(prefix="edge-rewrite-", dir=args.dir))
    t = time.perf_counter()
    target = await (memory if args.memory else transcript)(args, work)
    root, needle = target.root, target.needle
    what = (
        "memory entries (5 agents, 100 users)"
        if args.memory
        else (f"transcript vectors over {args.threads:,} threads")
    )
    print(
        f"{args.points:,} {what}, {args.dims} dims: filled and graphs built in "
        f"{time.perf_counter() - t:.1f} s; shard on disk {allocated(root) / 1e6:.0f} MB"
    )

    # 1. the finding
    deleted = await target.erase()
    print(
        f"erased {deleted} points: files holding one's vector after the delete: "
        f"{holding(needle, root)}"
    )

    # 2. the rewrite
    rewrite_s, late = await timed(target.rewrite)
    live = await target.count()
    print(
        f"rewrite: {rewrite_s:.2f} s for {live:,} live points ({live / rewrite_s:,.0f}/s); "
        f"files holding the vector after: {holding(needle, root)}; "
        f"event loop meanwhile: {late}"
    )

    # 3. the graph build the index already runs, for comparison
    build_s, late = await timed(target.build)
    print(
        f"graph build (copy + optimize in a child): {build_s:.2f} s; event loop meanwhile: {late}"
    )

    # 5. the copy (before the raw run frees the page cache of nothing in particular)
    generation = root / (root / CURRENT).read_text()
    t = time.perf_counter()
    copy_tree(generation, work / "sparse")
    sparse_s = time.perf_counter() - t
    t = time.perf_counter()
    shutil.copytree(generation, work / "plain")
    plain_s = time.perf_counter() - t
    print(
        f"copy of the shard: sparse-aware {sparse_s:.2f} s, {allocated(work / 'sparse') / 1e6:.0f} MB "
        f"on disk; shutil.copytree {plain_s:.2f} s, {allocated(work / 'plain') / 1e6:.0f} MB "
        f"(source {allocated(generation) / 1e6:.0f} MB)"
    )
    shutil.rmtree(work / "sparse")
    shutil.rmtree(work / "plain")

    # 4. the raw engine: the live points, vectors in hand, into a fresh shard
    points: list[Point] = []
    offset = None
    from qdrant_edge import ScrollRequest

    while True:
        recs, offset = shard_of(target.slot).scroll(
            ScrollRequest(limit=1000, offset=offset, with_payload=True, with_vector=True)
        )
        points.extend(Point(r.id, r.vector or {}, r.payload) for r in recs)
        if offset is None:
            break
    config = (generation / edge_slot.CONFIG_FILE).read_text()
    raw_dir = work / "raw"
    raw_dir.mkdir()
    (raw_dir / edge_slot.CONFIG_FILE).write_text(config)
    schema = shard_of(target.slot).info().payload_schema
    await target.close()
    t = time.perf_counter()
    raw = EdgeShard.load(str(raw_dir))
    for name, info in schema.items():
        raw.update(UpdateOperation.create_field_index(name, info.params or info.data_type))
    for i in range(0, len(points), 1000):
        raw.update(UpdateOperation.upsert_points(points[i : i + 1000]))
    raw.optimize()
    raw.flush()
    raw_s = time.perf_counter() - t
    raw.close()
    print(f"raw engine (fresh shard in this process, points in hand, graphs, flush): {raw_s:.2f} s")
    print(
        f"rewrite / raw = {rewrite_s / raw_s:.2f}x the time; rewrite / graph build = "
        f"{rewrite_s / build_s:.2f}x"
    )
    shutil.rmtree(work, ignore_errors=True)


def shard_of(slot: ShardSlot) -> EdgeShard:
    shard = slot.get()
    assert shard is not None
    return shard


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--dims", type=int, default=384)
    ap.add_argument("--threads", type=int, default=1_000)
    ap.add_argument("--threshold-kb", type=int, default=TUNING.indexing_threshold_kb or 10_000)
    ap.add_argument("--memory", action="store_true", help="a memory collection instead")
    ap.add_argument("--dir", default=None, help="where the shards go (default: the temp dir)")
    asyncio.run(main(ap.parse_args()))
