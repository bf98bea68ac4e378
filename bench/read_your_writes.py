"""Read-your-writes positions shared through Redis: what they cost and how fast they travel.

Run: ``python bench/read_your_writes.py [--reps 300]`` (embedded Valkey).

Two :class:`Positions` over two Redis connections stand for the projector's process
(``memstream worker``) and the API's (``memstream api``). It prints p50/p99 of:

- ``publish``: one projector batch's shared write (``RedisPositions.record``: pipelined
  ``ZADD GT`` + ``EXPIRE`` per key) for 1 and 50 keys, vs the raw ceiling of one ``SET``;
- ``wait_for, already applied``: a read whose position the other process applied (one
  ``ZSCORE``), vs one raw ``GET``;
- ``visibility``: the API is waiting, the worker advances: time until the API's wait
  returns (polling Redis, 5 ms doubling to 25 ms), vs the same wake inside one process
  (the in-memory watermark, what ``memstream up`` gets).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import redis.asyncio as aioredis

from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.redis_positions import RedisPositions
from memstream.projections.positions import Positions, Watermarks


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] * 1000


def line(label: str, xs: list[float]) -> None:
    print(f"{label:44s} p50={pct(xs, 50):7.3f} ms  p99={pct(xs, 99):7.3f} ms")


async def visibility(waiter: Watermarks, writer: Watermarks, reps: int) -> list[float]:
    out = []
    for i in range(reps):
        key = f"acct/agent/vis{i}"
        task = asyncio.create_task(waiter.wait_for(key, 1, timeout=5.0))
        await asyncio.sleep(random.uniform(0.0, 0.2))  # the reader waits, at any phase
        t0 = time.perf_counter()
        writer.advance(key, 1)
        await task
        out.append(time.perf_counter() - t0)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=300)
    n = ap.parse_args().reps
    random.seed(7)
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedRedis(Path(tmp))
        await server.start()
        try:
            r_worker = aioredis.from_url(server.url)
            r_api = aioredis.from_url(server.url)
            store = RedisPositions(r_worker)
            worker = Positions.shared(store)
            api = Positions.shared(RedisPositions(r_api))

            raw_set, raw_get, pub1, pub50, read = [], [], [], [], []
            for i in range(n):
                t0 = time.perf_counter()
                await r_worker.set(f"raw:{i}", i)
                raw_set.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await store.record("messages", {f"acct/agent/t{i}": i + 1})
                pub1.append(time.perf_counter() - t0)
                batch = {f"acct/agent/t{i}-{j}": i + 1 for j in range(50)}
                t0 = time.perf_counter()
                await store.record("messages", batch)
                pub50.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await r_api.get(f"raw:{i}")
                raw_get.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await api.messages.wait_for(f"acct/agent/t{i}", i + 1, timeout=1.0)
                read.append(time.perf_counter() - t0)
            line("raw: one SET", raw_set)
            line("publish, 1 key (pipelined ZADD GT + EXPIRE)", pub1)
            line("publish, 50 keys (one round trip)", pub50)
            line("raw: one GET", raw_get)
            line("wait_for, applied by the other process", read)
            print(f"ratio publish 1 key / SET  p50={pct(pub1, 50) / pct(raw_set, 50):5.2f}x")
            print(f"ratio wait_for / GET       p50={pct(read, 50) / pct(raw_get, 50):5.2f}x")

            local = Watermarks("local")
            vis_local = await visibility(local, local, min(n, 100))
            vis_shared = await visibility(api.memory, worker.memory, min(n, 100))
            line("visibility, same process (in-memory wake)", vis_local)
            line("visibility, across processes (Redis poll)", vis_shared)
            await worker.close()
            await api.close()
            await r_worker.aclose()
            await r_api.aclose()
        finally:
            await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
