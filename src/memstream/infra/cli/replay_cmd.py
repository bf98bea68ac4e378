"""``memstream replay PROJECTION``: rebuild ``messages``, ``memory`` or ``counters``.

Where it runs:

- A running ``memstream up`` (found through ``--data-dir``'s state file, or ``--url``): the
  replay runs inside that process, through ``POST /admin/replay/{projection}`` (chdb and
  qdrant-edge lock their folder to one process); this command draws the progress from the
  NDJSON lines it streams back. Ctrl-C drops the connection, which stops the replay at a
  checkpoint; run the command again to resume.
- ``--local``: in this process, against the configured servers (``MEMSTREAM_CLICKHOUSE_URL``,
  ``MEMSTREAM_QDRANT_URL``, Postgres, Redis, Kafka). Live workers in other processes keep
  their generation until restarted (see docs/operations.md).

Exit status: 0 after the report, 1 if the replay failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import orjson
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from memstream.infra.cli.main import DataDir, api_url_of, app, err, run, settings_for_running
from memstream.infra.settings import Settings
from memstream.projections.replay import PROJECTIONS

__all__ = ["draw", "replay"]


async def _remote(
    base: str, token: str, projection: str, from_journal: bool, restart: bool
) -> AsyncIterator[dict[str, object]]:
    params = {"from_journal": str(from_journal).lower(), "restart": str(restart).lower()}
    async with (
        httpx.AsyncClient(
            base_url=base,
            headers={"x-memstream-admin-token": token},
            timeout=httpx.Timeout(10.0, read=None),  # a replay streams for as long as it runs
        ) as client,
        client.stream("POST", f"/admin/replay/{projection}", params=params) as resp,
    ):
        if resp.status_code != 200:
            body = await resp.aread()
            try:
                e = orjson.loads(body)["error"]
                yield {"type": "error", "code": e.get("code"), "message": e.get("message")}
            except Exception:
                yield {"type": "error", "code": str(resp.status_code), "message": body.decode()}
            return
        async for line in resp.aiter_lines():
            if line.strip():
                yield orjson.loads(line)


async def _local(
    s: Settings, projection: str, from_journal: bool, restart: bool
) -> AsyncIterator[dict[str, object]]:
    from memstream.infra.cli.wiring import Stack

    stack = Stack(s, embedded=False, api=False, pipeline=False, processors=[])
    await stack.start()
    try:
        assert stack.services is not None and stack.services.replays is not None
        if from_journal:  # a Stack without processors opens no journal reader
            from memstream.infra.journal import open_journal_reader

            reader = await open_journal_reader(s)
            stack._stoppers.append(reader.close)
            stack.services.replays.journal = reader
        async for p in stack.services.replays.run(
            projection, from_journal=from_journal, restart=restart
        ):
            yield p.to_dict()
    finally:
        await stack.stop()


async def draw(lines: AsyncIterator[dict[str, object]], console: Console) -> bool:
    """Draw the progress bar from progress lines; print the report. True on success."""
    report: dict[str, object] | None = None
    with Progress(
        TextColumn("[bold]{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as bar:
        task: TaskID | None = None
        async for line in lines:
            typ = line.get("type")
            if typ == "error":
                bar.stop()
                console.print(f"[red]replay failed[/] ({line.get('code')}): {line.get('message')}")
                return False
            total = int(str(line.get("total", 0)))
            done = int(str(line.get("done", 0)))
            rate = f"{float(str(line.get('rate', 0))):,.0f} events/s"
            if task is None:
                task = bar.add_task("replay", total=total, phase=line.get("phase"), rate=rate)
                if line.get("resumed"):
                    console.print("resuming from the last checkpoint")
            bar.update(
                task, total=max(total, done), completed=done, phase=line.get("phase"), rate=rate
            )
            if typ == "report":
                report = line
    if report is None:
        console.print("[red]the replay stopped without a report[/] (run again to resume)")
        return False
    table = Table(title=f"replay {report['projection']}", show_header=False)
    for label, key in (
        ("generation", "generation"),
        ("replaced generation", "previous"),
        ("source", "source"),
        ("events read", "events_read"),
        ("rows written", "rows_written"),
        ("duplicates skipped", "duplicates_skipped"),
        ("undecodable", "undecodable"),
        ("time (s)", "elapsed_s"),
        ("events/s", "rate"),
    ):
        table.add_row(label, str(report.get(key)))
    console.print(table)
    return True


@app.command()
def replay(
    projection: Annotated[str, typer.Argument(help=f"One of: {', '.join(PROJECTIONS)}.")],
    data_dir: DataDir = None,
    from_journal: Annotated[
        bool, typer.Option("--from-journal", help="Re-read the journal instead of the topic.")
    ] = False,
    restart: Annotated[
        bool, typer.Option("--restart", help="Ignore a checkpoint of an interrupted replay.")
    ] = False,
    local: Annotated[
        bool, typer.Option("--local", help="Run here against the configured servers.")
    ] = False,
    url: Annotated[str | None, typer.Option(help="API URL (default: the running `up`).")] = None,
) -> None:
    """Rebuild a projection into a fresh table/collection from its topic (or the journal),
    switch readers over atomically and drop the old one. Resumable: run it again after an
    interruption."""
    if projection not in PROJECTIONS:
        err.print(f"[red]unknown projection {projection!r}[/]: one of {', '.join(PROJECTIONS)}")
        raise typer.Exit(2)
    s = settings_for_running(data_dir)
    if local:
        lines = _local(s, projection, from_journal, restart)
    else:
        base = api_url_of(s, url)
        token = s.admin_token.get_secret_value()
        if not token:
            err.print("[red]no admin token[/]: set MEMSTREAM_ADMIN_TOKEN or pass --data-dir")
            raise typer.Exit(2)
        lines = _remote(base, token, projection, from_journal, restart)
    ok = False
    with contextlib.suppress(KeyboardInterrupt):
        ok = bool(run(draw(lines, err)))
    if not ok:
        raise typer.Exit(1)
