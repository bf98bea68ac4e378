"""Transcript search: projector throughput vs raw chdb inserts, and search latency at 1M rows.

Run: ``python bench/transcript_search.py [--messages 1000000] [--threads 10000]
[--projector-messages 200000] [--queries 400]``.

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
   as Arrow, then ``journal_message_search(summarize=False)`` for a mix of one-, two- and
   three-word queries; p50/p99 over ``--queries`` calls, all-threads and current-thread
   scope. Target: p99 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa

from memstream.agents_ctx.journal_tools import journal_message_search
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.infra.metrics import make_metrics
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.messages.rows import (
    MESSAGES_SCHEMA,
    arrow_ipc,
    messages_table,
    split_journal_batch,
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
    out = set()
    while len(out) < n:
        size = int(rng.integers(3, 10))
        out.add("".join(rng.choice(letters, size)))
    return np.array(sorted(out))


def texts(n: int, vocab: np.ndarray, rng: np.random.Generator) -> list[str]:
    ranks = rng.zipf(1.15, size=(n, WORDS_PER_MESSAGE))
    ranks = np.minimum(ranks - 1, len(vocab) - 1)
    words = vocab[ranks]
    return [" ".join(row) for row in words.tolist()]


def corpus_table(n: int, threads: int, vocab: np.ndarray, rng: np.random.Generator) -> pa.Table:
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
            pa.array(["agent"] * n),
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
    for label, parse in (("after", "arrow"), ("before", "engine"), ("python", "arrow")):
        db = f"bench_projector_{label}"
        await engine.command(f"DROP DATABASE IF EXISTS {db}")
        store = MessageStore(engine, db, bulk_parse=parse)  # type: ignore[arg-type]
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

    labels = ["after", "before", "python", "raw"]
    spent = dict.fromkeys(labels, 0.0)
    load = [os.getloadavg()[0]]
    for i, b in enumerate(batches):
        for label in labels[i % 4 :] + labels[: i % 4]:
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
    await profile_steps(projectors["after"].store, batches[:20], payloads[:20], raw_insert)
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


async def bench_search(
    engine: ChdbEngine,
    n: int,
    threads: int,
    queries: int,
    vocab: np.ndarray,
    rng: np.random.Generator,
) -> None:
    store = MessageStore(engine, "bench_search")
    await engine.command("DROP DATABASE IF EXISTS bench_search")
    await store.ensure_schema()
    started = time.perf_counter()
    table = corpus_table(n, threads, vocab, rng)
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
        f"loaded in {load_s:.1f} s ({n / load_s:,.0f} rows/s)"
    )

    def word(lo: int, hi: int) -> str:
        return str(vocab[int(rng.integers(lo, hi))])

    shapes = {
        "1 common word (rank 50-200)": lambda: word(50, 200),
        "1 mid word (rank 200-2000)": lambda: word(200, 2000),
        "2 words (ranks 20-500)": lambda: f"{word(20, 500)} {word(20, 500)}",
        "3 words (ranks 5-300)": lambda: f"{word(5, 300)} {word(5, 300)} {word(5, 300)}",
        "1 rare word (rank 5000+)": lambda: word(5000, VOCAB),
    }
    summarizer = ExtractiveSummaryModel()
    all_times: list[float] = []
    for scope in ("all_threads", "current_thread"):
        for label, make in shapes.items():
            times = []
            n_hits = []
            for q in range(queries // len(shapes)):
                caller = Caller("acct", "agent", f"user{q % 50}" if q % 3 == 0 else None)
                thread = f"th{int(rng.integers(0, threads))}"
                t = time.perf_counter()
                res = await journal_message_search(
                    caller,
                    make(),
                    scope=scope,
                    thread_id=thread,
                    limit=10,
                    summarize=False,
                    store=store,
                    summarizer=summarizer,
                )
                times.append((time.perf_counter() - t) * 1000)
                n_hits.append(len(res.results))
            all_times += times
            print(
                f"  {scope:14} {label:30} p50 {pct(times, 50):6.1f} ms  p99 {pct(times, 99):6.1f} ms"
                f"  (mean hits {statistics.mean(n_hits):.1f})"
            )
    print(
        f"search over {n:,} messages, summarize=false: p50 {pct(all_times, 50):.1f} ms, "
        f"p99 {pct(all_times, 99):.1f} ms over {len(all_times)} queries (target p99 <= 50 ms)"
    )
    await engine.command("DROP DATABASE bench_search")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=10_000)
    ap.add_argument("--projector-messages", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--skip-search", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(42)
    vocab = vocabulary(VOCAB, rng)
    with tempfile.TemporaryDirectory() as tmp:
        engine = ChdbEngine(tmp)
        try:
            await bench_projector(engine, args.projector_messages, vocab, rng)
            if not args.skip_search:
                await bench_search(engine, args.messages, args.threads, args.queries, vocab, rng)
        finally:
            await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
