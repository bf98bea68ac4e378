"""A worker thread beside a busy event loop: how long the lexical index's upsert of a small
batch takes, at several GIL switch intervals and loop step lengths.

Run: ``python bench/gil_starvation.py [--rows 50] [--intervals 5 1 0.5 0.2 0.1]
[--steps 0.1 0.3 1 3] [--timeout 10]`` (milliseconds).

The event loop (uvloop, as ``memstream up`` runs) is kept busy by a task that runs Python
for ``step`` ms, then yields (``await asyncio.sleep(0)``: one loop iteration, whose poll
releases the GIL and takes it back at once), as a loop saturated with requests does. Beside
it the index's writer thread adds ``--rows`` messages (one GIL-releasing Tantivy call per
message, then the commit) and the loop awaits it. CPython's GIL: a thread waiting for it
asks the holder to hand it over only when a whole switch interval passed *without any other
hand-over*; a loop that releases and retakes the GIL more often than that (every poll)
never has to hand it over, and the waiting thread starves. Each cell is the upsert's time,
three times (capped at ``--timeout`` s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from memstream.projections.messages.lexical_index import IndexRow, LexicalIndex

_WORDS = [
    "we",
    "should",
    "plan",
    "the",
    "deployment",
    "for",
    "thursday",
    "after",
    "the",
    "database",
    "migration",
    "my",
    "dog",
    "has",
    "been",
    "sick",
    "all",
    "week",
    "the",
    "vet",
    "says",
    "it",
    "is",
    "nothing",
    "serious",
    "can",
    "you",
    "remind",
    "me",
    "what",
    "we",
    "decided",
    "about",
    "the",
    "budget",
    "for",
    "the",
    "offsite",
    "I",
    "started",
    "learning",
    "the",
    "piano",
    "again",
]


def _text(n: int) -> str:
    """A conversational turn of ~30 words (message ``n``'s own)."""
    return " ".join(_WORDS[(n * 7 + k * 3) % len(_WORDS)] for k in range(30)) + f" n{n}"


async def busy(stop: asyncio.Event, step_s: float) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        while time.perf_counter() - t < step_s:
            pass
        await asyncio.sleep(0)


async def upsert_times(
    index: LexicalIndex, rows: int, step_s: float | None, timeout_s: float, first: int
) -> list[float]:
    """Three upserts' times beside a loop busy for ``step_s`` at a time (None: idle)."""
    out = []
    for r in range(3):
        batch = [
            IndexRow("a", "g", f"t{i % 10}", first + r * rows + i, i, _text(first + r * rows + i))
            for i in range(rows)
        ]
        stop = asyncio.Event()
        loop_task = asyncio.create_task(busy(stop, step_s) if step_s is not None else stop.wait())
        await asyncio.sleep(0.02)
        t = time.perf_counter()
        job = asyncio.ensure_future(index.upsert(batch))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(job), timeout_s)
        out.append(time.perf_counter() - t)
        stop.set()
        await loop_task
        await job  # finished with the loop idle, before the next cell
    return out


async def main(args: argparse.Namespace) -> None:
    index = LexicalIndex(Path(tempfile.mkdtemp(prefix="memstream-gil-")) / "ix")

    async def nothing():  # type: ignore[no-untyped-def]
        return
        yield

    await index.fill(nothing)
    print(
        f"upsert of {args.rows} messages beside a busy loop (ms, 3 tries; "
        f"{args.timeout:.0f} s = gave up waiting)"
    )
    idle = statistics.median(await upsert_times(index, args.rows, None, args.timeout, 0))
    print(f"idle loop (Python's interval): {idle * 1e3:.0f} ms")
    print(
        f"{'switch interval':>16} "
        + " ".join(f"{f'step {s} ms':>22}" for s in args.steps)
        + f" {'median / idle':>14}"
    )
    first = 3 * args.rows
    for interval in args.intervals:
        sys.setswitchinterval(interval / 1e3)
        cells, all_xs = [], []
        for step in args.steps:
            xs = await upsert_times(index, args.rows, step / 1e3, args.timeout, first)
            first += 3 * args.rows
            all_xs += xs
            cells.append(" / ".join(f"{x * 1e3:.0f}" for x in xs))
        ratio = statistics.median(all_xs) / idle
        print(f"{f'{interval} ms':>16} " + " ".join(f"{c:>22}" for c in cells) + f" {ratio:13.1f}x")
    await index.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rows", type=int, default=50)
    ap.add_argument("--intervals", type=float, nargs="+", default=[5, 1, 0.5, 0.2, 0.1])
    ap.add_argument("--steps", type=float, nargs="+", default=[0.1, 0.3, 1, 3])
    ap.add_argument("--timeout", type=float, default=10.0)
    uvloop.run(main(ap.parse_args()))
