"""The ClickHouse step of a user's erasure: one mutation per thread and table (before) against
one per table for all the user's threads (``MessageStore.erase_threads``, after).

Run: ``python bench/erasure_clickhouse.py [--threads 100] [--messages 100] [--others 400]
[--rounds 3]``.

Each round seeds two fresh databases on one chdb engine with the same rows (the victim's
``--threads`` threads of ``--messages`` messages, and ``--others`` other users' threads of 20
messages, all private so every table holds rows), then erases the victim's threads from one
the old way (``erase_thread`` per thread: its count and four mutations) and from the other
with one ``erase_threads`` call, alternating which goes first. It checks both left the same
rows, and prints each side's seconds, medians and the ratio after / before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta

from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.schemas.events import message_appended
from memstream.schemas.records import Message
from memstream.streams.message_projector import rows_of_batch

T0 = datetime(2026, 1, 1, tzinfo=UTC)
WORDS = ("lisbon", "flights", "kumquat", "budget", "deadline", "review", "spring", "kittens")


def messages(thread: str, user: str, n: int) -> list[Message]:
    return [
        Message(
            account_id="acc",
            agent_id="ag",
            thread_id=thread,
            offset=o,
            message_id=f"{thread}-{o}",
            role="user" if o % 2 == 0 else "assistant",
            content=" ".join(WORDS[(o + i) % len(WORDS)] for i in range(12)),
            created_at=T0 + timedelta(seconds=o),
            user_id=user if o % 2 == 0 else None,
        )
        for o in range(n)
    ]


async def seeded(engine: ChdbEngine, args: argparse.Namespace) -> MessageStore:
    store = MessageStore(engine, f"e_{uuid.uuid4().hex[:12]}")
    await store.ensure_schema()
    batch: list[Message] = []
    for t in range(args.threads):
        batch += messages(f"victim-{t}", "victim", args.messages)
    for t in range(args.others):
        batch += messages(f"other-{t}", f"user-{t % 20}", 20)
    for i in range(0, len(batch), 5_000):
        await store.write(rows_of_batch(message_appended(x, ts=1) for x in batch[i : i + 5_000]))
    return store


async def left(store: MessageStore) -> list[tuple[object, ...]]:
    return await store.engine.rows(
        f"SELECT thread_id, count() FROM {store.database}.messages GROUP BY 1 ORDER BY 1", {}
    )


async def main(args: argparse.Namespace) -> None:
    victim = [("acc", "ag", f"victim-{t}") for t in range(args.threads)]
    before: list[float] = []
    after: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        engine = ChdbEngine(tmp)
        for r in range(args.rounds):
            old, new = await seeded(engine, args), await seeded(engine, args)

            for side in ("per thread", "together") if r % 2 == 0 else ("together", "per thread"):
                t0 = time.perf_counter()
                if side == "per thread":
                    for acc, agent, thread in victim:
                        await old.erase_thread(acc, agent, thread)
                    before.append(time.perf_counter() - t0)
                else:
                    await new.erase_threads(victim)
                    after.append(time.perf_counter() - t0)
            assert await left(old) == await left(new), "the two erasures left different rows"
            print(
                f"round {r + 1}: per thread {before[-1]:.2f} s, together {after[-1]:.2f} s "
                f"(load {os.getloadavg()[0]:.1f})"
            )
        await engine.close()
    b, a = statistics.median(before), statistics.median(after)
    print(
        f"\n{args.threads} threads x {args.messages} messages beside {args.others} others: "
        f"per thread {b:.2f} s, together {a:.2f} s (median of {args.rounds}); "
        f"after / before {a / b:.3f}x ({b / a:.1f}x faster)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=100)
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--others", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
