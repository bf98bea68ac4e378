"""The I/O half of ``memstream produce``: read the file, send batches, draw progress."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from memstream.errors import MemstreamError
from memstream.infra.cli.produce import Batch, LineError, batches, parse_lines, send


async def produce_file(
    file: str, base_url: str, admin_token: str, concurrency: int, err: Console
) -> bool:
    """Returns True when every line was appended."""
    if file == "-":
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = Path(file).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            err.print(f"[red]cannot read {file}:[/] {e}")
            return False
    errors: list[LineError] = []
    good: list[tuple[int, dict[str, object]]] = []
    for n, item in parse_lines(lines):
        if isinstance(item, LineError):
            errors.append(item)
        else:
            good.append((n, item))
    # Per-thread order must hold: one queue per thread key, threads sent concurrently.
    by_thread: dict[tuple[str, str, str], list[Batch]] = {}
    for b in batches(good):
        by_thread.setdefault((b.account_id, b.agent_id, b.thread_id), []).append(b)
    total = len(good)
    async with httpx.AsyncClient(
        base_url=base_url, headers={"x-memstream-admin-token": admin_token}, timeout=60
    ) as client:
        with Progress(
            TextColumn("appending"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeRemainingColumn(),
            console=err,
            transient=False,
        ) as progress:
            task = progress.add_task("produce", total=total, rate="")
            sem = asyncio.Semaphore(concurrency)
            loop = asyncio.get_running_loop()
            started = loop.time()

            async def thread_worker(queue: list[Batch]) -> None:
                for i, b in enumerate(queue):
                    async with sem:
                        try:
                            await send(client, b)
                        except (MemstreamError, httpx.HTTPError) as e:
                            msg = e.message if isinstance(e, MemstreamError) else str(e)
                            field = e.field if isinstance(e, MemstreamError) else None
                            # later batches of this thread are skipped: sending them would
                            # reorder the thread around the failed lines
                            for later in queue[i:]:
                                errors.extend(LineError(n, field, msg) for n in later.lines)
                                progress.advance(task, len(later.lines))
                            return
                    progress.advance(task, len(b.lines))
                    done = progress.tasks[0].completed
                    progress.update(
                        task, rate=f"{done / max(loop.time() - started, 1e-6):,.0f} msg/s"
                    )

            await asyncio.gather(*(thread_worker(q) for q in by_thread.values()))
    errors.sort(key=lambda e: e.line)
    for le in errors:
        where = f" ({le.field})" if le.field else ""
        err.print(f"line {le.line}{where}: {le.message}")
    good_lines = {n for n, _ in good}
    appended = total - sum(1 for le in errors if le.line in good_lines)
    err.print(f"{appended} appended, {len(errors)} failed")
    return not errors
