"""The memory index's qdrant-edge collections in this process against in a child process:
a recall query's latency, and how long it stops this process's event loop.

Run: ``python bench/index_process.py [--entries 20000] [--queries 200] [--rounds 2]``.

qdrant-edge holds the GIL for the whole of a query, so in process a query stops every
other task of the event loop for its length, although it runs on a worker thread. One
agent holds ``--entries`` random 384-d entries (an exact scan, as served up to 20,000),
written into an :class:`~memstream.projections.memory_index.edge.EdgeIndex` (in process,
"before") and an :class:`~memstream.projections.memory_index.edge_process.EdgeIndexProcess`
(a child, ``memstream up``'s default); then ``--queries`` hybrid queries on each, the two
alternating by round, while a task sleeps 1 ms at a time and records how late it wakes.
Prints per round and backend: query p50 / p99, the task's lateness p99 / max, the ms of
waits over 2 ms per query, and the child's figures over the in-process ones.
(The transcript's vector index: ``bench/search_dense_1m.py [--vector-process]``.)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from loop_lateness import loop_lateness

from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.edge_process import EdgeIndexProcess
from memstream.projections.memory_index.layout import RecallScope
from memstream.projections.memory_index.port import IndexBackend, IndexPoint, SparseVec

DIMS = 384
COLLECTION = "mem-bench"


def entries(n: int, rng: np.random.Generator) -> list[IndexPoint]:
    vecs = rng.standard_normal((n, DIMS)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return [
        IndexPoint(
            f"00000000-0000-0000-0000-{i:012d}",
            vecs[i].tolist(),
            SparseVec([i % 50, 50 + i % 7], [1.0, 0.5]),
            {"account_id": "a", "agent_id": "g", "visibility": "shared", "version": 1},
            1,
        )
        for i in range(n)
    ]


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def measure(backend: IndexBackend, queries: list[list[float]]) -> dict[str, float]:
    """Query latency and the event loop's lateness while the queries run one by one."""
    took = []
    scope = RecallScope("a", "g", None, time.time(), None)
    async with loop_lateness() as late:
        for q in queries:
            t = time.perf_counter()
            sparse = SparseVec([3, 51], [1.0, 1.0])
            await backend.hybrid_query(COLLECTION, q, sparse, scope, 5, 100)
            took.append((time.perf_counter() - t) * 1000)
    return {
        "p50": pct(took, 50),
        "p99": pct(took, 99),
        "late_p99": pct(late, 99),
        "late_max": max(late),
        "stalled": sum(x for x in late if x > 2) / len(queries),
    }


async def main(n: int, n_queries: int, rounds: int) -> None:
    rng = np.random.default_rng(5)
    points = entries(n, rng)
    qv = rng.standard_normal((n_queries, DIMS)).astype(np.float32)
    queries = (qv / np.linalg.norm(qv, axis=1, keepdims=True)).tolist()
    with tempfile.TemporaryDirectory(prefix="index-process-") as tmp:
        backends: dict[str, IndexBackend] = {
            "in process": EdgeIndex(Path(tmp) / "here"),
            "in a child": EdgeIndexProcess(Path(tmp) / "child"),
        }
        try:
            for backend in backends.values():
                await backend.ensure_collection(COLLECTION, DIMS)
                for i in range(0, n, 2_000):
                    await backend.upsert(COLLECTION, points[i : i + 2_000])
                await measure(backend, queries[:5])  # warm: the child started, pages read
            print(f"{n:,} entries in one agent, {n_queries} hybrid queries a round")
            for r in range(rounds):
                order = list(backends) if r % 2 == 0 else list(reversed(backends))
                got = {name: await measure(backends[name], queries) for name in order}
                for name in backends:
                    m = got[name]
                    print(
                        f"round {r + 1} {name:<10}: query p50 {m['p50']:.2f} / p99 "
                        f"{m['p99']:.2f} ms; loop late p99 {m['late_p99']:.2f} / max "
                        f"{m['late_max']:.1f} ms; {m['stalled']:.2f} ms of waits over 2 ms "
                        "a query"
                    )
                here, child = got["in process"], got["in a child"]
                print(
                    f"round {r + 1} child / in process: query p50 {child['p50'] / here['p50']:.2f}"
                    f"x, waits over 2 ms {child['stalled'] / max(here['stalled'], 1e-9):.2f}x"
                )
        finally:
            for backend in backends.values():
                await backend.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    asyncio.run(main(args.entries, args.queries, args.rounds))
