"""Transcript search's BM25 side on ClickHouse posting lists against a Tantivy index of the
same messages: is a second, in-process lexical index worth its cost? (issue 10)

Run: ``python bench/lexical_engines.py --data-dir DIR [--queries 200] [--tantivy-dir DIR2]``
after ``python bench/transcript_search.py --messages 1000000 --threads 10000
--skip-projector --data-dir DIR`` has built the 1M corpus there (this bench reads it, it
does not generate one).

1. **Index.** Every message's stored terms (the ``terms`` column: the project's own
   analyzer, computed by ClickHouse at insert) go into a Tantivy index as one
   whitespace-tokenized text field with positions (so both engines see the same terms at
   the same positions), with the tenancy ids and the message key. Prints the index's build
   rate and size next to what the posting lists cost on disk.
2. **Queries.** The shapes and the caller mix of ``bench/transcript_search.py`` (all
   threads; a third of the callers own private threads), each answered by both paths,
   interleaved, order alternating:

   - ``clickhouse``: ``MessageStore.lexical_search`` (BM25, pruning, proximity bonus, the
     hits' text), what a search runs now;
   - ``tantivy``: a boolean OR of the query's terms, the tenancy ids as zero-score filters,
     the private threads the caller may not read as a must-not term set, its best
     ``RERANK_WINDOW`` by Tantivy's BM25 (same k1, b and idf formula), then the same
     proximity rerank (positions from the stored terms) and the same text read from
     ``message_text``.

   Prints p50 / p99 of each per shape, the ratio, and how often the ten hits agree (same
   set; same order). They can differ on purpose: Tantivy counts df over *every* message of
   the index (other users' private threads and unmerged deletes included) where the
   project counts it over what the caller may see (docs/transcript-search.md, "Who sees
   what"), so its scores would leak a statistic of private text; the figure says what an
   exact re-score of its candidates would have to fix.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import transcript_search as ts  # noqa: E402  (the corpus' vocabulary and query shapes)

from memstream.projections.messages import ChdbEngine, MessageStore  # noqa: E402
from memstream.projections.messages.ranking import rerank  # noqa: E402
from memstream.projections.messages.sql import (  # noqa: E402
    BM25_B,
    BM25_K1,
    PROXIMITY_BOOST,
    PROXIMITY_WINDOW,
    RERANK_WINDOW,
    SearchSpec,
    query_words,
)

DB = "bench_search"
CANDIDATES = 300
"""Tantivy candidates re-scored exactly by the ``tantivy_exact`` path."""


def build_tantivy(engine_path: str, index_dir: str) -> tuple[object, float, int]:
    """The Tantivy index of every message in the corpus (built once, reused when
    ``index_dir`` already holds one). Returns (index, build seconds or 0, documents)."""
    import chdb
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("key", tokenizer_name="raw", index_option="basic")  # upserts, deletes
    sb.add_text_field("account_id", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("agent_id", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("thread_id", tokenizer_name="raw", index_option="basic", stored=True)
    sb.add_unsigned_field("offset", stored=True, fast=True)
    sb.add_integer_field("created_ms", fast=True)
    sb.add_text_field("body", stored=True, tokenizer_name="ws", index_option="position")
    schema = sb.build()
    fresh = not Path(index_dir, "meta.json").exists()
    # documents stored newest first: hits of equal score come back newest first, the
    # project's tie rule (within a segment; the build merges down to few segments)
    index = tantivy.Index(
        schema,
        path=index_dir,
        reuse=True,
        sort_by_field="created_ms",
        sort_order=tantivy.Order.Desc,
    )
    index.register_tokenizer(
        "ws", tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
    )
    if not fresh:
        index.reload()
        return index, 0.0, index.searcher().num_docs
    conn = chdb.connect(engine_path)
    started = time.perf_counter()
    table = conn.query(
        f"SELECT account_id, agent_id, thread_id, `offset`, "
        f"toUnixTimestamp64Milli(created_at) AS created_ms, arrayStringConcat(terms, ' ') AS body "
        f"FROM {DB}.messages FINAL",
        "Arrowtable",
    )
    conn.close()
    writer = index.writer(heap_size=512_000_000, num_threads=2)
    cols = [table.column(c).to_pylist() for c in table.column_names]
    for acct, agent, thread, offset, ms, body in zip(*cols, strict=True):
        doc = tantivy.Document()
        doc.add_text("key", f"{acct}/{agent}/{thread}/{offset}")
        doc.add_text("account_id", acct)
        doc.add_text("agent_id", agent)
        doc.add_text("thread_id", thread)
        doc.add_unsigned("offset", offset)
        doc.add_integer("created_ms", ms)
        doc.add_text("body", body)
        writer.add_document(doc)
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    return index, time.perf_counter() - started, len(cols[0])


def live_writes(index: object, batch: int, batches: int) -> None:
    """The projector's pattern: ``batches`` batches of ``batch`` new messages (another
    agent, so the queries above are not disturbed), each message an upsert (delete by key,
    then add: a redelivered batch leaves one copy), a commit per batch and the searcher
    reloaded; then the last batch redelivered. Prints messages/s and each batch's cost."""
    import tantivy

    writer = index.writer(heap_size=64_000_000, num_threads=1)  # type: ignore[attr-defined]
    costs = []
    started = time.perf_counter()

    def write(b: int) -> None:
        for i in range(batch):
            key = f"acct/live{batch}/th{b}/{i}"
            writer.delete_documents_by_term("key", key)
            doc = tantivy.Document()
            doc.add_text("key", key)
            doc.add_text("account_id", "acct")
            doc.add_text("agent_id", f"live{batch}")
            doc.add_text("thread_id", f"th{b}")
            doc.add_unsigned("offset", i)
            doc.add_integer("created_ms", 1_700_000_000_000 + b * 1000 + i)
            doc.add_text("body", "alpha beta gamma delta epsilon zeta eta theta iota kappa")
            writer.add_document(doc)
        writer.commit()
        index.reload()  # type: ignore[attr-defined]

    for b in range(batches):
        t = time.perf_counter()
        write(b)
        costs.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    write(batches - 1)  # redelivered
    writer.wait_merging_threads()
    index.reload()  # type: ignore[attr-defined]
    searcher = index.searcher()  # type: ignore[attr-defined]
    held = searcher.search(
        tantivy.Query.term_query(index.schema, "agent_id", f"live{batch}"),  # type: ignore[attr-defined]
        1,
        count=True,
    ).count
    print(
        f"  batches of {batch:>5}: {batch * batches / elapsed:>9,.0f} messages/s, a batch's "
        f"upserts + commit + reload p50 {ts.pct(costs, 50):.1f} / p99 {ts.pct(costs, 99):.1f} ms; "
        f"after a redelivery {held:,} of {batch * batches:,} found by a search"
    )


