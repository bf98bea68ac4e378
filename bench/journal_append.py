"""Bench: durable appends/s through ``Journal.append`` vs the raw SlateDB ceiling.

Prints, for a local-folder SlateDB with ``flush_interval`` 5 ms:

- durable appends/s through ``Journal.append`` (one message each, ~200 B of content) at
  concurrency 1, 16 and 64, with the writer's eager WAL flush on (default) and off;
- the raw ceiling: batches of the same puts the journal makes (one message record per
  append, one sequence block per batch; all encoded before timing) written straight to SlateDB with one durable wait per batch (batch size 64),
  with and without an explicit WAL flush per batch; and the ratio journal/raw at
  concurrency 64;
- single-append latency p50/p99 (one writer, one append at a time);
- open loop: appends submitted at a fixed offered rate for one second (each its own task, 10
  threads), with the rate achieved and the latency p50/p99. Requests that arrive while a
  batch is in flight are staged into the next batch meanwhile (the journal's pipelining),
  which a closed loop of callers waiting on one batch never exercises.

Run: ``python bench/journal_append.py [--appends N] [--no-fastpath]``. ``--no-fastpath`` keeps
the binding's byte-by-byte copy (see ``memstream.infra.journal.fastpath``) for journal and raw
alike, to show what the fix is worth. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from slatedb.uniffi import DbBuilder, FlushOptions, FlushType, Settings, WriteBatch

from memstream.clock import SystemClock, epoch_ms
from memstream.infra.journal import Journal, fastpath, keys, local_store
from memstream.infra.journal.codec import encode_message, encode_seq_block
from memstream.schemas.events import encode, message_appended
from memstream.schemas.records import Message, NewMessage, ThreadRef

FAST = True
CONTENT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 chars
FLUSH_MS = 5


async def journal_rate(root: Path, concurrency: int, total: int, eager: bool) -> tuple[float, int]:
    """Durable appends/s and batches used, ``total`` appends spread over ``concurrency`` tasks."""
    j = await Journal.open(
        local_store(root / f"j-{concurrency}-{eager}"),
        "j",
        flush_interval_ms=FLUSH_MS,
        eager_flush=eager,
        fast_binding=FAST,
    )
    msg = [NewMessage(role="user", content=CONTENT)]
    per_task = max(1, total // concurrency)

    async def worker(w: int) -> None:
        ref = ThreadRef("acct", "agent", f"t{w % 10}")
        for _ in range(per_task):
            await j.append(ref, msg)

    await j.append(ThreadRef("acct", "agent", "warm"), msg)
    before = j.stats.batches
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    dt = time.perf_counter() - t0
    batches = j.stats.batches - before
    await j.close()
    return per_task * concurrency / dt, batches


async def raw_rate(root: Path, batch: int, total: int, eager: bool) -> float:
    """Appends/s writing the same records straight to SlateDB, one durable wait per batch."""
    if FAST:
        fastpath.install()
    settings = Settings.default()
    settings.set("flush_interval", f'"{FLUSH_MS}ms"')
    builder = DbBuilder("raw", local_store(root / f"raw-{batch}-{eager}"))
    builder.with_settings(settings)
    db = await builder.build()
    now = SystemClock().now()
    ref = ThreadRef("acct", "agent", "t")
    # the same keys and values the journal writes, encoded before the clock starts: the
    # ceiling is SlateDB (and its binding) alone
    records: list[tuple[bytes, bytes, bytes]] = []
    for seq in range(1, max(1, total // batch) * batch + 1):
        m = Message(
            account_id="acct",
            agent_id="agent",
            thread_id="t",
            offset=seq - 1,
            message_id=keys.message_id(epoch_ms(now), seq),
            role="user",
            content=CONTENT,
            created_at=now,
            token_count=40,
            seq=seq,
        )
        env = encode(message_appended(m, epoch_ms(now)))
        records.append((keys.message_key(ref, m.offset), encode_message(m), env))
    blocks = [
        (keys.seq_key(start + 1), encode_seq_block([r[2] for r in records[start : start + batch]]))
        for start in range(0, len(records), batch)
    ]
    t0 = time.perf_counter()
    for start in range(0, len(records), batch):
        wb = WriteBatch()
        for mk, mv, _ in records[start : start + batch]:
            wb.put(mk, mv)
        wb.put(*blocks[start // batch])
        h = await db.write(wb)
        if eager:
            await db.flush_with_options(FlushOptions(flush_type=FlushType.WAL))
        await h.await_durable()
    dt = time.perf_counter() - t0
    await db.shutdown()
    return len(records) / dt


async def latency(root: Path, n: int, eager: bool) -> tuple[float, float]:
    j = await Journal.open(
        local_store(root / f"lat-{eager}"),
        "j",
        flush_interval_ms=FLUSH_MS,
        eager_flush=eager,
        fast_binding=FAST,
    )
    ref = ThreadRef("acct", "agent", "lat")
    msg = [NewMessage(role="user", content=CONTENT)]
    await j.append(ref, msg)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await j.append(ref, msg)
        samples.append((time.perf_counter() - t0) * 1000)
    await j.close()
    q = statistics.quantiles(samples, n=100)
    return statistics.median(samples), q[98]


async def offered(root: Path, rate: int) -> tuple[float, float, float, int]:
    """Appends submitted at ``rate``/s for one second: achieved rate, p50 and p99 latency in
    ms, and how many batches were staged while another was in flight."""
    j = await Journal.open(
        local_store(root / f"open-{rate}"), "j", flush_interval_ms=FLUSH_MS, fast_binding=FAST
    )
    msg = [NewMessage(role="user", content=CONTENT)]
    refs = [ThreadRef("acct", "agent", f"t{i}") for i in range(10)]
    await j.append(refs[0], msg)
    samples: list[float] = []

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        await j.append(refs[i % 10], msg)
        samples.append((time.perf_counter() - t0) * 1000)

    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    while len(tasks) < rate:
        due = min(rate, int((time.perf_counter() - start) * rate) + 1)
        while len(tasks) < due:
            tasks.append(asyncio.create_task(one(len(tasks))))
        await asyncio.sleep(0.0005)
    await asyncio.gather(*tasks)
    dt = time.perf_counter() - start
    pipelined = getattr(j.stats, "pipelined", 0)
    await j.close()
    q = statistics.quantiles(samples, n=100)
    return rate / dt, q[49], q[98], pipelined


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=6400, help="appends per concurrency level")
    ap.add_argument("--latency-samples", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    ap.add_argument("--no-fastpath", action="store_true", help="keep the binding's slow copy")
    args = ap.parse_args()
    global FAST  # noqa: PLW0603 - a bench switch
    FAST = not args.no_fastpath
    med = statistics.median
    with tempfile.TemporaryDirectory(prefix="bench-journal-") as tmp:
        root = Path(tmp)
        print(
            f"SlateDB on a local folder, flush_interval {FLUSH_MS} ms, "
            f"~{len(CONTENT)}-char messages, binding fast copy {'on' if FAST else 'off'}, "
            f"median of {args.repeat} interleaved runs"
        )
        print()
        print(f"{'mode':<28}{'conc':>6}{'appends/s':>12}{'batches':>9}{'appends/batch':>15}")
        rates: dict[tuple[bool, int], float] = {}
        raw: dict[bool, float] = {}
        run = 0
        for eager in (True, False):
            label = "Journal.append, eager" if eager else "Journal.append, tick only"
            for c in (1, 16, 64):
                total = args.appends if c > 1 else min(args.appends, 1000 if eager else 200)
                samples, raw_samples = [], []
                batches = 0
                for _ in range(args.repeat):
                    run += 1
                    rate, batches = await journal_rate(root / str(run), c, total, eager)
                    samples.append(rate)
                    if c == 64:  # the ceiling, measured right after, under the same load
                        raw_samples.append(await raw_rate(root / str(run), 64, total, eager))
                rates[(eager, c)] = med(samples)
                if raw_samples:
                    raw[eager] = med(raw_samples)
                done = max(1, total // c) * c
                print(
                    f"{label:<28}{c:>6}{rates[(eager, c)]:>12,.0f}{batches:>9}"
                    f"{done / max(batches, 1):>15.1f}"
                )
            rlabel = "raw batch 64, flush+wait" if eager else "raw batch 64, wait only"
            print(f"{rlabel:<28}{'':>6}{raw[eager]:>12,.0f}")
        print()
        best_raw = max(raw.values())
        for eager in (True, False):
            print(
                f"ratio at 64 ({'eager' if eager else 'tick only'}): "
                f"{rates[(eager, 64)] / raw[eager]:.2f} of raw in the same mode, "
                f"{rates[(eager, 64)] / best_raw:.2f} of the best raw"
            )
        print()
        for eager in (True, False):
            p50, p99 = await latency(root, args.latency_samples if eager else 100, eager)
            print(
                f"single append latency ({'eager' if eager else 'tick only'}): "
                f"p50 {p50:.2f} ms, p99 {p99:.2f} ms"
            )
        print()
        print(
            f"{'open loop, eager':<22}{'achieved/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'pipelined':>11}"
        )
        for rate in (4000, 8000, 12000):
            got, p50, p99, piped = await offered(root, rate)
            label = f"offered {rate:,}/s"
            print(f"{label:<22}{got:>12,.0f}{p50:>9.1f}{p99:>9.1f}{piped:>11}")


if __name__ == "__main__":
    asyncio.run(main())
