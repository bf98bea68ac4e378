"""The chaos soak (issue 12): the long form of ``tests/chaos/test_chaos.py``.

Run: ``python bench/soak.py [--messages 1000000] [--threads 10000] [--memories 50000]
[--fault-every 60] [--faults memstream,kafka,postgres,valkey,bad] [--baseline-s 60]``.

One real ``memstream up`` (subprocess, embedded Kafka, Postgres, Valkey; chdb, qdrant-edge
and SlateDB in-process) takes appends and memory stores through its public HTTP API from
``--concurrency`` writers. First a **fault-free** stretch (``--baseline-s``) measures the
acknowledged writes per second; then load runs until ``--messages`` appends are
acknowledged, with one fault every ``--fault-every`` seconds (cycling ``--faults``):

- ``memstream``: ``memstream up`` SIGKILLed and started again on its data dir;
- ``kafka`` / ``postgres`` / ``valkey``: that child server SIGKILLed (restarted by ``up``
  when it does that, else by the soak on the same data dir and port);
- ``bad``: a malformed record straight onto the journal topic, an oversized append and an
  unparsable body (the API must refuse both with a JSON 4xx).

After each fault the load pauses until lag and gap read 0 (the time is that fault's
*convergence*), a sample of the data is checked, and the load resumes. At the end every
acknowledged write is checked in every store (search for ``--search-sample`` messages,
all memories, all threads' counters and summaries, the whole journal) and the soak prints
acknowledged / found / lost / doubled per store, the longest convergence per fault, and the
throughput under faults (acknowledged writes per second of loading, pauses excluded) as a
ratio to the fault-free stretch of the same run. Exit 1 if anything was lost or doubled.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package

from tests.chaos import harness as h  # noqa: E402

FAULTS = ("memstream", "kafka", "postgres", "valkey", "bad")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_load(
    up: h.Up, ledger: h.Ledger, args: argparse.Namespace, memory_every: int
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Start the harness's load against ``up``; set the event to stop it, await the task."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        h.load(
            lambda: up.url,
            ledger,
            stop,
            threads=args.threads,
            memory_every=memory_every,
            concurrency=args.concurrency,
            max_messages=args.messages,
        )
    )
    return stop, task


async def loaded(
    up: h.Up,
    ledger: h.Ledger,
    seconds: float,
    args: argparse.Namespace,
    memory_every: int,
) -> tuple[int, float]:
    """Load for ``seconds`` (or until ``--messages``); (writes acknowledged, seconds)."""
    before = ledger.appends_ok + ledger.stores_ok
    t0 = time.monotonic()
    stop, task = start_load(up, ledger, args, memory_every)
    with_timeout = asyncio.wait_for(asyncio.shield(task), seconds)
    try:
        await with_timeout
    except TimeoutError:
        stop.set()
        await task
    return ledger.appends_ok + ledger.stores_ok - before, time.monotonic() - t0


async def fault(up: h.Up, name: str) -> None:
    if name == "memstream":
        up.kill9()
        await asyncio.to_thread(up.start)
    elif name in ("kafka", "postgres", "valkey"):
        await h.restart_child(up, name)
    elif name == "bad":
        import httpx

        await h.publish_malformed(up)
        async with httpx.AsyncClient(
            base_url=up.url, headers={"Authorization": f"Bearer {h.KEY}"}, timeout=30
        ) as c:
            r = await c.post(
                f"/v1/agents/{h.AGENT}/threads/t0/messages",
                json={"role": "user", "content": "x" * (5 * 1024 * 1024)},
            )
            assert r.status_code in (400, 413), r.status_code
            r = await c.post(
                f"/v1/agents/{h.AGENT}/threads/t0/messages",
                content=b'{"role": ',
                headers={"content-type": "application/json"},
            )
            assert r.status_code == 400, r.status_code
    else:
        raise SystemExit(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")


async def main(args: argparse.Namespace) -> int:
    root = Path(args.data_dir or tempfile.mkdtemp(prefix="memstream-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    data = root / "data"
    up = h.Up(data, env={"MEMSTREAM_KAFKA_BROKER": "kafka"})
    ledger = h.Ledger()
    writes = args.messages + args.memories
    memory_every = max(2, round(writes / args.memories)) if args.memories else 0
    faults = [f for f in args.faults.split(",") if f]
    converge_s: dict[str, list[float]] = defaultdict(list)
    log(
        f"soak on {data}: {args.messages} messages, {args.threads} threads, "
        f"~{args.memories} memory writes (1 in {memory_every}), faults {faults} "
        f"every {args.fault_every}s"
    )
    await asyncio.to_thread(up.start)
    await h.bind_memory(up.url)
    try:
        await loaded(up, ledger, args.warmup_s, args, memory_every)  # models load, caches fill
        n, secs = await loaded(up, ledger, args.baseline_s, args, memory_every)
        base_rate = n / secs
        log(f"fault-free: {n} writes in {secs:.1f}s = {base_rate:.0f}/s")
        await h.converge(up, timeout=args.converge_timeout)

        load_writes, load_secs, i = 0, 0.0, 0
        while ledger.appends_ok < args.messages:
            n, secs = await loaded(up, ledger, args.fault_every / 2, args, memory_every)
            load_writes, load_secs = load_writes + n, load_secs + secs
            if ledger.appends_ok >= args.messages:
                break
            name = faults[i % len(faults)]
            i += 1
            t_fault = time.monotonic()
            t0 = time.monotonic()
            w0 = ledger.appends_ok + ledger.stores_ok
            stop, task = start_load(up, ledger, args, memory_every)
            await fault(up, name)
            await asyncio.sleep(args.fault_every / 2)
            stop.set()
            await task
            load_writes += ledger.appends_ok + ledger.stores_ok - w0
            load_secs += time.monotonic() - t0
            took = await h.converge(up, timeout=args.converge_timeout)
            since_fault = time.monotonic() - t_fault
            converge_s[name].append(took)
            report = h.Report()
            await h.check_live(up, ledger, report, sample=200)
            bad_letters = h.unexpected_letters(report.dead_letters)
            log(
                f"fault {i} {name}: converged {took:.1f}s after the load stopped "
                f"({since_fault:.1f}s after the fault); acked {ledger.appends_ok} messages, "
                f"{ledger.stores_ok} memory writes; check: "
                f"{'ok' if report.ok() and not bad_letters else 'FAILED'}"
            )
            if not report.ok() or bad_letters:
                for line in report.lines():
                    log("  " + line)
                for d in bad_letters[:5]:
                    log(f"  unexpected dead letter: {str(d)[:300]}")

        log("final check (all memories, all threads, search sample, then the journal)")
        await h.converge(up, timeout=args.converge_timeout)
        report = h.Report()
        await h.check_live(up, ledger, report, sample=args.search_sample)
    finally:
        up.stop()
        await h.stop_owned()
    await h.check_journal(data, ledger, report)
    bad_letters = h.unexpected_letters(report.dead_letters)
    rate = load_writes / load_secs if load_secs else 0.0
    print()
    print(
        f"acknowledged: {ledger.appends_ok} messages, {ledger.stores_ok} memory writes; "
        f"{ledger.failed} writes refused or unanswered during faults"
    )
    for line in report.lines():
        print(line)
    print(f"dead letters: {len(report.dead_letters)} ({len(bad_letters)} unexpected)")
    for name in faults:
        times = converge_s.get(name, [])
        if times:
            print(f"fault {name:<10} x{len(times)}: longest convergence {max(times):.1f}s")
    ratio = f"{rate / base_rate:.2f}x" if base_rate > 0 else "n/a (no fault-free writes)"
    print(
        f"throughput: fault-free {base_rate:.0f} writes/s, under faults {rate:.0f} writes/s "
        f"= {ratio}"
    )
    return 0 if report.ok() and not bad_letters else 1


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--threads", type=int, default=10_000)
    p.add_argument("--memories", type=int, default=50_000)
    p.add_argument("--fault-every", type=float, default=60.0)
    p.add_argument("--faults", default=",".join(FAULTS))
    p.add_argument("--baseline-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--search-sample", type=int, default=5_000)
    p.add_argument("--converge-timeout", type=float, default=600.0)
    p.add_argument("--data-dir", default=None)
    raise SystemExit(asyncio.run(main(p.parse_args())))