def dir_size(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, help="the 1M corpus of bench/transcript_search.py")
    ap.add_argument("--tantivy-dir", help="keep the Tantivy index here (reused when present)")
    ap.add_argument("--queries", type=int, default=200, help="queries over the five shapes")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()
    import tantivy

    index_dir = args.tantivy_dir or tempfile.mkdtemp(prefix="memstream-tantivy-")
    Path(index_dir).mkdir(parents=True, exist_ok=True)
    index, build_s, docs = build_tantivy(args.data_dir, index_dir)
    size = dir_size(index_dir)
    if build_s:
        print(
            f"tantivy: {docs:,} messages indexed in {build_s:.1f} s ({docs / build_s:,.0f}/s), {size / 1e6:.0f} MB"
        )
    else:
        print(f"tantivy: reusing {docs:,} messages, {size / 1e6:.0f} MB")

    engine = ChdbEngine(args.data_dir)
    store = MessageStore(engine, DB)
    await store.ensure_schema()
    parts = await engine.rows(
        f"SELECT table, sum(bytes_on_disk) FROM system.parts WHERE database = '{DB}' AND active GROUP BY table",
        {},
    )
    print("clickhouse on disk: " + ", ".join(f"{t} {int(str(b)) / 1e6:.0f} MB" for t, b in parts))
    owners: dict[str, set[str]] = {}
    for thread, user in await engine.rows(f"SELECT thread_id, user_id FROM {DB}.thread_users", {}):
        owners.setdefault(str(thread), set()).add(str(user))
    invisible_cache: dict[str, list[str]] = {}

    def invisible(user: str) -> list[str]:
        if user not in invisible_cache:
            invisible_cache[user] = sorted(t for t, us in owners.items() if user not in us)
        return invisible_cache[user]

    searcher = index.searcher()
    schema = index.schema
    zero = 0.0

    def tantivy_best(
        spec: SearchSpec, limit: int = RERANK_WINDOW
    ) -> list[tuple[str, int, int, float, list[int], int, list[list[int]]]]:
        should = [
            (tantivy.Occur.Should, tantivy.Query.term_query(schema, "body", w)) for w in spec.words
        ]
        q = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, tantivy.Query.boolean_query(should)),
                (
                    tantivy.Occur.Must,
                    tantivy.Query.const_score_query(
                        tantivy.Query.term_query(schema, "account_id", spec.account_id), zero
                    ),
                ),
                (
                    tantivy.Occur.Must,
                    tantivy.Query.const_score_query(
                        tantivy.Query.term_query(schema, "agent_id", spec.agent_id), zero
                    ),
                ),
                (
                    tantivy.Occur.MustNot,
                    tantivy.Query.term_set_query(
                        schema, "thread_id", invisible(spec.user_id or "")
                    ),
                ),
            ]
        )
        hits = searcher.search(q, limit, count=False).hits
        created = searcher.fast_field_values("created_ms", [a for _, a in hits])
        rows = []
        for (score, addr), ms in zip(hits, created, strict=True):
            doc = searcher.doc(addr)
            terms = doc.get_first("body").split(" ")
            positions = [[i for i, t in enumerate(terms) if t == w] for w in spec.words]
            rows.append(
                (
                    doc.get_first("thread_id"),
                    int(doc.get_first("offset")),
                    int(ms),
                    float(score),
                    [len(p) for p in positions],
                    len(terms),
                    positions,
                )
            )
        return rows

    def visible_df(spec: SearchSpec, word: str) -> int:
        """df over the messages the caller may see: the index's df (every message) less the
        term's messages in threads the caller may not read (a count, no hits)."""
        hidden = invisible(spec.user_id or "")
        df = searcher.doc_freq("body", word)
        if not df or not hidden:
            return df
        q = tantivy.Query.boolean_query(
            [
                (tantivy.Occur.Must, tantivy.Query.term_query(schema, "body", word)),
                (tantivy.Occur.Must, tantivy.Query.term_set_query(schema, "thread_id", hidden)),
            ]
        )
        return df - searcher.search(q, 1, count=True).count

    def exact_best(spec: SearchSpec, stats: tuple[float, float]):
        """Tantivy's best ``CANDIDATES`` re-scored with the project's statistics (df over the
        visible messages, the agent's count and average length), BM25's best
        ``RERANK_WINDOW`` of those in the project's order (ties to the newest)."""
        n_docs, avg_len = stats
        avg = max(avg_len, 1.0)
        idf = []
        for w in spec.words:
            df = visible_df(spec, w)
            idf.append(math.log(1 + (n_docs - df + 0.5) / (df + 0.5)) if df else 0.0)
        rows = []
        for thread, offset, ms, _s, tf, length, positions in tantivy_best(spec, CANDIDATES):
            bm25 = sum(
                i * f * (BM25_K1 + 1) / (f + BM25_K1 * (1 - BM25_B + BM25_B * length / avg))
                for i, f in zip(idf, tf, strict=True)
            )
            rows.append((thread, offset, ms, bm25, tf, length, positions))
        rows.sort(key=lambda r: (-r[3], -r[2], -r[1], r[0]))
        return rows[:RERANK_WINDOW]

    async def tantivy_exact(spec: SearchSpec) -> list[tuple[str, int, float]]:
        stats = await store.collection_stats(spec.account_id, spec.agent_id)
        ranked = rerank(
            spec.words, exact_best(spec, stats), PROXIMITY_WINDOW, PROXIMITY_BOOST, spec.limit
        )
        if not ranked:
            return []
        await store._text_at(spec, [(r.thread_id, r.offset) for r in ranked])
        return [(r.thread_id, r.offset, r.relevance) for r in ranked]

    async def tantivy_search(spec: SearchSpec) -> list[tuple[str, int, float]]:
        ranked = rerank(
            spec.words, tantivy_best(spec), PROXIMITY_WINDOW, PROXIMITY_BOOST, spec.limit
        )
        if not ranked:
            return []
        await store._text_at(spec, [(r.thread_id, r.offset) for r in ranked])  # the same text read
        return [(r.thread_id, r.offset, r.relevance) for r in ranked]

    async def clickhouse_search(spec: SearchSpec) -> list[tuple[str, int, float]]:
        return [(h.thread_id, h.offset, h.relevance) for h in await store.lexical_search(spec)]

    rng = np.random.default_rng(args.seed)
    vocab = ts.vocabulary(ts.VOCAB, rng)

    def word(lo: int, hi: int) -> str:
        return str(vocab[int(rng.integers(lo, hi))])

    shapes = {
        "1 common word (rank 50-200)": lambda: word(50, 200),
        "1 mid word (rank 200-2000)": lambda: word(200, 2000),
        "2 words (ranks 20-500)": lambda: f"{word(20, 500)} {word(20, 500)}",
        "3 words (ranks 5-300)": lambda: f"{word(5, 300)} {word(5, 300)} {word(5, 300)}",
        "1 rare word (rank 5000+)": lambda: word(5000, ts.VOCAB),
    }
    paths = {
        "clickhouse": clickhouse_search,
        "tantivy": tantivy_search,
        "tantivy_exact": tantivy_exact,
    }
    totals: dict[str, list[float]] = {p: [] for p in paths}
    others = [p for p in paths if p != "clickhouse"]
    same_set = dict.fromkeys(others, 0)
    same_order = dict.fromkeys(others, 0)
    same_scores = dict.fromkeys(others, 0)
    compared = 0

    def line(times: dict[str, list[float]]) -> str:
        ch = times["clickhouse"]
        out = [f"clickhouse {ts.pct(ch, 50):6.1f} / {ts.pct(ch, 99):6.1f}"]
        for p in others:
            tv = times[p]
            out.append(
                f"{p} {ts.pct(tv, 50):6.1f} / {ts.pct(tv, 99):6.1f} "
                f"({ts.pct(tv, 50) / ts.pct(ch, 50):.2f}x / {ts.pct(tv, 99) / ts.pct(ch, 99):.2f}x)"
            )
        return "  ".join(out) + " ms p50 / p99"

    print(f"load average {os.getloadavg()[0]:.1f} at the start of the queries")
    for label, make in shapes.items():
        times: dict[str, list[float]] = {p: [] for p in paths}
        agree = dict.fromkeys(others, 0)
        for q in range(args.queries // len(shapes)):
            user = f"user{q % 50}" if q % 3 == 0 else None
            spec = SearchSpec("acct", "agent", user, query_words(make()), 10)
            got: dict[str, list[tuple[str, int, float]]] = {}
            names = list(paths)
            for name in names[q % len(names) :] + names[: q % len(names)]:  # order rotating
                t = time.perf_counter()
                got[name] = await paths[name](spec)
                times[name].append((time.perf_counter() - t) * 1000)
            compared += 1
            for p in others:
                keys = [h[:2] for h in got["clickhouse"]]
                same_set[p] += set(keys) == {h[:2] for h in got[p]}
                same_order[p] += keys == [h[:2] for h in got[p]]
                agree[p] += keys == [h[:2] for h in got[p]]
                # the same relevance at every rank (to 1e-6): what differs is which of
                # equally scored messages is shown, not the ranking
                same_scores[p] += [round(h[2], 6) for h in got["clickhouse"]] == [
                    round(h[2], 6) for h in got[p]
                ]
        for p in paths:
            totals[p] += times[p]
        n = args.queries // len(shapes)
        print(
            f"  {label:28} {line(times)}; same hits "
            + ", ".join(f"{p} {agree[p]}/{n}" for p in others)
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"all threads, every shape: {line(totals)}; target p99 <= 50 ms")
    for p in others:
        print(
            f"  {p}: the same ten hits as clickhouse for {same_set[p]} / {compared} queries, "
            f"in the same order for {same_order[p]} / {compared}, the same relevance at "
            f"every rank for {same_scores[p]} / {compared}"
        )
    print("tantivy writes, as the projector would make them:")
    live_writes(index, 50, 40)
    live_writes(index, 5000, 8)
    await engine.close()
    if not args.tantivy_dir:
        shutil.rmtree(index_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
