"""What a projector batch's read-your-writes marks cost this process (``RedisPositions``).

Run: ``python bench/position_marks.py [--keys 64] [--batches 500] [--rounds 6]``.

A projector batch raises the mark of every thread it wrote (``ZADD … GT``) and keeps the
key expiring a week after its last advance. The expiry used to be pushed back with an
``EXPIRE`` per key per batch; now one process pushes a key's expiry back at most once an
hour. On an embedded Valkey, in this process, ``--batches`` batches of ``--keys`` busy keys
(the same threads, as under append load) are written both ways, in rounds alternating the
order, and it prints the CPU and wall time per batch and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.redis_positions import REFRESH_S, RedisPositions

WAYS = {"EXPIRE every batch (before)": 0.0, "EXPIRE once an hour (now)": REFRESH_S}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp))
        await server.start()
        try:
            redis = aioredis.from_url(server.url)
            keys = [f"acme/bot/t{i}" for i in range(args.keys)]
            cpu: dict[str, list[float]] = {w: [] for w in WAYS}
            wall: dict[str, list[float]] = {w: [] for w in WAYS}
            for r in range(args.rounds):
                ways = list(WAYS.items())
                for name, refresh in ways if r % 2 == 0 else ways[::-1]:
                    store = RedisPositions(redis, refresh_s=refresh)
                    await store.record("messages", dict.fromkeys(keys, 1))  # expiry set
                    c, t = time.process_time(), time.perf_counter()
                    for n in range(args.batches):
                        await store.record("messages", dict.fromkeys(keys, r * 10**6 + n + 2))
                    cpu[name].append((time.process_time() - c) / args.batches * 1e6)
                    wall[name].append((time.perf_counter() - t) / args.batches * 1e6)
            for name in WAYS:
                print(
                    f"{name:28s} {args.keys} keys: CPU {statistics.median(cpu[name]):7.0f} µs, "
                    f"wall {statistics.median(wall[name]):7.0f} µs per batch"
                )
            before, now = (statistics.median(cpu[w]) for w in WAYS)
            print(f"now / before, CPU per batch: {now / before:.2f}x")
            await redis.aclose()
        finally:
            await server.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--batches", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=6)
    asyncio.run(main(ap.parse_args()))
