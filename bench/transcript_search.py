"""Transcript search: projector throughput vs raw chdb inserts, and search latency at 1M rows.

Run: ``python bench/transcript_search.py [--messages 200000] [--threads 2000]
[--projector-messages 100000] [--queries 200] [--data-dir DIR] [--skip-projector]``.

1. **Projector rows/s vs raw insert.** ``--projector-messages`` encoded ``message.appended``
   events (a third of them system/tool messages, which the projector drops) go through the
   processor runtime's :class:`Dispatcher` as raw records in the projector's batch size, with
   Kafka left out so the figure is the projector's. Interleaved batch by batch (order
   rotating): *after*, the Arrow bulk parse (``MessageStore(bulk_parse="arrow")``, the
   default); *before*, ClickHouse's parse (``bulk_parse="engine"``); the Python path
   (runtime decode); and the raw chdb rate: the same searchable rows, already as Arrow IPC
   bytes, inserted with ``send_insert(..., "ArrowStream")`` in the same batch size into an
   identical table. Then the median cost of each step of the Arrow path. Target: ratio >= 0.5.
2. **Search latency.** ``--messages`` user/assistant messages in ``--threads`` threads (a
   Zipf vocabulary of 20k words, ~14 words per message, 10% of threads private) bulk-loaded
   as Arrow, then a mix of one-, two- and three-word queries, all-threads and
   current-thread scope, each answered by three paths interleaved (order rotating per
   query): ``raw`` (a ``count()`` text-index lookup of the query's terms), ``before`` (main's
   scan over ``messages`` before the posting lists, kept below as :func:`scan_search_sql`)
   and ``after`` (``journal_message_search(summarize=False)``, BM25 side). Prints p50/p99 of
   each, the ratios, and how many queries got the same hits in the same order from before
   and after. Target: p99 <= 50 ms at 1M messages in one agent.

The default run is short (200k messages in 2,000 threads, 100k projector events). For 1M:
``--messages 1000000 --threads 10000 --data-dir DIR`` keeps the corpus in ``DIR`` and
reuses it on the next run with the same ``--messages`` (generation and load take minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from memstream.agents_ctx.journal_tools import NoDeletedThreads, journal_message_search
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.infra.metrics import make_metrics
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.messages.rows import (
    MESSAGES_SCHEMA,
    arrow_ipc,
    messages_table,
    split_journal_batch,
)
from memstream.projections.messages.sql import (
    BM25_B,
    BM25_K1,
    PROXIMITY_BOOST,
    PROXIMITY_WINDOW,
    RERANK_WINDOW,
    SEARCH_SETTINGS,
    SearchSpec,
    SqlParam,
    check_database,
    messages_by_key_sql,
    query_words,
    visible_threads_filter,
)
from memstream.schemas.events import decode, encode, message_appended
from memstream.schemas.records import Caller, Message
from memstream.streams.message_projector import MessageProjector, rows_of_batch
from memstream.streams.processor import Dispatcher, EventMeta, RawRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)
VOCAB = 20_000
WORDS_PER_MESSAGE = 14


def vocabulary(n: int, rng: np.random.Generator) -> np.ndarray:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    out: set[str] = set()
    while len(out) < n:
        size = int(rng.integers(3, 10))
        out.add("".join(rng.choice(letters, size)))
    return np.array(sorted(out))


def texts(n: int, vocab: np.ndarray, rng: np.random.Generator) -> list[str]:
    ranks = rng.zipf(1.15, size=(n, WORDS_PER_MESSAGE))
    ranks = np.minimum(ranks - 1, len(vocab) - 1)
    words = vocab[ranks]
    return [" ".join(row) for row in words.tolist()]


def corpus_table(
    n: int, threads: int, vocab: np.ndarray, rng: np.random.Generator, agents: int = 1
) -> pa.Table:
    """``n`` messages in ``threads`` threads of account ``acct``, every tenth thread private
    to a user; threads go to agents by blocks of ten (each agent as private as the whole):
    thread ``i`` belongs to agent ``agent`` when ``(i // 10) % agents == 0``, else to
    ``agent<(i // 10) % agents>``."""
    per_thread = n // threads
    idx = np.arange(n)
    thread_no = idx // per_thread
    offset = idx % per_thread
    private = thread_no % 10 == 9
    user = np.where(
        private & (offset % 2 == 0), np.char.add("user", (thread_no % 50).astype(str)), ""
    )
    created = np.datetime64(T0.replace(tzinfo=None), "ms") + (
        thread_no * 3_600_000 + offset * 60_000
    ).astype("timedelta64[ms]")
    return pa.table(
        [
            pa.array(["acct"] * n),
            pa.array(
                np.where(
                    (thread_no // 10) % agents == 0,
                    "agent",
                    np.char.add("agent", ((thread_no // 10) % agents).astype(str)),
                )
            ),
            pa.array(np.char.add("th", thread_no.astype(str))),
            pa.array(offset, pa.uint64()),
            pa.array(np.char.add("m", idx.astype(str))),
            pa.array(np.where(offset % 2 == 0, "user", "assistant")),
            pa.array(texts(n, vocab, rng)),
            pa.array(user),
            pa.array([[]] * n, pa.list_(pa.string())),
            pa.array(created, pa.timestamp("ms", tz="UTC")),
            pa.array(idx, pa.uint64()),
        ],
        schema=MESSAGES_SCHEMA,
    )


def event_bytes(n: int, vocab: np.ndarray, rng: np.random.Generator) -> list[RawRecord]:
    contents = texts(n, vocab, rng)
    roles = ("user", "assistant", "system", "user", "assistant", "tool")
    out = []
    for i, content in enumerate(contents):
        m = Message(
            account_id="acct",
            agent_id="agent",
            thread_id=f"th{i // 100}",
            offset=i % 100,
            message_id=f"m{i}",
            role=roles[i % 6],  # type: ignore[arg-type]
            content=content,
            created_at=T0 + timedelta(seconds=i),
            seq=i,
            user_id="u1" if i % 3 == 0 else None,
            tool_call_id="c" if i % 6 == 5 else None,
        )
        meta = EventMeta("journal", 0, i, f"acct/agent/th{i // 100}".encode())
        out.append(RawRecord(meta, encode(message_appended(m, ts=i))))
    return out


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def bench_projector(
    engine: ChdbEngine, n: int, vocab: np.ndarray, rng: np.random.Generator
) -> None:
    """Interleaved, batch by batch, in one process on one chdb engine: the projector with
    the Arrow bulk parse (after), with ClickHouse's parse (before: main's bulk path until
    issue 15's last round), the Python path (runtime decode), and the raw Arrow insert of
    the same searchable rows (prepared ahead, untimed). Each round runs every path once on
    the same batch, the order rotating by round."""
    records = event_bytes(n, vocab, rng)
    batch = 5_000  # MessageProjector.batch_max
    batches = [records[i : i + batch] for i in range(0, n, batch)]

    async def nowhere(topic: str, key: bytes | None, value: bytes) -> None:
        raise AssertionError("nothing should be dead-lettered")

    class PythonPath(MessageProjector):
        raw = False

    projectors: dict[str, MessageProjector] = {}
    index_root = Path(tempfile.mkdtemp(prefix="memstream-bench-index-"))
    for label, parse in (
        ("after", "arrow"),
        ("before", "engine"),
        ("python", "arrow"),
        ("index", "arrow"),
    ):
        db = f"bench_projector_{label}"
        await engine.command(f"DROP DATABASE IF EXISTS {db}")
        store = MessageStore(
            engine,
            db,
            bulk_parse=parse,  # type: ignore[arg-type]
            index_root=index_root if label == "index" else None,  # memstream up's default
        )
        await store.ensure_schema()
        projectors[label] = (PythonPath if label == "python" else MessageProjector)(store)
    dispatchers = {
        label: Dispatcher(p, dlq_topic="dlq", publish=nowhere, metrics=make_metrics())
        for label, p in projectors.items()
    }
    # raw: the searchable rows of each batch as ready Arrow IPC, into an identical table
    await engine.command("DROP DATABASE IF EXISTS bench_raw")
    await MessageStore(engine, "bench_raw").ensure_schema()
    payloads = [
        arrow_ipc(messages_table(rows_of_batch([decode(r.value) for r in b]))) for b in batches
    ]
    conn = engine._connection()  # noqa: SLF001 - the bench times the engine's own insert
    loop = asyncio.get_running_loop()

    async def raw_insert(payload: bytes) -> None:
        def go() -> None:
            with conn.send_insert("INSERT INTO bench_raw.messages", "ArrowStream") as ins:
                ins.append(payload)
                ins.finish()

        await loop.run_in_executor(engine._pool, go)  # noqa: SLF001

    # warm-up (first Arrow conversions, first inserts), then start from empty tables
    for d in dispatchers.values():
        await d.dispatch(batches[0])
    await raw_insert(payloads[0])
    for p in projectors.values():
        await engine.command(f"TRUNCATE TABLE {p.store.database}.messages")
        p.rows_written = p.bulk_batches = p.python_batches = 0
    await engine.command("TRUNCATE TABLE bench_raw.messages")

    labels = ["after", "before", "python", "index", "raw"]
    spent = dict.fromkeys(labels, 0.0)
    load = [os.getloadavg()[0]]
    for i, b in enumerate(batches):
        k = i % len(labels)
        for label in labels[k:] + labels[:k]:
            t = time.perf_counter()
            if label == "raw":
                await raw_insert(payloads[i])
            else:
                await dispatchers[label].dispatch(b)
            spent[label] += time.perf_counter() - t
        if i % 10 == 9:
            load.append(os.getloadavg()[0])
    rows = projectors["after"].rows_written
    assert all(p.rows_written == rows for p in projectors.values())
    for label in ("after", "before"):
        got = await engine.rows(f"SELECT count() FROM bench_projector_{label}.messages", {})
        assert int(str(got[0][0])) == rows
    raw_rate = rows / spent["raw"]
    print(
        f"projector, {n} events -> {rows} rows in batches of {batch}, interleaved; "
        f"load average {min(load):.1f}-{max(load):.1f}"
    )
    names = {
        "after": "after: Arrow bulk parse (pyarrow JSON reader + compute) -> inserts",
        "before": "before: ClickHouse bulk parse (JSONEachRow SQL) -> inserts",
        "python": "Python path: runtime decode -> rows_of_batch -> Arrow -> inserts",
        "index": "after, with the lexical index beside the insert (memstream up)",
        "raw": "raw chdb Arrow insert of the same rows",
    }
    for label in labels:
        rate = rows / spent[label]
        extra = ""
        if label in projectors:
            p = projectors[label]
            extra = f"  ({n / spent[label]:,.0f} events/s; bulk {p.bulk_batches}, Python {p.python_batches})"
        print(f"  {names[label]:70} {rate:9,.0f} rows/s  ratio {rate / raw_rate:.2f}{extra}")
    print(
        f"after / before = {spent['before'] / spent['after']:.2f}x; "
        f"target: ratio >= 0.5 of raw ({'met' if rows / spent['after'] / raw_rate >= 0.5 else 'NOT met'})"
    )
    print(
        f"with the lexical index / after = {spent['after'] / spent['index']:.2f}x; budget "
        f"5,000 messages/s ({'met' if rows / spent['index'] >= 5_000 else 'NOT met'})"
    )
    await profile_steps(projectors["after"].store, batches[:20], payloads[:20], raw_insert)
    await projectors["index"].store.close()
    shutil.rmtree(index_root, ignore_errors=True)
    for p in projectors.values():
        await engine.command(f"DROP DATABASE {p.store.database}")
    await engine.command("DROP DATABASE bench_raw")


async def profile_steps(
    store: MessageStore,
    batches: list[list[RawRecord]],
    payloads: list[bytes],
    raw_insert: Callable[[bytes], Awaitable[None]],
) -> None:
    """Median cost per batch of each step of the Arrow bulk path, and of the raw insert."""
    steps: dict[str, list[float]] = {
        k: [] for k in ("parse+classify", "split", "thread_users", "messages", "raw")
    }
    for b, payload in zip(batches, payloads, strict=True):
        values = [r.value for r in b]
        t = time.perf_counter()
        parsed = await store.parse_journal_batch(values)
        t1 = time.perf_counter()
        assert parsed is not None
        split = split_journal_batch(parsed)
        t2 = time.perf_counter()
        await store.engine.insert_arrow(store.database, "thread_users", split.owners)
        t3 = time.perf_counter()
        await store.engine.insert_arrow(store.database, "messages", split.messages)
        t4 = time.perf_counter()
        await raw_insert(payload)
        t5 = time.perf_counter()
        for k, v in zip(steps, (t1 - t, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            steps[k].append(v * 1000)
    print(
        f"  per batch of {len(batches[0])} (median of {len(batches)}, load "
        f"{os.getloadavg()[0]:.1f}): "
        + ", ".join(f"{k} {statistics.median(v):.1f} ms" for k, v in steps.items())
    )


# --- before: main's ranked search at 6d1c0b4 (one scan over ``messages``), kept to compare ---
def scan_search_sql(
    database: str, spec: SearchSpec, stats: tuple[float, float] = (0.0, 1.0)
) -> tuple[str, dict[str, SqlParam]]:
    """The ranked search. Rows: thread_id, offset, created_at (epoch ms), relevance, then the
    score parts (bm25, proximity, per-term tf and df, message length, average length,
    messages counted). At most one row per (thread, offset) even before merges. Keys only:
    the text of the few rows returned is read after (:func:`messages_by_key_sql`), not that
    of every candidate the scoring reads (at 200k messages, one to two words over all
    threads, the candidates' content cost ~30 % of the query: p50 70.7 -> 49.1 ms).

    Matching is OR: the text index finds every visible message holding any query term.
    Term statistics are exact for the query: a message holding a term is a candidate, so the
    document frequency of each term is counted over the (deduplicated) candidates; the
    collection size and average length are the agent's (``stats``, from
    :func:`collection_stats_sql`, cached by the store: all its messages, private threads
    included as counts only -- no text of theirs is read or returned).
    """
    db = check_database(database)
    thread_filter = "AND thread_id = {thread_id:String}" if spec.thread_id is not None else ""
    tenant = "account_id = {account_id:String} AND agent_id = {agent_id:String}"
    sql = f"""WITH {{n_docs:Float64}} AS n_docs, greatest({{avg_len:Float64}}, 1.0) AS avg_len
SELECT thread_id, `offset`, created_ms, relevance,
       bm25, proximity, tf, df, doc_len, avg_len, n_docs
FROM (
    SELECT *,
        arrayCount((a, b) -> arrayExists(
                       (x, i) -> x = a AND has(arraySlice(terms, i + 1, {PROXIMITY_WINDOW}), b),
                       terms, arrayEnumerate(terms)),
                   {{pair_a:Array(String)}}, {{pair_b:Array(String)}})
          / greatest(length({{pair_a:Array(String)}}), 1) AS proximity,
        bm25 * (1 + {PROXIMITY_BOOST} * proximity) AS relevance
    FROM (
        SELECT *,
            arraySum(arrayMap((tf_i, df_i) -> log(1 + (n_docs - df_i + 0.5) / (df_i + 0.5)) * tf_i
                     * ({BM25_K1} + 1)
                     / (tf_i + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * doc_len / avg_len)),
                     tf, df)) AS bm25
        FROM (
            SELECT *, sumForEach(tf_hit) OVER () AS df
            FROM (
                SELECT thread_id, `offset`, terms,
                       toUnixTimestamp64Milli(created_at) AS created_ms,
                       length(terms) AS doc_len,
                       arrayMap(t -> countEqual(terms, t), {{terms:Array(String)}}) AS tf,
                       arrayMap(n -> toUInt64(n > 0), tf) AS tf_hit
                FROM {db}.messages
                WHERE {tenant}
                  {thread_filter}
                  AND hasAnyTokens(terms, {{terms:Array(String)}})
                  AND {visible_threads_filter(db, spec.thread_id is not None)}
                LIMIT 1 BY thread_id, `offset`
            )
        )
        ORDER BY bm25 DESC, created_ms DESC, `offset` DESC, thread_id
        LIMIT {{rerank:UInt32}}
    )
)
ORDER BY relevance DESC, created_ms DESC, `offset` DESC, thread_id
LIMIT {{limit:UInt32}}
SETTINGS {SEARCH_SETTINGS}"""
    words = list(spec.words)
    params: dict[str, SqlParam] = {
        "account_id": spec.account_id,
        "agent_id": spec.agent_id,
        "user_id": spec.user_id or "",
        "terms": words,
        "n_docs": str(stats[0]),
        "avg_len": str(stats[1]),
        "pair_a": words[:-1],
        "pair_b": words[1:],
        "limit": spec.limit,
        "rerank": max(RERANK_WINDOW, spec.limit),
    }
    if spec.thread_id is not None:
        params["thread_id"] = spec.thread_id
    return sql, params


async def scan_search(store: MessageStore, spec: SearchSpec) -> list[tuple[str, int]]:
    """The keys main's ``lexical_search`` returned (the scan above, then the rows' text)."""
    stats = await store.collection_stats(spec.account_id, spec.agent_id)
    sql, params = scan_search_sql(store.database, spec, stats)
    ranked = await store.engine.rows(sql, params)
    if not ranked:
        return []
    stored = await store.engine.rows(
        messages_by_key_sql(store.database),
        {
            "account_id": spec.account_id,
            "agent_id": spec.agent_id,
            "thread_ids": [str(r[0]) for r in ranked],
            "offsets": [int(str(r[1])) for r in ranked],
        },
    )
    have = {(str(r[0]), int(str(r[2]))) for r in stored}
    keys = [(str(r[0]), int(str(r[1]))) for r in ranked]
    return [k for k in keys if k in have]


async def raw_lookup(store: MessageStore, spec: SearchSpec) -> int:
    """The raw engine: how many of the agent's messages hold a query term (text index)."""
    thread = "AND thread_id = {thread_id:String}" if spec.thread_id is not None else ""
    rows = await store.engine.rows(
        f"SELECT count() FROM {store.database}.messages WHERE account_id = {{account_id:String}} "
        f"AND agent_id = {{agent_id:String}} {thread} "
        f"AND hasAnyTokens(terms, {{terms:Array(String)}}) SETTINGS {SEARCH_SETTINGS}",
        {
            "account_id": spec.account_id,
            "agent_id": spec.agent_id,
            "terms": list(spec.words),
            **({"thread_id": spec.thread_id} if spec.thread_id is not None else {}),
        },
    )
    return int(str(rows[0][0]))


async def load_corpus(
    engine: ChdbEngine,
    n: int,
    threads: int,
    vocab: np.ndarray,
    rng: np.random.Generator,
    agents: int = 1,
) -> MessageStore:
    """``bench_search`` with ``n`` messages: reused when the data dir already holds it (the
    1M corpus takes minutes to generate and project), else generated and loaded."""
    store = MessageStore(engine, "bench_search")
    rows = await engine.rows(
        "SELECT count() FROM system.tables WHERE database = 'bench_search' AND name = 'messages'",
        {},
    )
    if int(str(rows[0][0])):
        have = await engine.rows("SELECT count() FROM bench_search.messages", {})
        if int(str(have[0][0])) == n:
            started = time.perf_counter()
            await store.ensure_schema()  # a corpus of an older layout gets its postings here
            print(f"corpus: reusing {n:,} messages ({time.perf_counter() - started:.1f} s)")
            return store
    await engine.command("DROP DATABASE IF EXISTS bench_search")
    await store.ensure_schema()
    started = time.perf_counter()
    table = corpus_table(n, threads, vocab, rng, agents)
    gen_s = time.perf_counter() - started
    started = time.perf_counter()
    step = 250_000
    for i in range(0, n, step):
        await store.engine.insert_arrow("bench_search", "messages", table.slice(i, step))
    owners = table.filter(pa.compute.not_equal(table["user_id"], "")).select(
        ["account_id", "agent_id", "thread_id", "user_id"]
    )
    await store.engine.insert_arrow("bench_search", "thread_users", owners)
    load_s = time.perf_counter() - started
    print(
        f"corpus: {n:,} messages in {threads:,} threads generated in {gen_s:.1f} s, "
        f"loaded with their postings in {load_s:.1f} s ({n / load_s:,.0f} rows/s)"
    )
    return store


def query_shapes(vocab: np.ndarray, rng: np.random.Generator) -> dict[str, Callable[[], str]]:
    """The bench's query shapes by Zipf rank of their words, each drawing a query from
    ``rng`` when called (``bench/lexical_engines.py`` asks the same)."""

    def word(lo: int, hi: int) -> str:
        return str(vocab[int(rng.integers(lo, hi))])

    return {
        "1 common word (rank 50-200)": lambda: word(50, 200),
        "1 mid word (rank 200-2000)": lambda: word(200, 2000),
        "2 words (ranks 20-500)": lambda: f"{word(20, 500)} {word(20, 500)}",
        "3 words (ranks 5-300)": lambda: f"{word(5, 300)} {word(5, 300)} {word(5, 300)}",
        "1 rare word (rank 5000+)": lambda: word(5000, VOCAB),
    }


async def bench_search(
    engine: ChdbEngine,
    n: int,
    threads: int,
    queries: int,
    vocab: np.ndarray,
    rng: np.random.Generator,
    keep: bool,
) -> None:
    store = await load_corpus(engine, n, threads, vocab, rng)
    stats = await store.collection_stats("acct", "agent")

    shapes = query_shapes(vocab, rng)
    summarizer = ExtractiveSummaryModel()
    paths = ("raw", "before", "after")
    totals: dict[tuple[str, str], list[float]] = {}
    same = compared = 0
    print(f"load average {os.getloadavg()[0]:.1f} at the start of the queries")
    for scope in ("all_threads", "current_thread"):
        for label, make in shapes.items():
            times: dict[str, list[float]] = {p: [] for p in paths}
            for q in range(queries // len(shapes)):
                caller = Caller("acct", "agent", f"user{q % 50}" if q % 3 == 0 else None)
                thread = f"th{int(rng.integers(0, threads))}"
                text = make()
                spec = SearchSpec(
                    "acct",
                    "agent",
                    caller.user_id,
                    query_words(text),
                    10,
                    thread_id=thread if scope == "current_thread" else None,
                )
                results: dict[str, list[tuple[str, int]]] = {}
                # interleaved: every path answers the same query, in an order rotating by query
                for path in paths[q % 3 :] + paths[: q % 3]:
                    t = time.perf_counter()
                    if path == "raw":
                        await raw_lookup(store, spec)
                    elif path == "before":
                        results[path] = await scan_search(store, spec)
                    else:
                        res = await journal_message_search(
                            caller,
                            text,
                            scope=scope,
                            thread_id=thread,
                            limit=10,
                            summarize=False,
                            store=store,
                            summarizer=summarizer,
                            threads=NoDeletedThreads(),
                        )
                        results[path] = [(h.thread_id, h.offset) for h in res.results]
                    times[path].append((time.perf_counter() - t) * 1000)
                compared += 1
                same += results["before"] == results["after"]
            for p in paths:
                totals.setdefault((scope, p), []).extend(times[p])
            print(
                f"  {scope:14} {label:28} "
                + "  ".join(f"{p} {pct(times[p], 50):6.1f}/{pct(times[p], 99):6.1f}" for p in paths)
                + " ms (p50/p99)"
            )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(
        f"search over {n:,} messages ({stats[0]:,.0f} in the agent), summarize=false, "
        f"limit 10: same hits in the same order before/after for {same} of {compared} queries"
    )
    for scope in ("all_threads", "current_thread"):
        raw, before, after = (totals[(scope, p)] for p in paths)
        print(
            f"  {scope:14} p50 / p99: before {pct(before, 50):.1f} / {pct(before, 99):.1f} ms, "
            f"after {pct(after, 50):.1f} / {pct(after, 99):.1f} ms "
            f"(after/before {pct(after, 50) / pct(before, 50):.2f}x / "
            f"{pct(after, 99) / pct(before, 99):.2f}x), raw lookup {pct(raw, 50):.1f} / "
            f"{pct(raw, 99):.1f} ms (after/raw {pct(after, 50) / pct(raw, 50):.1f}x / "
            f"{pct(after, 99) / pct(raw, 99):.1f}x); target p99 <= 50 ms"
        )
    if not keep:
        await engine.command("DROP DATABASE bench_search")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--threads", type=int, default=2_000)
    ap.add_argument("--projector-messages", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--skip-projector", action="store_true")
    ap.add_argument(
        "--data-dir",
        help="chdb directory kept between runs: a search corpus of the same size is reused",
    )
    args = ap.parse_args()
    rng = np.random.default_rng(42)
    vocab = vocabulary(VOCAB, rng)
    with tempfile.TemporaryDirectory() as tmp:
        engine = ChdbEngine(args.data_dir or tmp)
        try:
            if not args.skip_projector:
                await bench_projector(engine, args.projector_messages, vocab, rng)
            if not args.skip_search:
                await bench_search(
                    engine,
                    args.messages,
                    args.threads,
                    args.queries,
                    vocab,
                    rng,
                    keep=args.data_dir is not None,
                )
        finally:
            await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
