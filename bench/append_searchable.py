"""Append -> searchable: from ``journal.append`` returning to the message in transcript search.

Run: ``python bench/append_searchable.py [--rate 500] [--seconds 20] [--configs 0.1:1000 0.1:1000:index]``.

The write path of ``memstream up``, in one process on real engines: a SlateDB journal (local
folder), the journal relay woken by ``notify()`` after each append, an embedded Apache Kafka
(Tansu when java/mvn are missing), the processor runtime running the message projector
behind its gate with the read-your-writes recorder, and chdb. Appends of one user message
each arrive at ``--rate`` per second (paced, not closed-loop) over 64 threads for
``--seconds``. A message counts as searchable when the projector's read-your-writes mark for
its thread reaches its journal seq: the mark moves only after the ClickHouse insert has
committed, so a search from then on finds it (what ``"after": position`` waits for).

Each ``--configs`` entry ``WITHIN:BULK_MIN`` (the projector's ``batch_within_s``, how long a
batch that is not full waits for more records, and ``bulk_min``, the smallest batch that
ClickHouse parses in bulk; a third part ``:index`` adds the lexical index, Tantivy beside
chdb, written beside each insert as ``memstream up`` runs it) runs on a fresh journal, topic
and table in the same process, one after the other; the defaults are today's projector
without and with the index (``0.25:2`` is the projector before issue 15). It prints
p50/p99/max per entry, the batches written, rows per batch and the fraction of the run the
projector spent writing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from memstream.infra.embedded.kafka import embedded_broker
from memstream.infra.journal import Journal, local_store
from memstream.infra.kafka import Bus, ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.positions import Positions
from memstream.projections.replay import Gate
from memstream.schemas.records import NewMessage, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.gate import GatedProcessor, record_messages
from memstream.streams.journal_relay import JournalRelay
from memstream.streams.message_projector import NAME, MessageProjector
from memstream.streams.runner import Runner

THREADS = [ThreadRef("bench", "agent", f"t{i}") for i in range(64)]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


class TimedProjector(MessageProjector):
    """The projector, timing its own writes (how busy the insert path is)."""

    write_s = 0.0
    batches = 0

    async def handle_raw(self, records):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        try:
            await super().handle_raw(records)
        finally:
            self.write_s += time.perf_counter() - t
            self.batches += 1


async def one_run(
    root: Path,
    bootstrap: str,
    config: tuple[float, int, bool],
    rate: float,
    seconds: float,
    tag: str,
) -> tuple[list[float], TimedProjector, int]:
    journal = await Journal.open(local_store(root / f"journal-{tag}"), "journal")
    topics = Topics(f"bench{tag}.")
    await ensure_topics(bootstrap, topics, 4, 1)
    bus = Bus(bootstrap)
    await bus.start()
    relay = JournalRelay(journal, bus, topics)
    await relay.start()
    engine = ChdbEngine(root / f"chdb-{tag}")
    # with the lexical index (Tantivy, as `memstream up` runs on chdb) or the posting lists only
    store = MessageStore(engine, "bench", index_root=root / f"tantivy-{tag}" if config[2] else None)
    positions = Positions()
    projector = TimedProjector(store, batch_within_s=config[0], bulk_min=config[1])
    gated = GatedProcessor(projector, Gate(), record_messages(positions.messages))
    settings = Settings(
        kafka_bootstrap=bootstrap, topic_prefix=topics.prefix, partitions=4, data_dir=root
    )
    runner = Runner(settings, {NAME: lambda: gated}, make_metrics(), lag_interval_s=None)
    await runner.start()
    latencies: list[float] = []
    failed = 0
    try:
        await runner.wait_ready(60)

        async def one(i: int) -> None:
            nonlocal failed
            ref = THREADS[i % len(THREADS)]
            t0 = time.perf_counter()
            msgs = await journal.append(ref, [NewMessage("user", f"otter message {i}")])
            relay.notify()
            try:
                await positions.messages.wait_for(ref.key, msgs[0].seq, 30)
            except Exception:
                failed += 1
                return
            latencies.append(time.perf_counter() - t0)

        async def load(n: int, record: bool) -> None:
            tasks = []
            start = time.perf_counter()
            for i in range(n):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
            if not record:
                latencies.clear()

        await load(int(rate), record=False)  # warm-up: one second of load
        projector.write_s, projector.batches = 0.0, 0
        await load(int(rate * seconds), record=True)
    finally:
        await runner.stop()
        await relay.stop()
        await bus.stop()
        await journal.close()
        await store.close()
        await engine.close()
    return latencies, projector, failed


async def main(rate: float, seconds: float, configs: list[str], broker: str) -> None:
    parsed = [(float(c.split(":")[0]), int(c.split(":")[1]), c.endswith(":index")) for c in configs]
    with tempfile.TemporaryDirectory(prefix="memstream-bench-searchable-") as tmp:
        root = Path(tmp)
        server = embedded_broker(root / "kafka", broker=broker, partitions=4)
        await server.start()
        results = []
        try:
            for k, config in enumerate(parsed):
                run = await one_run(root, server.address, config, rate, seconds, str(k))
                results.append((configs[k], *run))
        finally:
            await server.stop()
    print(f"{rate:.0f} appends/s for {seconds:.0f} s, 64 threads, broker {type(server).__name__}")
    print(
        f"{'within:bulk_min':>15} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
        f"{'batches':>8} {'rows/batch':>10} {'write busy':>10}"
    )
    for name, lat, proj, failed in results:
        ms = [x * 1e3 for x in lat]
        busy = proj.write_s / seconds
        print(
            f"{name:>15} {pct(ms, 50):8.1f} {pct(ms, 99):8.1f} {max(ms):8.1f} "
            f"{proj.batches:8d} {len(ms) / max(1, proj.batches):10.1f} {busy:10.2f}"
            + (f"  ({failed} not searchable within 30 s)" if failed else "")
        )
    base = results[0][1]
    for label, lat, _, _ in results[1:]:
        print(
            f"{label} / {results[0][0]}: p50 {statistics.median(lat) / statistics.median(base):.2f}"
            f"x, p99 {pct(lat, 99) / pct(base, 99):.2f}x"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument(
        "--configs",
        nargs="+",
        default=["0.1:1000", "0.1:1000:index"],
        help="batch_within_s:bulk_min[:index] (index: with the lexical index, as up runs)",
    )
    ap.add_argument("--broker", default="auto")
    a = ap.parse_args()
    asyncio.run(main(a.rate, a.seconds, a.configs, a.broker))
