"""Appends to a real ``memstream up`` with transcript search's dense side off and on.

Run: ``python bench/up_dense_append.py [--appends 600] [--clients 16] [--rounds 2]``.

Starts ``memstream up`` (fresh data dir, every embedded server) once per setting of
``MEMSTREAM_TRANSCRIPT_DENSE`` (``false`` = before, ``true`` = the default since issue 10),
the two processes one after the other, ``--rounds`` times each in alternation (off, on,
off, on, ...) so the machine's load hits both alike. Against each it sends ``--appends``
batch-1 appends of conversational turns from ``--clients`` concurrent HTTP clients and
prints appends/s and p50/p99 of the append call (the dense side's vector loop embeds
behind the projector, at the lowest CPU priority; appends must not wait for it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

KEY = "bench-key"
TURNS = [
    "How was your day today? I went hiking near the lake with my sister.",
    "We should plan the deployment for Thursday, after the database migration.",
    "My dog has been sick all week, the vet says it is nothing serious.",
    "Can you remind me what we decided about the budget for the offsite?",
    "I started learning the piano again, mostly jazz standards this time.",
    "The flight to Lisbon leaves at seven, so I will be up very early.",
]


def start(data: Path, dense: bool) -> tuple[subprocess.Popen[bytes], str, Path]:
    log = data / "up.log"
    env = {
        **os.environ,
        "MEMSTREAM_API_KEYS": f"bench:{KEY}",
        "MEMSTREAM_TRANSCRIPT_DENSE": "true" if dense else "false",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "memstream.infra.cli.main",
                "up",
                "--data-dir",
                str(data),
                "--port",
                "0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("memstream ready at "):
                return proc, line.split(" at ", 1)[1].strip(), log
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"memstream up did not start:\n{log.read_text(errors='replace')[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def burst(url: str, appends: int, clients: int, tag: str) -> tuple[float, list[float]]:
    headers = {"Authorization": f"Bearer {KEY}"}
    lat: list[float] = []
    per = appends // clients
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as c:

        async def one(k: int) -> None:
            for i in range(per):
                t = time.perf_counter()
                r = await c.post(
                    f"/v1/agents/bench/threads/{tag}-{k}/messages",
                    json={"role": "user", "content": f"{TURNS[(i + k) % len(TURNS)]} ({i})"},
                )
                assert r.status_code == 201, r.text
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(clients)))
        return per * clients / (time.perf_counter() - t0), lat


async def main(appends: int, clients: int, rounds: int, on_first: bool = False) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    lats: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="up-dense-") as tmp:
        for r in range(rounds):
            for dense in (True, False) if on_first else (False, True):
                data = Path(tmp) / f"r{r}-{'on' if dense else 'off'}"
                data.mkdir()
                proc, url, _ = start(data, dense)
                try:
                    await burst(url, clients * 4, clients, "warm")  # connections, first writes
                    rate, lat = await burst(url, appends, clients, "t")
                    rates[dense].append(rate)
                    lats[dense].extend(lat)
                    q = statistics.quantiles(lat, n=100)
                    print(
                        f"round {r} dense {'on ' if dense else 'off'}: {rate:7.1f} appends/s  "
                        f"p50 {q[49] * 1e3:6.1f} ms  p99 {q[98] * 1e3:7.1f} ms",
                        flush=True,
                    )
                finally:
                    stop(proc)
    print(f"\n{clients} clients, {appends} batch-1 appends per round, {rounds} rounds")
    for dense in (False, True):
        q = statistics.quantiles(lats[dense], n=100)
        print(
            f"dense {'on ' if dense else 'off'}: median {statistics.median(rates[dense]):7.1f} "
            f"appends/s  p50 {q[49] * 1e3:6.1f} ms  p99 {q[98] * 1e3:7.1f} ms"
        )
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    print(f"appends/s on / off: {ratio:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--appends", type=int, default=600)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--on-first", action="store_true", help="each round starts with dense on")
    a = ap.parse_args()
    asyncio.run(main(a.appends, a.clients, a.rounds, a.on_first))
