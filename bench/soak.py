"""The chaos soak (issue 12): the long form of ``tests/chaos/test_chaos.py``.

Run: ``python bench/soak.py [--messages 1000000] [--threads 10000] [--memories 50000]
[--fault-every 60] [--faults memstream,kafka,postgres,valkey,bad,worker,scale,partitions]
[--workers 2] [--partition-step 4] [--max-partitions 32] [--baseline-s 60]``.

One real ``memstream up`` (subprocess, embedded Kafka, Postgres, Valkey; chdb, qdrant-edge
and SlateDB in-process) takes appends and memory stores through its public HTTP API from
``--concurrency`` writers. First a **fault-free** stretch (``--baseline-s``) measures the
acknowledged writes per second; then load runs until ``--messages`` appends are
acknowledged and every fault ran at least once, with one fault every ``--fault-every``
seconds (cycling ``--faults``):

- ``memstream``: ``memstream up`` SIGKILLed and started again on its data dir;
- ``kafka`` / ``postgres`` / ``valkey``: that child server SIGKILLed (restarted by ``up``
  when it does that, else by the soak on the same data dir and port);
- ``bad``: a malformed record straight onto the journal topic, an oversized append and an
  unparsable body (the API must refuse both with a JSON 4xx);
- ``worker``: one of the ``--workers`` ``memstream worker counters summarizer`` processes
  (beside ``up``'s own consumers, in the same groups) SIGKILLed at a random point of its
  work and started again (a processor crash: records applied since its last commit are
  handed over again);
- ``scale``: one more such worker joins (the groups rebalance); the next ``scale`` fault
  stops it with SIGTERM (it leaves);
- ``partitions``: the journal, summaries and memory topics get ``--partition-step`` more
  partitions (Kafka ``create_partitions``), up to ``--max-partitions``.

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
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests package

from tests.chaos import harness as h  # noqa: E402

FAULTS = ("memstream", "kafka", "postgres", "valkey", "bad", "worker", "scale", "partitions")
WORKER_PROCESSORS = ["counters", "summarizer"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def start_load(
    up: h.Up,
    ledger: h.Ledger,
    args: argparse.Namespace,
    memory_every: int,
    cap: int | None = None,
) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Start the harness's load against ``up`` (until ``cap`` appends are acknowledged, if
    given); set the event to stop it, await the task."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        h.load(
            lambda: up.url,
            ledger,
            stop,
            threads=args.threads,
            memory_every=memory_every,
            concurrency=args.concurrency,
            max_messages=cap,
        )
    )
    return stop, task


async def loaded(
    up: h.Up,
    ledger: h.Ledger,
    seconds: float,
    args: argparse.Namespace,
    memory_every: int,
    cap: int | None = None,
) -> tuple[int, float]:
    """Load for ``seconds`` (or until ``--messages``); (writes acknowledged, seconds)."""
    before = ledger.appends_ok + ledger.stores_ok
    t0 = time.monotonic()
    stop, task = start_load(up, ledger, args, memory_every, cap)
    with_timeout = asyncio.wait_for(asyncio.shield(task), seconds)
    try:
        await with_timeout
    except TimeoutError:
        stop.set()
        await task
    return ledger.appends_ok + ledger.stores_ok - before, time.monotonic() - t0


class Workers:
    """The soak's ``memstream worker counters summarizer`` processes beside ``up``."""

    def __init__(self, up: h.Up) -> None:
        self.up = up
        self.steady: list[h.Worker] = []
        self.extra: h.Worker | None = None
        self.partitions = 0
        self._n = 0
        self.rnd = random.Random(7)

    def new(self) -> h.Worker:
        self._n += 1
        return h.Worker(self.up, WORKER_PROCESSORS, str(self._n))

    async def start(self, n: int) -> None:
        self.steady = [self.new() for _ in range(n)]
        await asyncio.gather(*(asyncio.to_thread(w.start) for w in self.steady))

    async def crash_one(self) -> str:
        if not self.steady:
            self.steady.append(self.new())
            await asyncio.to_thread(self.steady[-1].start)
        w = self.rnd.choice(self.steady)
        await asyncio.sleep(self.rnd.uniform(0.0, 1.0))  # a random point of its work
        w.kill9()
        await asyncio.to_thread(w.start)
        return f"worker {w.log.name} SIGKILLed and restarted"

    async def scale(self) -> str:
        if self.extra is None:
            self.extra = self.new()
            await asyncio.to_thread(self.extra.start)
            return "one worker joined"
        await asyncio.to_thread(self.extra.stop)
        self.extra = None
        return "one worker left"

    def stop(self) -> None:
        for w in [*self.steady, *([self.extra] if self.extra else [])]:
            w.stop()


