"""Bench: thread-memory counters throughput vs the raw consume rate, before (an earlier
commit's counters code) and after (this tree's), and crossing-message -> summary.written
latency with the offline summarizer.

Runs on embedded servers (Kafka via the suite's choice: Apache Kafka or Tansu, Valkey, a
SlateDB journal and an obstore folder in a temp dir). Prints figures and ratios; asserts
nothing. Usage: ``python bench/summaries.py [--threads 1000] [--rounds 3] [--before REF]
[--interleave] [--sealed] [--latency-threads 20]``. ``--sealed``: the records are sealed with
their threads' data keys (an embedded Postgres holds them), as ``memstream up`` publishes
them, and the processors get the keyring.

Throughput is measured for threads new to Redis (each costs a watermark load) and threads
Redis already knows and the processor has counted before (a running system), each on a fresh topic whose raw consume (aiokafka ``getmany``) is timed
right before and right after, so every ratio compares reads of the same records seconds
apart (the ratio is to their mean; the CPU ratio, raw consume's CPU per message over the
processor's, moves less with the load).
``--before REF`` (default ``faff411``, the commit before the count mark) loads that commit's
``streams/counters.py``, ``infra/thread_state.py`` and the processors' consumer
(``streams/consumer.ProcessorConsumer``, with its record constructor) from git beside this
tree's; the variants run interleaved,
their order rotating by round. Besides the rates: this process's
CPU per message, Valkey's CPU per message (``INFO cpu``) and its script time per message
(``INFO commandstats``, ``evalsha``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.consumer import fetcher as aiokafka_fetcher
from obstore.store import LocalStore

from memstream.infra.data_keys import Keyring, thread_scope
from memstream.infra.embedded.kafka import ApacheKafkaServer, TansuServer, choose_broker
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.journal import Journal, local_store
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.infra.metrics import make_metrics
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore
from memstream.infra.thread_state import ThreadState
from memstream.schemas.count_header import COUNT_HEADER, count_header
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message, NewMessage, ThreadRef
from memstream.schemas.topics import Topics
from memstream.streams import consumer as consumer_mod
from memstream.streams import fetched_records
from memstream.streams import runner as runner_mod
from memstream.streams.counters import CountersProcessor
from memstream.streams.processor import Processor
from memstream.streams.runner import Runner
from memstream.streams.summarizer import SummarizerProcessor

REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def load_before(ref: str) -> tuple[ModuleType, ModuleType, ModuleType]:
    """``(thread_state, counters, consumer)`` modules of commit ``ref``, loaded from git under
    their own names (they import the rest of memstream from this tree)."""
    folder = Path(tempfile.mkdtemp(prefix="before-"))
    mods = []
    for name, path in (
        ("thread_state", "src/memstream/infra/thread_state.py"),
        ("counters", "src/memstream/streams/counters.py"),
        ("consumer", "src/memstream/streams/consumer.py"),
    ):
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        file = folder / f"before_{name}.py"
        file.write_text(text)
        spec = importlib.util.spec_from_file_location(f"before_{name}", file)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods[0], mods[1], mods[2]


async def publish(
    bootstrap: str, topic: str, msgs: list[Message], keyring: Keyring | None = None
) -> None:
    """``msgs`` as the journal relay publishes them: keyed by thread, with the count header,
    sealed with their threads' data keys when ``keyring`` is given (``memstream up``'s way)."""
    envs = [message_appended(m, 1) for m in msgs]
    values = [encode(env) for env in envs]
    if keyring is not None:
        sealed = await keyring.seal_many(
            [
                (thread_scope(m.account_id, m.agent_id, m.thread_id), v)
                for m, v in zip(msgs, values, strict=True)
            ]
        )
        values = [v for v in sealed if v is not None]
        assert len(values) == len(msgs)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        for m, env, value in zip(msgs, envs, values, strict=True):
            key = ThreadRef(m.account_id, m.agent_id, m.thread_id).key.encode()
            header = count_header(env)  # what the journal relay attaches (the counters read it)
            assert header is not None
            await producer.send(topic, value, key=key, headers=[(COUNT_HEADER, header)])
        await producer.flush()
    finally:
        await producer.stop()


def aiokafka_as_shipped() -> None:
    """aiokafka's own ``PartitionRecords`` back in place (``fetched_records.install`` swaps
    in a subclass whose fallback for plain consumers costs a little per record): the raw
    consume and the "before" consumer run on aiokafka as it ships."""
    aiokafka_fetcher.PartitionRecords = fetched_records._ORIGINAL  # noqa: SLF001


async def raw_consume_rate(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    """Messages per second of a plain ``getmany`` loop, and this process's CPU µs per message."""
    aiokafka_as_shipped()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        got, started, cpu = 0, time.perf_counter(), time.process_time()
        while got < n:
            batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
            got += sum(len(v) for v in batches.values())
        return n / (time.perf_counter() - started), (time.process_time() - cpu) / n * 1e6
    finally:
        await consumer.stop()


