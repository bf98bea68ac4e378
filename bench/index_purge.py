"""What taking erased text off the lexical index's disk costs (``LexicalIndex.purge``).

Run: ``python bench/index_purge.py [--messages 200000] [--threads 2000]``.

A Tantivy delete only marks a document; its text stays in its segment's files until a merge
rewrites the segment. An erasure therefore purges: every live document is rewritten from
its stored fields, in steps, so each older segment ends wholly deleted and is dropped. This
bench builds an index of ``--messages`` messages over ``--threads`` threads of one agent
(live-sized batches, so segments are as the projector leaves them, merged by Tantivy's own
policy), plants a unique word in one thread, then in one process:

1. erases that thread (``delete_threads``) and counts the index's files that still hold
   the word (the finding: after the delete, still on disk);
2. purges, timed, with the projector's writes going on beside it (batches of 50 new
   messages every 20 ms, ``upsert`` each, as a live projector at 2,500 messages/s), and
   prints the upserts' latency before and during the purge (what the purge holds up) and
   the files holding the word after (``--step``: documents a purge step rewrites);
3. the raw engine's rate for the same rewrite: the same number of documents, already as
   JSON, added to a fresh Tantivy index with one writer thread and committed once (the
   purge / raw ratio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import tantivy

from memstream.projections.messages import lexical_index
from memstream.projections.messages.lexical_index import (
    IndexRow,
    LexicalIndex,
    _schema,
    close_indexes,
    open_index,
)

WORDS = [f"w{i}" for i in range(3_000)] + ["walrus", "otter", "narwhal", "meeting", "coffee"]
LIVE_BATCH = 50
LIVE_EVERY_S = 0.02


def message(rng: random.Random, thread: int, offset: int, text: str | None = None) -> IndexRow:
    body = text or " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 30)))
    return IndexRow("acc", "ag", f"t{thread}", offset, 1_700_000_000_000 + offset, body)


def files_holding(root: Path, needle: bytes) -> int:
    return sum(1 for f in root.rglob("*") if f.is_file() and needle in f.read_bytes())


def ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    q = statistics.quantiles(xs, n=100) if len(xs) > 1 else [xs[0]] * 99
    return f"p50 {q[49] * 1e3:.1f} / p99 {q[98] * 1e3:.1f} / max {max(xs) * 1e3:.1f} ms"


async def live_writes(index: LexicalIndex, stop: asyncio.Event, start: int) -> list[float]:
    """Batches of new messages every :data:`LIVE_EVERY_S`, each ``upsert`` timed."""
    rng = random.Random(start)
    took: list[float] = []
    offset = start
    while not stop.is_set():
        rows = [message(rng, 10_000_000 + offset % 97, offset + i) for i in range(LIVE_BATCH)]
        offset += LIVE_BATCH
        t = time.perf_counter()
        await index.upsert(rows)
        took.append(time.perf_counter() - t)
        await asyncio.sleep(LIVE_EVERY_S)
    return took


def raw_rewrite(n: int, root: Path) -> float:
    """Seconds to add ``n`` ready JSON documents to a fresh index and commit (one writer
    thread, as a purge's steps)."""
    rng = random.Random(5)
    docs = [
        json.dumps(
            {
                "key": f"acc/ag/t{i % 97}/{i}",
                "thread_key": f"acc/ag/t{i % 97}",
                "account_id": "acc",
                "agent_id": "ag",
                "thread_id": f"t{i % 97}",
                "readers": ["p"],
                "offset": i,
                "created_ms": i,
                "body": " ".join(rng.choice(WORDS) for _ in range(18)),
                "record": "",
            }
        )
        for i in range(n)
    ]
    root.mkdir(parents=True)
    index = tantivy.Index(
        _schema(), path=str(root), sort_by_field="created_ms", sort_order=tantivy.Order.Desc
    )
    index.register_tokenizer(  # as LexicalIndex does
        "terms", tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(r"[^ ]+")).build()
    )
    w = index.writer(heap_size=64_000_000, num_threads=1)
    t = time.perf_counter()
    for d in docs:
        w.add_json(d)
    w.commit()
    w.wait_merging_threads()
    return time.perf_counter() - t


async def main(n: int, threads: int, step: int) -> None:
    lexical_index.PURGE_STEP = step  # type: ignore[misc]  # read at each purge
    rng = random.Random(7)
    canary = "zqcanary" + "".join(rng.choice("abcdefghij") for _ in range(8))
    with tempfile.TemporaryDirectory(prefix="purge-") as tmp:
        root = Path(tmp) / "ix"
        index = open_index(root / "db")
        index._clear_filling()  # an empty database's index: nothing to fill
        t0 = time.perf_counter()
        batch: list[IndexRow] = []
        for i in range(n):
            thread = i % threads
            text = f"my secret {canary} code" if i == n // 2 else None
            batch.append(message(rng, thread, i, text))
            if len(batch) == 500:
                await index.upsert(batch)
                batch = []
        if batch:
            await index.upsert(batch)
        print(
            f"index: {await index.count():,} messages over {threads:,} threads in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        gone = f"acc/ag/t{(n // 2) % threads}"
        t = time.perf_counter()
        deleted = await index.delete_threads([gone])
        print(
            f"delete the thread: {deleted} documents in {(time.perf_counter() - t) * 1e3:.1f} ms;"
            f" files still holding the erased word: {files_holding(index.path, canary.encode())}"
        )

        stop = asyncio.Event()
        idle = asyncio.ensure_future(live_writes(index, stop, 50_000_000))
        await asyncio.sleep(3)
        stop.set()
        before = await idle
        stop = asyncio.Event()
        during = asyncio.ensure_future(live_writes(index, stop, 60_000_000))
        t = time.perf_counter()
        rewritten = await index.purge()
        took = time.perf_counter() - t
        stop.set()
        beside = await during
        print(
            f"purge: {rewritten:,} documents rewritten in {took:.2f} s "
            f"({rewritten / took:,.0f} documents/s); files holding the erased word: "
            f"{files_holding(index.path, canary.encode())}"
        )
        print(f"projector upserts ({LIVE_BATCH} messages each), before: {ms(before)}")
        print(f"projector upserts during the purge ({len(beside)} batches): {ms(beside)}")
        await close_indexes(root)
        raw = raw_rewrite(rewritten, Path(tmp) / "raw")
        print(
            f"raw Tantivy: {rewritten:,} ready documents added and committed in {raw:.2f} s "
            f"({rewritten / raw:,.0f}/s): purge / raw = {took / raw:.2f}x the time"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--threads", type=int, default=2_000)
    ap.add_argument("--step", type=int, default=lexical_index.PURGE_STEP)
    a = ap.parse_args()
    print(f"purge step: {a.step:,} documents")
    asyncio.run(main(a.messages, a.threads, a.step))