async def fault(up: h.Up, name: str, workers: Workers, args: argparse.Namespace) -> None:
    if name == "worker":
        log(await workers.crash_one())
    elif name == "scale":
        log(await workers.scale())
    elif name == "partitions":
        now = len(await h.records_per_partition(up))
        total = min(args.max_partitions, now + args.partition_step)
        if total > now:
            await h.add_partitions(up, total, ("journal", "summaries", "memory"))
            log(f"partitions {now} -> {total}")
        else:
            log(f"partitions already {now} (--max-partitions)")
    elif name == "memstream":
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
    if unknown := [f for f in faults if f not in FAULTS]:
        raise SystemExit(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    converge_s: dict[str, list[float]] = defaultdict(list)
    log(
        f"soak on {data}: {args.messages} messages, {args.threads} threads, "
        f"~{args.memories} memory writes (1 in {memory_every}), faults {faults} "
        f"every {args.fault_every}s"
    )
    await asyncio.to_thread(up.start)
    await h.bind_memory(up.url)
    workers = Workers(up)
    try:
        if args.workers:
            await workers.start(args.workers)
            log(f"{args.workers} worker(s) {' '.join(WORKER_PROCESSORS)} beside up")
        cap = args.messages
        await loaded(up, ledger, args.warmup_s, args, memory_every, cap)  # models load
        n, secs = await loaded(up, ledger, args.baseline_s, args, memory_every, cap)
        base_rate = n / secs
        log(f"fault-free: {n} writes in {secs:.1f}s = {base_rate:.0f}/s")
        await h.converge(up, timeout=args.converge_timeout)

        load_writes, load_secs, i = 0, 0.0, 0
        # until --messages are acknowledged and every fault ran at least once (the load
        # is capped at --messages only once they all did)
        while ledger.appends_ok < args.messages or i < len(faults):
            cap = args.messages if i >= len(faults) else None
            n, secs = await loaded(up, ledger, args.fault_every / 2, args, memory_every, cap)
            load_writes, load_secs = load_writes + n, load_secs + secs
            if ledger.appends_ok >= args.messages and i >= len(faults):
                break
            name = faults[i % len(faults)]
            i += 1
            t_fault = time.monotonic()
            t0 = time.monotonic()
            w0 = ledger.appends_ok + ledger.stores_ok
            stop, task = start_load(up, ledger, args, memory_every, cap)
            await fault(up, name, workers, args)
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
            h.check_summaries(data, ledger, report)
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
        h.check_summaries(data, ledger, report)
    finally:
        workers.stop()
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
    for name in dict.fromkeys(faults):
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
    p.add_argument("--workers", type=int, default=2, help="counters+summarizer workers beside up")
    p.add_argument("--partition-step", type=int, default=4)
    p.add_argument("--max-partitions", type=int, default=32)
    p.add_argument("--baseline-s", type=float, default=60.0)
    p.add_argument("--warmup-s", type=float, default=15.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--search-sample", type=int, default=5_000)
    p.add_argument("--converge-timeout", type=float, default=600.0)
    p.add_argument("--data-dir", default=None)
    raise SystemExit(asyncio.run(main(p.parse_args())))
