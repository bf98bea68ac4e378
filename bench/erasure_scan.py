"""The journal step of an erasure: finding the blocks of the erased threads in the log.

Run: ``python bench/erasure_scan.py [--threads 1000] [--messages 100] [--erase 5]``.

A real SlateDB journal on a local folder holds ``--threads`` threads of ``--messages``
messages (appends of 10 messages, round-robin over the threads, ``--concurrency`` in flight so
group commits mix threads in a block as a busy deployment does). The scan that erasure runs over the sequence log
(``infra/journal/erase.py``) is timed for ``--erase`` threads, read-only (nothing is
written, so both variants see the same log), in the same process, alternating:

- ``decode every block``: what erasure did first (each envelope of each block parsed);
- ``filter, then decode``: the whole log read, a block parsed only if its raw bytes name an
  erased thread (what erasure did before the blocks were located);
- ``located``: the threads' message records (which carry their seq) and event-index keys
  read, then only the blocks holding those seqs (what erasure does now).

It prints the times, the ratios, and checks all three found the same envelopes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from memstream.infra.journal import Journal, keys, local_store
from memstream.infra.journal.erase import (
    _blocks_holding,
    _locate,
    _scan,
    redact_block,
    thread_filter,
)
from memstream.schemas.records import NewMessage, ThreadRef


async def scan(journal: Journal, erased: set[tuple[str, str, str]], how: str) -> int:
    db = journal._db  # noqa: SLF001 - a bench of the step
    candidates = thread_filter(erased) if how != "decode every block" else None
    if how == "located":
        refs = [ThreadRef(*t) for t in sorted(erased)]
        # always located, whatever the share
        located = await _locate(db, refs, most=2**62, below=journal._events_indexed_from or 1)
        assert not located.unknown and not located.too_many
        blocks = _blocks_holding(db, located.seqs, below=journal._events_indexed_from or 1)
    else:
        blocks = _scan(db, keys.SEQUENCE)
    hits = 0
    async for kv in blocks:
        out = redact_block(kv.value, erased, candidates)
        if out is not None:
            hits += out[1]
    return hits


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="erasescan-") as tmp:
        journal = await Journal.open(local_store(Path(tmp)), "journal")
        try:
            refs = [ThreadRef("acme", "bot", f"thread-{i}") for i in range(args.threads)]
            body = "lorem ipsum dolor sit amet " * 6
            for round_ in range(args.messages // 10):
                for i in range(0, len(refs), args.concurrency):
                    await asyncio.gather(
                        *(
                            journal.append(
                                ref, [NewMessage(role="user", content=f"{body} {round_}")] * 10
                            )
                            for ref in refs[i : i + args.concurrency]
                        )
                    )
            total = await journal.last_seq()
            erased = {(r.account_id, r.agent_id, r.thread_id) for r in refs[: args.erase]}
            print(f"journal: {total} envelopes, {args.threads} threads; erasing {args.erase}")
            ways = ["decode every block", "filter, then decode", "located"]
            times: dict[str, list[float]] = {w: [] for w in ways}
            found: dict[str, int] = {}
            for r in range(args.rounds):
                for how in ways[r % 3 :] + ways[: r % 3]:  # rotating order
                    t0 = time.perf_counter()
                    found[how] = await scan(journal, erased, how)
                    times[how].append(time.perf_counter() - t0)
            assert len(set(found.values())) == 1, found
            assert found["located"] >= args.erase * args.messages, found
            base = statistics.median(times[ways[0]])
            for how in ways:
                took = statistics.median(times[how])
                print(f"{how:20s} {took:8.4f} s (median of {args.rounds}) {base / took:8.1f}x")
            filtered = statistics.median(times[ways[1]])
            located = statistics.median(times["located"])
            print(f"located / filter, then decode: {filtered / located:.1f}x faster")
            print(f"envelopes found (all three): {found['located']}")
        finally:
            await journal.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1000)
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--erase", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8, help="appends in flight (block size)")
    asyncio.run(main(ap.parse_args()))
