"""What crypto-shredding costs: the journal relay's throughput with and without sealing, and
the consumer's open + decode against decode alone, measured in the same run.

Run: ``python bench/sealing.py [--messages 20000] [--threads 200] [--rounds 3]``.

Set-up: embedded Apache Kafka (KRaft, Maven jars) and Postgres (the ``data_keys`` table),
a real SlateDB journal on a local folder pre-filled with ``--messages`` messages (~300 bytes
of content each) over ``--threads`` threads. Each round drains the whole journal through a
fresh :class:`JournalRelay` into fresh topics twice, unsealed and sealed (order alternating
between rounds), and times it to the last acknowledgement (every topic is created and
written once before any timing, so no run pays for leader elections). The sealed run's keyring starts
cold in the first round (one key created per thread) and warm afterwards, like a running
relay. Then the consumer side: ``Keyring.open_many`` (warm cache) + ``decode`` of every
sealed record against ``decode`` of the plain records.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from memstream.infra.data_keys import Keyring
from memstream.infra.embedded.kafka import ApacheKafkaServer
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.journal import Journal, local_store
from memstream.infra.kafka import Bus, ensure_topics
from memstream.infra.postgres import create_pool, migrate
from memstream.schemas.events import decode
from memstream.schemas.records import NewMessage, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams.journal_relay import JournalRelay, plan_batch, seal_records


class FromStart:
    """The journal as a relay source whose watermark starts at 0 and lives in memory."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.mark = 0

    async def read_seq(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]:
        return await self.journal.read_seq(after_seq, limit)

    async def last_seq(self) -> int:
        return await self.journal.last_seq()

    async def relay_watermark(self) -> int:
        return self.mark

    async def set_relay_watermark(self, seq: int) -> None:
        self.mark = seq


async def drain(journal: Journal, bus: Bus, topics: Topics, keyring: Keyring | None) -> float:
    relay = JournalRelay(FromStart(journal), bus, topics, keyring=keyring, batch_size=500)
    t0 = time.perf_counter()
    await relay.start()
    try:
        assert await relay.wait_caught_up(600), "relay did not catch up"
    finally:
        await relay.stop()
    return time.perf_counter() - t0


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="sealbench-"))
    pg = EmbeddedPostgres(work / "pg")
    kafka = ApacheKafkaServer(work / "kafka")
    await pg.start()
    await kafka.start()
    pool = await create_pool(pg.dsn, max_size=4)
    await migrate(pool)
    journal = await Journal.open(local_store(work / "journal"), "journal")
    bus = Bus(kafka.address)
    await bus.start()
    try:
        refs = [ThreadRef("acme", "bot", f"t{i}") for i in range(args.threads)]
        body = "lorem ipsum dolor sit amet " * 11  # ~300 bytes
        per = args.messages // args.threads
        for ref in refs:
            await journal.append(
                ref, [NewMessage(role="user", content=f"{body} {i}") for i in range(per)]
            )
        total = await journal.last_seq()
        print(f"journal: {total} envelopes over {args.threads} threads")
        keyring = Keyring(pool)
        plain_s: list[float] = []
        sealed_s: list[float] = []
        # every run's topics created up front, and their leaders settled, before any timing
        runs = [Topics(f"b{uuid.uuid4().hex[:8]}.") for _ in range(2 * args.rounds)]
        for topics in runs:
            await ensure_topics(kafka.address, topics, 4, 1)
        for topics in runs:
            await bus.publish_many(topics.dlq, [("warm", b"{}")])
            await bus.publish_many(topics.journal, [(f"w{p}", b"{}") for p in range(16)])
        for r in range(args.rounds):
            order = [None, keyring] if r % 2 == 0 else [keyring, None]
            for kr in order:
                took = await drain(journal, bus, runs.pop(), kr)
                (plain_s if kr is None else sealed_s).append(took)
                mode = "plain " if kr is None else "sealed"
                print(f"round {r + 1} {mode}: {total / took:9.0f} records/s ({took:.2f} s)")
        p, s = statistics.median(plain_s), statistics.median(sealed_s)
        pairs = sorted(a / b for a, b in zip(plain_s, sealed_s, strict=True))
        print(
            f"relay median: plain {total / p:.0f}/s, sealed {total / s:.0f}/s "
            f"-> sealed/plain throughput {p / s:.2f}x (per-round ratios "
            f"{', '.join(f'{x:.2f}' for x in pairs)}; median {statistics.median(pairs):.2f}x)"
        )
        # the relay's CPU alone (no Kafka): plan a batch, against plan + seal (warm keys)
        rows = await journal.read_seq(0, total)
        t0 = time.perf_counter()
        plan = plan_batch(rows, "j", 0)
        t_plan = time.perf_counter() - t0
        t0 = time.perf_counter()
        sealed = [r[1] for r in await seal_records(keyring, plan)]  # values (records carry headers)
        t_seal = time.perf_counter() - t0
        print(
            f"relay CPU: plan {len(rows) / t_plan:.0f}/s, seal {len(rows) / t_seal:.0f}/s "
            f"-> plan+seal {(t_plan + t_seal) / t_plan:.2f}x plan alone "
            f"({t_seal / len(rows) * 1e6:.1f} us per record)"
        )
        # the consumer side: open + decode against decode
        plain = [r[1] for r in plan.records]
        t0 = time.perf_counter()
        for v in plain:
            decode(v)
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(0, len(sealed), 500):
            for opened in await keyring.open_many(sealed[i : i + 500]):
                assert opened is not None
                decode(opened)
        t_sealed = time.perf_counter() - t0
        print(
            f"consumer: decode {len(plain) / t_plain:.0f}/s, open+decode "
            f"{len(sealed) / t_sealed:.0f}/s -> {t_sealed / t_plain:.2f}x the time "
            f"({(t_sealed - t_plain) / len(sealed) * 1e6:.1f} us per record)"
        )
        size = sum(map(len, sealed)) / sum(map(len, plain))
        print(f"bytes on the topic: sealed/plain {size:.3f}x")
    finally:
        await bus.stop()
        await journal.close()
        await pool.close()
        await kafka.stop()
        await pg.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