async def valkey_cpu_s(redis: aioredis.Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def script_usec(redis: aioredis.Redis) -> float:
    """Server time spent in EVALSHA since the last ``CONFIG RESETSTAT`` (µs)."""
    info = await redis.info("commandstats")
    return float(info.get("cmdstat_evalsha", {}).get("usec", 0))


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f}/{five:.1f}"


async def main(
    threads: int,
    latency_threads: int,
    rounds: int,
    before_ref: str,
    interleave: bool,
    sealed: bool = False,
) -> None:
    before_state_mod, before_counters_mod, before_consumer_mod = load_before(before_ref)
    # the runtime's consumer changed too: each variant runs with its own ProcessorConsumer
    # (the runner looks the class up in its module when it starts one)
    consumer_of = {
        "before": before_consumer_mod.ProcessorConsumer,
        "after": consumer_mod.ProcessorConsumer,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kind = choose_broker("auto")
        kafka = (
            ApacheKafkaServer(root / "kafka") if kind == "kafka" else TansuServer(root / "kafka")
        )
        redis_server = EmbeddedRedis(root / "redis")
        await kafka.start()
        await redis_server.start()
        redis = aioredis.from_url(redis_server.url)
        postgres = EmbeddedPostgres(root / "postgres") if sealed else None
        keyring: Keyring | None = None
        pool = None
        if postgres is not None:
            await postgres.start()
            pool = await create_pool(postgres.dsn)
            await migrate(pool)
            keyring = Keyring(pool, cache_s=3600)
        journal = await Journal.open(local_store(root / "journal"), "journal")
        try:
            store = SummaryStore(LocalStore(prefix=root / "objects", mkdir=True), redis)
            state = ThreadState(redis)
            before_state = before_state_mod.ThreadState(redis)

            #: the threads a running process has counted before ("known" rounds): it
            #: remembers them, so it loads no watermark for them (this tree's counters)
            remembered: list[ThreadRef] = []

            def after() -> Processor:
                p = CountersProcessor(state, store, guard_ttl_s=600)
                p._known.update(dict.fromkeys(remembered))
                return p

            # the claim version (faff411 and earlier) took the claims' TTL
            claims = (
                "claim_ttl_s" in inspect.signature(before_counters_mod.CountersProcessor).parameters
            )
            ttl = {"claim_ttl_s": 3600} if claims else {}

            def before() -> Processor:
                return before_counters_mod.CountersProcessor(  # type: ignore[no-any-return]
                    before_state, store, guard_ttl_s=600, **ttl
                )

            variants: dict[str, Callable[[], Processor]] = {"before": before, "after": after}

            async def fresh_topics() -> tuple[Topics, Settings]:
                topics = Topics(prefix=f"b{uuid.uuid4().hex[:6]}.")
                await ensure_topics(kafka.address, topics, 4, 1)
                return topics, Settings(
                    kafka_bootstrap=kafka.address,
                    topic_prefix=topics.prefix,
                    partitions=4,
                    data_dir=root,
                )

            rows: list[dict[str, float | str]] = []

            async def throughput(variant: str, known: bool, *, record: bool = True) -> None:
                """Counters vs a raw consume of the same topic, for ``threads`` new threads.

                ``known``: their watermarks are in Redis already and the processor has
                counted them before (a running system's usual case); otherwise each thread
                costs one watermark load from the summary store (a new conversation; and,
                with this tree's counters, the first sight of a thread after the process
                restarts, which loads it too, Redis's own watermark winning)."""
                topics, settings = await fresh_topics()
                label = f"{variant}-{'known' if known else 'new'}-{uuid.uuid4().hex[:6]}"
                refs = [ThreadRef("bench", label, f"t{t}") for t in range(threads)]
                remembered[:] = refs if known else []
                if known:
                    await state.init_watermarks(dict.fromkeys(refs, -1))
                order = (
                    [(i, ref) for i in range(49) for ref in refs]
                    if interleave
                    else [(i, ref) for ref in refs for i in range(49)]
                )
                # 49 per thread (no summary requested, pure counting): a thread's 49 in a row,
                # or with --interleave one message of every thread in turn (a batch then
                # holds up to 500 threads: the most per-thread work per message)
                msgs = [
                    Message(
                        account_id=ref.account_id,
                        agent_id=ref.agent_id,
                        thread_id=ref.thread_id,
                        offset=i,
                        message_id=f"{ref.thread_id}-{i}",
                        role="user",
                        content=f"message {i} of thread {ref.thread_id}",
                        created_at=T0,
                        token_count=9,
                    )
                    for i, ref in order
                ]
                n = len(msgs)
                await publish(kafka.address, topics.journal, msgs, keyring)
                raw, raw_cpu = await raw_consume_rate(kafka.address, topics.journal, n)
                metrics = make_metrics()
                # through the module's dict: the runner does not export the name it looks up
                vars(runner_mod)["ProcessorConsumer"] = consumer_of[variant]
                if variant == "before":
                    aiokafka_as_shipped()  # (this tree's consumer installs its own hook)
                runner = Runner(
                    settings,
                    {"counters": variants[variant]},
                    metrics,
                    lag_interval_s=None,
                    keyring=keyring,
                )
                await runner.start()
                await runner.wait_ready(60)
                handled = {"processor": "counters", "topic": topics.journal}

                def done_so_far() -> float:
                    return metrics.sample("memstream_processor_events_total", handled) or 0

                # Watch the runner's own counter (no I/O: polling Redis here would slow the
                # processor, which shares this event loop). Timed from the first handled
                # batch, like the raw consume (which has no group join or offset lookup).
                while done_so_far() == 0:
                    await asyncio.sleep(0.002)
                await redis.config_resetstat()
                started, first, cpu = time.perf_counter(), done_so_far(), time.process_time()
                server = await valkey_cpu_s(redis)
                while done_so_far() < n:
                    await asyncio.sleep(0.01)
                wall = time.perf_counter() - started
                counted = (n - first) / wall
                # CPU of this process only (the processor's Python side; Redis and the broker
                # are other processes): steadier than wall time on a shared machine.
                counted_cpu = (time.process_time() - cpu) / (n - first) * 1e6
                server_cpu = (await valkey_cpu_s(redis) - server) / (n - first) * 1e6
                scripts = await script_usec(redis) / (n - first)
                await runner.stop()
                # the raw consume again, right after: the box's load moves within seconds,
                # so the ratio is to the mean of the reads either side
                raw2, raw_cpu2 = await raw_consume_rate(kafka.address, topics.journal, n)
                raw, raw_cpu = (raw + raw2) / 2, (raw_cpu + raw_cpu2) / 2
                done = 0
                for ref in refs:
                    done += (await state.counters(ref))[1]
                if done != n:
                    print(f"WARNING: counters hold {done} messages, expected {n}")
                row: dict[str, float | str] = {
                    "variant": variant,
                    "threads": "known" if known else "new",
                    "raw": raw,
                    "raw_cpu": raw_cpu,
                    "rate": counted,
                    "cpu": counted_cpu,
                    "valkey_cpu": server_cpu,
                    "script": scripts,
                    "ratio": counted / raw,
                    "cpu_ratio": raw_cpu / counted_cpu,
                    "load": load(),
                }
                if not record:
                    return
                rows.append(row)
                print(
                    f"  {variant:<6} {row['threads']:<5} raw {raw:>9,.0f} msg/s "
                    f"({raw_cpu:4.1f} µs CPU)  counters {counted:>8,.0f} msg/s "
                    f"({counted_cpu:4.1f} µs CPU, Valkey {server_cpu:4.1f} µs CPU, "
                    f"scripts {scripts:4.1f} µs)  ratio {counted / raw:.3f} (CPU "
                    f"{raw_cpu / counted_cpu:.2f})  load {row['load']}",
                    flush=True,
                )

            shape = "interleaved" if interleave else "each thread's in a row"
            print(
                f"broker: {kind}; {threads} threads x 49 messages ({shape}"
                f"{', sealed' if sealed else ''}); before = {before_ref}; load {load()}"
            )
            # warm-up (the first topic's first read is slow: connections, page cache)
            await throughput("after", True, record=False)
            # --- 1. throughput: counters vs raw consume, before and after, interleaved ------
            plan = [(v, k) for k in (False, True) for v in ("before", "after")]
            for r in range(rounds):
                print(f"round {r + 1} (load {load()})", flush=True)
                for variant, known in plan[r % len(plan) :] + plan[: r % len(plan)]:
                    await throughput(variant, known)
            print(
                "median over rounds (ratio = counters / raw consume of the same topic, read "
                "just before and after; CPU ratio = raw µs CPU/msg / counters µs CPU/msg):"
            )
            for kind_of in ("new", "known"):
                for variant in ("before", "after"):
                    mine = [x for x in rows if x["variant"] == variant and x["threads"] == kind_of]

                    def med(key: str, mine: list[dict[str, float | str]] = mine) -> float:
                        return statistics.median(float(x[key]) for x in mine)

                    print(
                        f"  {kind_of:<5} threads, {variant:<6}: ratio {med('ratio'):.3f} "
                        f"(min {min(float(x['ratio']) for x in mine):.3f}, max "
                        f"{max(float(x['ratio']) for x in mine):.3f}), CPU ratio "
                        f"{med('cpu_ratio'):.2f}, {med('rate'):,.0f} msg/s, "
                        f"{med('cpu'):.1f} µs CPU/msg here, Valkey {med('valkey_cpu'):.1f} µs "
                        f"CPU/msg, scripts {med('script'):.1f} µs/msg; raw {med('raw'):,.0f} msg/s"
                    )
            # --- 2. latency: crossing message appended -> summary.written ---------------------
            topics, settings = await fresh_topics()
            runner = Runner(
                settings,
                {
                    "counters": after,
                    "summarizer": lambda: SummarizerProcessor(
                        journal, state, store, ExtractiveSummaryModel(), token_budget=512
                    ),
                },
                make_metrics(),
                lag_interval_s=None,
            )
            await runner.start()
            await runner.wait_ready(60)
            latencies: list[float] = []
            for t in range(latency_threads):
                ref = ThreadRef("bench", "lat", f"t{t}")
                head = await journal.append(
                    ref,
                    [
                        NewMessage(role="user", content=f"Note {i}: the cache hit rate is {i}%.")
                        for i in range(49)
                    ],
                )
                await publish(kafka.address, topics.journal, head)
                await asyncio.sleep(0.3)
                started = time.perf_counter()
                last = await journal.append(
                    ref, [NewMessage(role="user", content="The 50th message.")]
                )
                await publish(kafka.address, topics.journal, last)
                while await store.get_stored(ref) is None:
                    await asyncio.sleep(0.005)
                latencies.append((time.perf_counter() - started) * 1000)
            await runner.stop()
            latencies.sort()
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(
                f"crossing append -> summary.json written ({len(latencies)} threads, offline model): "
                f"p50 {statistics.median(latencies):.0f} ms, p99 {p99:.0f} ms"
            )
        finally:
            await journal.close()
            await redis.aclose()
            await redis_server.stop()
            await kafka.stop()
            if pool is not None:
                await pool.close()
            if postgres is not None:
                await postgres.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--latency-threads", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default="faff411", help="git commit of the 'before' code")
    ap.add_argument("--interleave", action="store_true", help="threads' messages in turn")
    ap.add_argument(
        "--sealed",
        action="store_true",
        help="seal the records with their threads' data keys (an embedded Postgres holds them)",
    )
    a = ap.parse_args()
    asyncio.run(main(a.threads, a.latency_threads, a.rounds, a.before, a.interleave, a.sealed))
