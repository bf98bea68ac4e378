"""Transcript search's BM25 side: the lexical index (Tantivy beside chdb) against the
posting lists in ClickHouse and against raw Tantivy, on the same 1M messages (issue 10).

Run: ``python bench/lexical_engines.py --data-dir DIR [--queries 200] [--index-dir DIR2]``
after ``python bench/transcript_search.py --messages 1000000 --threads 10000
--skip-projector --data-dir DIR`` has built the 1M corpus there (this bench reads it, it
does not generate one).

1. **Fill.** ``MessageStore(..., index_root=...).ensure_schema()`` fills the index from the
   stored messages (their ``terms`` as ClickHouse computed them), as a start after an
   upgrade does; reused when ``--index-dir`` already holds it. Prints the rate and the size
   next to the posting lists'.
2. **Queries.** The shapes and the caller mix of ``bench/transcript_search.py`` (all
   threads; a third of the callers own private threads), each answered by three paths,
   interleaved, order rotating:

   - ``postings``: ``MessageStore.lexical_search`` without an index (before);
   - ``index``: the same with the index (after: Tantivy's candidates re-scored with the
     project's statistics, the proximity rerank, the hits' text);
   - ``raw``: raw Tantivy on the same index: the OR of the terms with the same filters,
     its best 100 by its own BM25 with their stored fields, nothing else (the engine's
     ceiling).

   Prints p50 / p99 per shape and path, the ratios, and how often ``index`` gave the same
   ten hits as ``postings`` and the same relevance at every rank (ties can put other
   messages of exactly the same score in the ten: the bench's messages have one length).
3. **Writes.** What the index adds to a projector batch: ``LexicalIndex.upsert`` (analysis,
   delete by key then add, commit, reload) of batches of 50 and 5,000 new messages of
   another agent, against the ClickHouse insert of the same batch (with its views) in the
   same run; then the last batch redelivered (one copy left).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import transcript_search as ts  # noqa: E402  (the corpus' vocabulary and query shapes)

from memstream.projections.messages import ChdbEngine, MessageStore  # noqa: E402
from memstream.projections.messages.lexical_index import IndexRow, LexicalIndex  # noqa: E402
from memstream.projections.messages.rows import MessageRow, messages_table  # noqa: E402
from memstream.projections.messages.sql import RERANK_WINDOW, SearchSpec, query_words  # noqa: E402

DB = "bench_search"


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def raw_search(index: LexicalIndex, spec: SearchSpec, hidden: list[str]) -> int:
    """Raw Tantivy: the OR of the terms, the same filters, its best 100 with their stored
    fields (blocking)."""
    import tantivy

    q, occur, schema = tantivy.Query, tantivy.Occur, index._schema  # noqa: SLF001
    searcher = index._index.searcher()  # noqa: SLF001
    clauses = [
        (
            occur.Must,
            q.boolean_query([(occur.Should, q.term_query(schema, "body", w)) for w in spec.words]),
        ),
        (occur.Must, q.const_score_query(q.term_query(schema, "account_id", spec.account_id), 0.0)),
        (occur.Must, q.const_score_query(q.term_query(schema, "agent_id", spec.agent_id), 0.0)),
    ]
    if hidden:
        clauses.append((occur.MustNot, q.term_set_query(schema, "thread_key", hidden)))
    hits = searcher.search(q.boolean_query(clauses), RERANK_WINDOW, count=False).hits
    for _, address in hits:
        searcher.doc(address)
    return len(hits)


async def writes(store: MessageStore, index: LexicalIndex, batch: int, batches: int) -> None:
    t0 = datetime(2027, 1, 1, tzinfo=UTC)
    agent = f"live{batch}"
    idx_ms, ch_ms = [], []
    rows: list[MessageRow] = []
    for b in range(batches):
        rows = [
            MessageRow(
                "acct",
                agent,
                f"th{b}",
                i,
                f"m{b}-{i}",
                "user",
                f"the walrus said {i} things about painting kittens in batch {b}",
                "",
                (),
                t0,
                b * batch + i,
            )
            for i in range(batch)
        ]
        table = messages_table(rows)
        t = time.perf_counter()
        await store.engine.insert_arrow(store.database, "messages", table)
        ch_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        await index.upsert(
            [IndexRow(r.account_id, r.agent_id, r.thread_id, r.offset, 0, r.content) for r in rows]
        )
        idx_ms.append((time.perf_counter() - t) * 1000)
    await index.upsert(
        [IndexRow(r.account_id, r.agent_id, r.thread_id, r.offset, 0, r.content) for r in rows]
    )
    import tantivy

    found = index._index.searcher().search(  # noqa: SLF001
        tantivy.Query.term_query(index._schema, "agent_id", agent),  # noqa: SLF001
        1,
        count=True,
    )
    # tantivy.pyi (0.27) leaves out SearchResult.count, which the binding has
    held: int = found.count  # type: ignore[attr-defined]
    total = batch * batches
    print(
        f"  batches of {batch:>5}: index upsert p50 {ts.pct(idx_ms, 50):6.1f} / p99 {ts.pct(idx_ms, 99):6.1f} ms "
        f"({total / (sum(idx_ms) / 1000):>8,.0f} messages/s); ClickHouse insert of the same batch "
        f"p50 {ts.pct(ch_ms, 50):6.1f} / p99 {ts.pct(ch_ms, 99):6.1f} ms ({total / (sum(ch_ms) / 1000):>8,.0f}/s); "
        f"index / insert {sum(idx_ms) / sum(ch_ms):.2f}x; after a redelivery {held:,} of {total:,} found"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, help="the 1M corpus of bench/transcript_search.py")
    ap.add_argument("--index-dir", help="keep the index root here (reused when present)")
    ap.add_argument("--queries", type=int, default=200, help="queries over the five shapes")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    root = Path(args.index_dir or tempfile.mkdtemp(prefix="memstream-index-"))
    engine = ChdbEngine(args.data_dir)
    postings = MessageStore(engine, DB)
    await postings.ensure_schema()
    indexed = MessageStore(engine, DB, index_root=root)
    started = time.perf_counter()
    await indexed.ensure_schema()
    index = indexed.lexical_index()
    assert index is not None
    docs = await index.count()
    fill_s = time.perf_counter() - started
    parts = await engine.rows(
        f"SELECT table, sum(bytes_on_disk) FROM system.parts WHERE database = '{DB}' "
        "AND active GROUP BY table ORDER BY table",
        {},
    )
    print(
        f"index: {docs:,} messages, ready in {fill_s:.1f} s ({docs / fill_s:,.0f}/s when filled "
        f"now), {dir_size(root / DB) / 1e6:.0f} MB; ClickHouse: "
        + ", ".join(f"{t} {int(str(b)) / 1e6:.0f} MB" for t, b in parts)
    )

    async def raw(spec: SearchSpec) -> list[tuple[str, int, float]]:
        hidden = await indexed._hidden_threads(spec.account_id, spec.agent_id, spec.user_id or "")  # noqa: SLF001
        await asyncio.to_thread(raw_search, index, spec, hidden)
        return []

    async def through(store: MessageStore, spec: SearchSpec) -> list[tuple[str, int, float]]:
        return [(h.thread_id, h.offset, h.relevance) for h in await store.lexical_search(spec)]

    paths = {
        "postings": lambda spec: through(postings, spec),
        "index": lambda spec: through(indexed, spec),
        "raw": raw,
    }
    rng = np.random.default_rng(args.seed)
    vocab = ts.vocabulary(ts.VOCAB, rng)

    shapes = ts.query_shapes(vocab, rng)
    totals: dict[str, list[float]] = {p: [] for p in paths}
    same_hits = same_scores = compared = 0

    def line(times: dict[str, list[float]]) -> str:
        b, a, r = times["postings"], times["index"], times["raw"]
        return (
            f"postings {ts.pct(b, 50):6.1f} / {ts.pct(b, 99):6.1f}  index {ts.pct(a, 50):6.1f} / "
            f"{ts.pct(a, 99):6.1f}  raw {ts.pct(r, 50):5.1f} / {ts.pct(r, 99):5.1f} ms  index/postings "
            f"{ts.pct(a, 50) / ts.pct(b, 50):.2f}x / {ts.pct(a, 99) / ts.pct(b, 99):.2f}x  index/raw "
            f"{ts.pct(a, 50) / ts.pct(r, 50):.1f}x / {ts.pct(a, 99) / ts.pct(r, 99):.1f}x"
        )

    # one untimed query per path and caller kind first: the owner map's load and the
    # searcher's first reads are a start's cost, not a search's
    for user in (None, "user0"):
        warm = SearchSpec("acct", "agent", user, query_words(str(vocab[100])), 10)
        for path in paths.values():
            await path(warm)
    print(f"load average {os.getloadavg()[0]:.1f} at the start of the queries (p50 / p99)")
    for label, make in shapes.items():
        times: dict[str, list[float]] = {p: [] for p in paths}
        agree = 0
        n = args.queries // len(shapes)
        for q in range(n):
            user = f"user{q % 50}" if q % 3 == 0 else None
            spec = SearchSpec("acct", "agent", user, query_words(make()), 10)
            got: dict[str, list[tuple[str, int, float]]] = {}
            names = list(paths)
            for name in names[q % 3 :] + names[: q % 3]:
                t = time.perf_counter()
                got[name] = await paths[name](spec)
                times[name].append((time.perf_counter() - t) * 1000)
            compared += 1
            hits_equal = [h[:2] for h in got["index"]] == [h[:2] for h in got["postings"]]
            agree += hits_equal
            same_hits += hits_equal
            same_scores += [round(h[2], 6) for h in got["index"]] == [
                round(h[2], 6) for h in got["postings"]
            ]
        for p in paths:
            totals[p] += times[p]
        print(f"  {label:28} {line(times)}  same hits {agree}/{n}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"all threads, every shape: {line(totals)}; target p99 <= 50 ms")
    print(
        f"  index against postings: the same ten hits for {same_hits} / {compared} queries, the "
        f"same relevance at every rank for {same_scores} / {compared}"
    )
    print("writes (what the index adds to a projector batch; a scratch database):")
    scratch = MessageStore(engine, "bench_index_writes", index_root=root)
    await engine.command("DROP DATABASE IF EXISTS bench_index_writes")
    await scratch.drop_index("bench_index_writes")
    await scratch.ensure_schema()
    scratch_index = scratch.lexical_index()
    assert scratch_index is not None
    await writes(scratch, scratch_index, 50, 40)
    await writes(scratch, scratch_index, 5000, 8)
    await engine.command("DROP DATABASE bench_index_writes")
    await scratch.drop_index("bench_index_writes")
    await indexed.close()
    await engine.close()
    if not args.index_dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
