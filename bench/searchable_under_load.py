"""How long an appended message takes to be found by transcript search on a busy
``memstream up``, against the same with the server idle.

Run: ``python bench/searchable_under_load.py [--seconds 20] [--clients 64] [--rounds 2]
[--server NAME=SRC ...] [--env K=V ...] [--server-env NAME:K=V ...] [--before REF]``.

Each server is a ``memstream up`` subprocess (``bench/http_append.py``'s ``Up``: fresh data
dir, every embedded server, its source first on ``PYTHONPATH``). For ``--seconds`` the load
process of ``http_append.py`` keeps ``--clients`` connections appending batch-1 messages as
fast as the server answers (the event loop saturated, as in production under a burst);
meanwhile a probe appends, every ``--probe-every`` seconds, a message holding a word no
other message has to a thread of its own, and searches that thread for the word (every
20 ms) until it is found: the time from the append's answer to the first search that finds
it is what a user waits. The same probes run with the server idle. Servers take turns,
``--rounds`` times, after the server has gone quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_append import (  # noqa: E402
    Load,
    Up,
    _settle,
    _stop_servers,
    run_with,
    server_args,
    servers_of,
)

PROBE_TIMEOUT_S = 60.0


async def probe(client: httpx.AsyncClient, key: str, thread: str) -> float:
    """Seconds from an append's answer to the first search of its thread that finds it."""
    word = "zq" + uuid.uuid4().hex[:12].translate(str.maketrans("0123456789", "ghijklmnop"))
    headers = {"Authorization": f"Bearer {key}"}
    r = await client.post(
        f"/v1/agents/a/threads/{thread}/messages",
        json={"role": "user", "content": f"the probe word is {word}"},
        headers=headers,
    )
    r.raise_for_status()
    t0 = time.perf_counter()
    body = {"query": word, "scope": "current_thread", "thread_id": thread, "summarize": False}
    while time.perf_counter() - t0 < PROBE_TIMEOUT_S:
        r = await client.post("/v1/agents/a/journal/search", json=body, headers=headers)
        if r.status_code == 200 and r.json().get("results"):
            return time.perf_counter() - t0
        await asyncio.sleep(0.02)
    return float("inf")


async def probes(up: Up, seconds: float, every: float, busy: bool, load: Load) -> list[float]:
    """Probe ``up`` for ``seconds``, under the load's appends when ``busy``."""
    stop = threading.Event()

    def hammer() -> None:
        seq = 10_000_000
        while not stop.is_set():
            load.run(up.port, "append", up.key, 20, seq)
            seq += 20

    worker = threading.Thread(target=hammer, daemon=True) if busy else None
    if worker is not None:
        worker.start()
        await asyncio.sleep(1.0)  # the load in full swing
    out: list[float] = []
    thread = f"probe-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{up.port}", timeout=60) as client:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            out.append(await probe(client, up.key, thread))
            await asyncio.sleep(max(0.0, every - (time.perf_counter() - started)))
    stop.set()
    if worker is not None:
        await asyncio.to_thread(worker.join)
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1)))]


async def main(args: argparse.Namespace, servers: list[Up], loads: list[Load]) -> None:
    load = Load(args.procs, args.clients)
    loads.append(load)
    got: dict[tuple[str, str], list[float]] = {}
    try:
        for up in servers:
            up.start()
        for r in range(args.rounds):
            order = servers[r % len(servers) :] + servers[: r % len(servers)]
            for up in order:
                for busy in (False, True):
                    await asyncio.to_thread(_settle, servers)
                    xs = await probes(up, args.seconds, args.probe_every, busy, load)
                    got.setdefault((up.name, "busy" if busy else "idle"), []).extend(xs)
    finally:
        load.close()
        _stop_servers(servers)
    load1, load5, _ = os.getloadavg()
    print(
        f"{args.clients} appending clients in {args.procs} process(es), {args.seconds:.0f} s "
        f"per phase x {args.rounds} "
        f"rounds; load average {load1:.1f} / {load5:.1f} (1/5 min)"
    )
    print(
        f"{'server, state':<24} {'probes':>6} {'p50 ms':>8} {'p99 ms':>9} {'max ms':>9} {'lost':>5}"
    )
    for (name, state), xs in got.items():
        found = [x for x in xs if x != float("inf")]
        lost = len(xs) - len(found)
        p50, p99, top = (
            (_pct(found, 0.5), _pct(found, 0.99), max(found)) if found else (0.0, 0.0, 0.0)
        )
        print(
            f"{name + ', ' + state:<24} {len(xs):6d} {p50 * 1e3:8.0f} {p99 * 1e3:9.0f} "
            f"{top * 1e3:9.0f} {lost:5d}"
        )
    if len(servers) > 1:
        base = statistics.median(got[(servers[0].name, "busy")])
        for s in servers[1:]:
            other = statistics.median(got[(s.name, "busy")])
            print(f"busy p50 {s.name} / {servers[0].name}: {other / base:.2f}x")


def bench(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="memstream-searchable-"))
    servers = servers_of(args, work)
    run_with(servers, lambda loads: main(args, servers, loads))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--probe-every", type=float, default=0.5)
    ap.add_argument("--procs", type=int, default=1, help="load-generator processes")
    server_args(ap)
    with contextlib.suppress(KeyboardInterrupt):
        bench(ap.parse_args())
