"""The journal step of an erasure: the sequence-log scan, with and without the block filter.

Run: ``python bench/erasure_scan.py [--threads 1000] [--messages 100] [--erase 5]``.

A real SlateDB journal on a local folder holds ``--threads`` threads of ``--messages``
messages (appends of 10 messages, round-robin over the threads, ``--concurrency`` in flight so
group commits mix threads in a block as a busy deployment does). The scan that erasure runs over the sequence log
(``infra/journal/erase.py``) is timed for ``--erase`` threads, read-only (nothing is
written, so both variants see the same log), in the same process, alternating:

- ``decode every block``: what erasure did before (each envelope of each block parsed);
- ``filter, then decode``: a block is parsed only if its raw bytes name an erased thread.

It prints both times, the ratio, and checks both found the same envelopes.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from memstream.infra.journal import Journal, keys, local_store
from memstream.infra.journal.erase import _scan, redact_block, thread_filter
from memstream.schemas.records import NewMessage, ThreadRef


async def scan(journal: Journal, erased: set[tuple[str, str, str]], filtered: bool) -> int:
    candidates = thread_filter(erased) if filtered else None
    hits = 0
    async for kv in _scan(journal._db, keys.SEQUENCE):  # noqa: SLF001 - a bench of the step
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
            times: dict[bool, list[float]] = {False: [], True: []}
            found: dict[bool, int] = {}
            for r in range(args.rounds):
                for filtered in (False, True) if r % 2 == 0 else (True, False):
                    t0 = time.perf_counter()
                    found[filtered] = await scan(journal, erased, filtered)
                    times[filtered].append(time.perf_counter() - t0)
            assert found[True] == found[False] >= args.erase * args.messages, found
            slow, fast = statistics.median(times[False]), statistics.median(times[True])
            print(f"decode every block: {slow:.2f} s (median of {args.rounds})")
            print(f"filter, then decode: {fast:.2f} s -> {slow / fast:.2f}x faster")
            print(f"envelopes found (both): {found[True]}")
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
